"""Engines, sessions and migrations for the one database (SQLite by default, Postgres for many processes).

SQLite is set up for several threads and processes writing at once: WAL (readers never block the
writer), a busy timeout (writers queue instead of failing), foreign keys on. Write sessions start
with BEGIN IMMEDIATE: a deferred transaction that reads and then writes can fail with "database is
locked" when another writer committed in between (WAL cannot upgrade a stale snapshot), and budget
admission needs the read-check-write to be serialised anyway. On Postgres the same code paths lock
the rows they check with SELECT ... FOR UPDATE.

SQLite's locks are POSIX advisory locks, which a process loses on a file when it closes *any* descriptor of
it: so nothing in a process that uses the database may open() its files outside SQLite (`is_platform_db`), or
another process closing its last connection believes it is the only one and deletes the live WAL. A database
that fails `PRAGMA quick_check` is refused at start (`DatabaseCorrupt`), never served with a 500 per call.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, event, or_, select
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from mainspring.config import Settings, get_settings

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

_engines: dict[str, Engine] = {}
_checked: set[Engine] = set()  # databases `check_database` passed, once per process
_lock = threading.Lock()


def default_url(settings: Settings | None = None) -> str:
    return (settings or get_settings()).resolved_database_url()


def _sqlite_setup(engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        # Take transaction control away from pysqlite (it would BEGIN lazily, DEFERRED, and not
        # around DDL); SQLAlchemy's "begin" event below emits the BEGIN we choose.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
        cur.execute("PRAGMA foreign_keys = ON")
        # Only a database not yet in WAL mode is switched (once, by its first opener): asking again is harmless
        # but a process beside a live server never touches the mode. ("memory" for :memory: databases.)
        if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() not in ("wal", "memory"):
            cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")  # durable in WAL mode except on power loss
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "IMMEDIATE")
        conn.exec_driver_sql(f"BEGIN {mode}")


def make_engine(url: str, busy_timeout_s: float | None = None) -> Engine:
    """A new engine for `url` (prefer `get_engine`, which shares one per URL); SQLite writers wait up to
    `busy_timeout_s` (default: Settings.db_busy_timeout_s) for another's lock."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        db = u.database
        if db and db != ":memory:" and not db.startswith("file:"):
            Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
        timeout_s = busy_timeout_s if busy_timeout_s is not None else get_settings().db_busy_timeout_s
        # timeout: seconds pysqlite waits on a lock while connecting (busy_timeout covers the rest)
        engine = create_engine(url, connect_args={"timeout": timeout_s, "check_same_thread": False})
        _sqlite_setup(engine, int(timeout_s * 1000))
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
        _checked.clear()


def is_sqlite(engine: Engine | Connection) -> bool:
    return engine.dialect.name == "sqlite"


# ---- faults: a busy database, a corrupt one, the platform's own files ---------------------------------
_BUSY_CODES = {getattr(sqlite3, "SQLITE_BUSY", 5), getattr(sqlite3, "SQLITE_LOCKED", 6)}
_CORRUPT_CODES = {getattr(sqlite3, "SQLITE_CORRUPT", 11), getattr(sqlite3, "SQLITE_NOTADB", 26)}


def is_busy_error(exc: BaseException) -> bool:
    """True for "another process holds the lock, try later": SQLite's busy/locked (after the busy timeout), and
    Postgres' lock and statement timeouts."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _BUSY_CODES
    sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if sqlstate in ("55P03", "57014", "40P01"):  # lock_not_available, query_canceled (timeout), deadlock
        return True
    text = str(orig).lower()
    return "database is locked" in text or "database table is locked" in text or "database is busy" in text


class DatabaseCorrupt(Exception):
    """The database file fails SQLite's integrity check (or is not a database at all); the message says what
    to do. Raised by `init_db`, so the server and every CLI command that opens the database refuse it."""


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (None for Postgres and in-memory databases)."""
    u = make_url(url)
    db = u.database if u.get_backend_name() == "sqlite" else None
    if not db or db == ":memory:" or "mode=memory" in db:
        return None
    if db.startswith("file:"):
        from urllib.parse import unquote, urlsplit

        db = unquote(urlsplit(db).path)
    return Path(db).expanduser()


def check_database(engine: Engine) -> None:
    """`PRAGMA quick_check` on a SQLite database (a few seconds per GB), once per process; DatabaseCorrupt if it
    fails."""
    path = sqlite_file(engine.url.render_as_string(hide_password=False)) if is_sqlite(engine) else None
    if path is None or not path.exists() or engine in _checked:
        return
    try:
        with engine.connect() as conn:
            problems = [r[0] for r in conn.exec_driver_sql("PRAGMA quick_check(3)")]
    except DBAPIError as exc:
        code = getattr(exc.orig, "sqlite_errorcode", None)
        if code is None or (code & 0xFF) not in _CORRUPT_CODES:
            raise
        problems = [str(exc.orig)]
    if problems != ["ok"]:
        detail = "; ".join(" ".join(p.replace("*** in database main ***", "").split()) for p in problems)
        raise DatabaseCorrupt(
            f"the database {path} is corrupt ({detail[:300]}). Mainspring will not serve it: restore "
            f"it from a backup, or move it and its -wal/-shm files aside (e.g. `mv {path} {path}.corrupt`) to "
            "start with an empty one. Until then `mainspring up`/`serve` and the commands that open the database "
            "(keys, usage, runs, audit) refuse to start.")
    _checked.add(engine)


def platform_db_files(settings: Settings | None = None) -> list[Path]:
    """The files of the platform database (Settings') and of every SQLite database this process has an engine
    on, each with SQLite's companions (-wal, -shm, -journal)."""
    with _lock:
        urls = [e.url.render_as_string(hide_password=False) for e in _engines.values() if is_sqlite(e)]
    found = (sqlite_file(u) for u in [(settings or get_settings()).resolved_database_url(), *urls])
    paths = {p for p in found if p is not None}
    return [p.with_name(p.name + suffix) for p in paths for suffix in ("", "-wal", "-shm", "-journal")]


def is_platform_db(path: str | os.PathLike, settings: Settings | None = None) -> bool:
    """Whether `path` is (a link to, or another name of) one of the platform database's files. Found with
    realpath and stat only: opening and closing such a file would drop this process's SQLite locks on it."""
    files = platform_db_files(settings)
    if not files:
        return False
    if os.path.realpath(path) in {os.path.realpath(f) for f in files}:
        return True
    try:
        target = os.stat(path)
    except (OSError, ValueError):
        return False
    if target.st_nlink < 2:  # no other name
        return False
    for f in files:
        try:
            info = os.stat(f)
        except OSError:
            continue
        if (info.st_dev, info.st_ino) == (target.st_dev, target.st_ino):  # a hard link
            return True
    return False


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


_MIGRATION_LOCK = 0x6D61696E  # the Postgres advisory lock key `init_db` migrates under ("main")


def init_db(url: str | None = None) -> Engine:
    """Bring the database at `url` (default: Settings') to the newest schema; safe to call every start."""
    from alembic import command

    engine = get_engine(url)
    check_database(engine)
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # several servers and workers starting at once on one empty database would each create the tables
            # (and all but one fail): the first migrates, the others wait here, then find the head. SQLite's
            # BEGIN IMMEDIATE serialises them the same way. The lock ends with the transaction.
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")
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
        url = get_settings().resolved_database_url()
        init_db(url)
    except ValidationError as exc:
        fail(f"bad setting: {exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']}")
    except DatabaseCorrupt as exc:
        fail(str(exc))
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
