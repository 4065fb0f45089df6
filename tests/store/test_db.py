"""store/: engines, sessions, SQLite setup and Alembic migrations shipped in the package."""

from datetime import datetime, timezone

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, select

from mainspring.config import Settings
from mainspring.store.db import alembic_config, current_revision, dispose_engines, get_engine, init_db, session
from mainspring.schema import metadata
from mainspring.store.tables import Project

TABLES = {"projects", "api_keys", "price_sheets", "ledger_entries", "budgets", "reservations", "files", "batches",
          "agents", "threads", "runs", "steps", "tool_calls", "interrupts", "events", "artifacts", "audit_log",
          "responses", "plans", "plan_tasks", "plan_events", "leader_leases", "schedules", "schedule_fires",
          "plan_messages", "plan_waits", "deadlocks", "scene_threads"}


def _head(url: str) -> str | None:
    """The newest migration shipped (several engineers add migrations: the check is "upgraded to the head")."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config(url)).get_current_head()


@pytest.fixture
def url(blank_database_url):
    """An empty database, SQLite or Postgres: the migrations run from nothing."""
    return blank_database_url


def test_migrations_run_from_empty_and_are_idempotent(url, tmp_path):
    assert not (tmp_path / "mainspring.db").exists()
    assert not inspect(get_engine(url)).get_table_names()
    engine = init_db(url)
    assert TABLES <= set(inspect(engine).get_table_names())
    assert current_revision(url) == _head(url)
    with session(url) as s:
        s.add(Project(name="acme"))
    init_db(url)  # a second start: nothing to do, nothing lost
    init_db(url)
    assert current_revision(url) == _head(url)
    with session(url, readonly=True) as s:
        assert s.scalars(select(Project.name)).all() == ["acme"]


def test_processes_starting_at_once_migrate_once(url):
    """Servers and workers starting together on one empty database: one migrates, the others find the head."""
    import threading

    start, errors = threading.Barrier(4), []

    def start_up() -> None:
        start.wait()
        try:
            init_db(url)
        except Exception as exc:  # a duplicate CREATE TABLE, a lock error: the start would have failed
            errors.append(exc)

    threads = [threading.Thread(target=start_up) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:2]
    assert current_revision(url) == _head(url)


def test_models_and_migrations_agree(url):
    engine = init_db(url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata)
    assert diff == []


def test_downgrade_to_empty_and_back(url):
    engine = init_db(url)
    cfg = alembic_config(url)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "base")
    assert not TABLES & set(inspect(engine).get_table_names())
    init_db(url)
    assert TABLES <= set(inspect(engine).get_table_names())


def test_sqlite_is_wal_with_busy_timeout_and_foreign_keys(sqlite_database_url):
    """SQLite only: the pragmas store/db.py sets on every connection (Postgres enforces foreign keys itself)."""
    url = sqlite_database_url
    engine = init_db(url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 5000
    from sqlalchemy.exc import IntegrityError

    from mainspring.store.tables import ApiKey

    with pytest.raises(IntegrityError):  # foreign keys are enforced
        with session(url) as s:
            s.add(ApiKey(id="key_x", project_id=999, prefix="p", hashed_secret="h"))


def test_session_commits_or_rolls_back(url):
    init_db(url)
    with pytest.raises(RuntimeError):
        with session(url) as s:
            s.add(Project(name="lost"))
            s.flush()
            raise RuntimeError("boom")
    with session(url) as s:
        s.add(Project(name="kept"))
    with session(url, readonly=True) as s:
        assert s.scalars(select(Project.name)).all() == ["kept"]
        created = s.scalars(select(Project.created_at)).one()
    assert created.tzinfo is timezone.utc  # stored naive UTC, handed back aware


def test_naive_datetimes_are_refused(url):
    init_db(url)
    with pytest.raises(Exception, match="naive datetime"):
        with session(url) as s:
            s.add(Project(name="p", created_at=datetime(2025, 1, 1)))


def test_default_url_comes_from_settings(monkeypatch, tmp_path):
    monkeypatch.delenv("MAINSPRING_DATABASE_URL", raising=False)
    monkeypatch.setenv("MAINSPRING_DATA_DIR", str(tmp_path / "data"))
    assert Settings().resolved_database_url() == f"sqlite:///{tmp_path / 'data' / 'mainspring.db'}"
    monkeypatch.setenv("MAINSPRING_DATABASE_URL", f"sqlite:///{tmp_path / 'other.db'}")
    s = Settings()
    assert s.resolved_database_url().endswith("other.db")
    assert s.require_auth is False and s.rpm_limit == 0 and s.tpm_limit == 0 and s.prices_file == ""
    # get_engine() with no URL uses Settings; the data dir is created on demand
    monkeypatch.delenv("MAINSPRING_DATABASE_URL")
    try:
        init_db()
        assert (tmp_path / "data" / "mainspring.db").exists()
        assert get_engine() is get_engine(f"sqlite:///{tmp_path / 'data' / 'mainspring.db'}")
    finally:
        dispose_engines()
