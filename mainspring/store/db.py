"""Engines, sessions and migrations for the one database (SQLite by default, Postgres for many processes).

SQLite is set up for several threads and processes writing at once: WAL (readers never block the
writer), a busy timeout (writers queue instead of failing), foreign keys on. Write sessions start
with BEGIN IMMEDIATE: a deferred transaction that reads and then writes can fail with "database is
locked" when another writer committed in between (WAL cannot upgrade a stale snapshot), and budget
admission needs the read-check-write to be serialised anyway. On Postgres the same code paths lock
the rows they check with SELECT ... FOR UPDATE.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, event, or_, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

from mainspring.config import Settings

BUSY_TIMEOUT_MS = 30_000
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def default_url(settings: Settings | None = None) -> str:
    return (settings or Settings()).resolved_database_url()


def _sqlite_setup(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        # Take transaction control away from pysqlite (it would BEGIN lazily, DEFERRED, and not
        # around DDL); SQLAlchemy's "begin" event below emits the BEGIN we choose.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.execute("PRAGMA journal_mode = WAL")  # no-op (stays "memory") for :memory: databases
        cur.execute("PRAGMA synchronous = NORMAL")  # durable in WAL mode except on power loss
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "IMMEDIATE")
        conn.exec_driver_sql(f"BEGIN {mode}")


def make_engine(url: str) -> Engine:
    """A new engine for `url` (prefer `get_engine`, which shares one per URL)."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        db = u.database
        if db and db != ":memory:" and not db.startswith("file:"):
            Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
        # timeout: seconds pysqlite waits on a lock while connecting (busy_timeout covers the rest)
        engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False})
        _sqlite_setup(engine)
        return engine
    return create_engine(url, pool_pre_ping=True)


def get_engine(url: str | None = None) -> Engine:
    """The shared engine for `url` (default: Settings' database), created on first use."""
    url = url or default_url()
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _engines[url] = make_engine(url)
        return engine


def dispose_engines() -> None:
    """Close every pooled connection (tests, and before fork)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()
        _factories.clear()


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


_factories: dict[tuple[Engine, bool], sessionmaker] = {}


def factory_for(engine: Engine, readonly: bool) -> sessionmaker:
    """One sessionmaker per engine and mode: building `execution_options` engines per session copies event
    listeners and cost milliseconds a transaction."""
    key = (engine, readonly)
    factory = _factories.get(key)
    if factory is None:
        bind = engine
        if is_sqlite(engine):
            bind = engine.execution_options(sqlite_begin="DEFERRED" if readonly else "IMMEDIATE")
        factory = _factories[key] = sessionmaker(bind=bind, expire_on_commit=False)
    return factory


@contextmanager
def session(bind: Engine | str | None = None, *, readonly: bool = False) -> Iterator[Session]:
    """A unit of work: commits when the block ends, rolls back on an exception.

    Default is a write session (BEGIN IMMEDIATE on SQLite: one writer at a time, waiting up to
    the busy timeout). `readonly=True` begins DEFERRED so readers run alongside writers in WAL mode.
    Objects stay readable after the block (expire_on_commit=False).
    """
    engine = bind if isinstance(bind, Engine) else get_engine(bind)
    with factory_for(engine, readonly)() as s:
        with s.begin():
            yield s


def alembic_config(url: str):
    """Alembic's Config built in code: migrations ship inside the package, no alembic.ini."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))  # ConfigParser interpolation
    return cfg


def init_db(url: str | None = None) -> Engine:
    """Bring the database at `url` (default: Settings') to the newest schema; safe to call every start."""
    from alembic import command

    engine = get_engine(url)
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    return engine


def current_revision(bind: Engine | str | None = None) -> str | None:
    from alembic.runtime.migration import MigrationContext

    engine = bind if isinstance(bind, Engine) else get_engine(bind)
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def cli_session(fail, *, readonly: bool = False):
    """A session on Settings' database for a CLI command, migrating it first (cheap when current). A bad
    setting or an unopenable database goes to `fail(message)`, which prints and exits: never a traceback."""
    from pydantic import ValidationError
    from sqlalchemy.exc import SQLAlchemyError

    try:
        url = Settings().resolved_database_url()
        init_db(url)
    except ValidationError as exc:
        fail(f"bad setting: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}")
    except (SQLAlchemyError, OSError) as exc:
        fail(f"cannot open the database: {exc}")
    return session(url, readonly=readonly)


def newest_first_page(s: Session, row_cls, where, after_row, limit: int) -> tuple[list, bool]:
    """One page of `row_cls` rows matching `where`, newest first, starting after `after_row` (the
    previous page's last row, or None): OpenAI's `after`/`limit` lists. Returns (rows, has_more)."""
    q = select(row_cls).where(where)
    if after_row is not None:
        q = q.where(or_(row_cls.created_at < after_row.created_at,
                        (row_cls.created_at == after_row.created_at) & (row_cls.id < after_row.id)))
    rows = list(s.scalars(q.order_by(row_cls.created_at.desc(), row_cls.id.desc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit
