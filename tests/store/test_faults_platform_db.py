"""Nothing in a process using the database opens its files outside SQLite, so another process's CLI command
never deletes the live WAL (closing any descriptor of a file drops all of a process's POSIX locks on it).

SQLite only, by nature: WAL files and POSIX locks are SQLite's (tests/databases.py runs the rest on Postgres too)."""

import os
import sqlite3
import subprocess
import sys

import pytest

from mainspring.agents.tools.base import ToolContext
from mainspring.agents.tools.doc_index import read_documents
from mainspring.agents.tools.sql import sql_tool
from mainspring.billing.keys import create_key, list_keys, revoke_key
from mainspring.config import Settings
from mainspring.store.db import dispose_engines, init_db, is_platform_db, session
from tests.agents.tools.conftest import call


@pytest.fixture
def platform(tmp_path):
    data = tmp_path / "data"
    settings = Settings(data_dir=data)
    engine = init_db(settings.resolved_database_url())  # this process stands in for the live server
    yield settings, data / "mainspring.db", engine
    dispose_engines()


def test_is_platform_db_knows_every_name_of_the_database_files(platform, tmp_path):
    settings, db, _ = platform
    for name in ("mainspring.db", "mainspring.db-wal", "mainspring.db-shm", "mainspring.db-journal"):
        assert is_platform_db(db.parent / name, settings)
    (tmp_path / "link.db").symlink_to(db)
    os.link(db, tmp_path / "hard.db")
    assert is_platform_db(tmp_path / "link.db", settings) and is_platform_db(tmp_path / "hard.db", settings)
    assert is_platform_db(str(db.parent / "." / "mainspring.db"), settings)
    other = tmp_path / "other.db"
    sqlite3.connect(other).close()
    assert not is_platform_db(other, settings) and not is_platform_db(tmp_path / "missing.db", settings)
    elsewhere = Settings(database_url="postgresql+psycopg://h/db")
    assert is_platform_db(db, elsewhere)  # this process has an engine on it: its locks are at stake all the same
    dispose_engines()
    assert not is_platform_db(db, elsewhere)


def test_the_sql_tool_refuses_the_platform_database_by_any_name(platform, tmp_path):
    settings, db, _ = platform
    (tmp_path / "link.db").symlink_to(db)
    os.link(db, tmp_path / "hard.sqlite")
    sql = sql_tool(settings)
    for path in (db, tmp_path / "link.db", tmp_path / "hard.sqlite", db.parent / "mainspring.db-wal"):
        ctx = ToolContext("run", "call", "key", workspace=tmp_path, attachments={"db": str(path)})
        result = call(sql, {"query": "SELECT id, key_hash FROM api_keys"}, ctx)
        assert result.is_error and "platform's own database" in result.content, path


def test_search_skips_the_platform_database_in_an_attached_folder(platform):
    settings, db, _ = platform
    (db.parent / "notes.txt").write_text("hello")
    found, skipped = read_documents(db.parent)
    assert "notes.txt" in found and "mainspring.db" not in found
    assert "mainspring.db (the platform's own database)" in skipped


def keys_cli(db, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MAINSPRING_DATABASE_URL": f"sqlite:///{db}", "MAINSPRING_DATA_DIR": str(db.parent)}
    done = subprocess.run([sys.executable, "-m", "mainspring", "keys", *args], env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return done


def test_a_cli_command_beside_a_live_process_keeps_its_wal_and_its_writes(platform, tmp_path):
    settings, db, engine = platform
    with session(engine) as s:
        revoked = create_key(s, "acme").key.id
    other = tmp_path / "shop.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (n)")
    conn.commit()
    conn.close()
    sql = sql_tool(settings)
    for path in (db, other):  # the run's tool calls, in this (the server's) process
        call(sql, {"query": "SELECT name FROM sqlite_master"},
             ToolContext("run", "call", "key", workspace=tmp_path, attachments={"db": str(path)}))
    read_documents(db.parent)
    keys_cli(db, "create", "--project", "other")  # a second process opens and closes the database
    wal, shm = db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")
    assert wal.exists() and shm.exists()
    with engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    with session(engine) as s:  # written after the CLI left: another process must see it
        revoke_key(s, revoked)
    listed = keys_cli(db, "list").stdout
    assert next(line for line in listed.splitlines() if line.startswith(revoked)).endswith("revoked")
    dispose_engines()  # a restart keeps it too
    with session(settings.resolved_database_url(), readonly=True) as s:
        states = {k.id: k.revoked_at is not None for k, _ in list_keys(s)}
    assert states[revoked] is True and len(states) == 2
