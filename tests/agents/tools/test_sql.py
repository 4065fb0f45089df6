import hashlib
import os
import sqlite3
import threading

import pytest

from mainspring.agents.tools.base import ToolContext
from mainspring.agents.tools.sql import sql_tool

from .conftest import call

sql = sql_tool()


@pytest.fixture()
def db(tmp_path):
    path = tmp_path / "shop.db"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT, photo BLOB);
        INSERT INTO customers VALUES (1, 'Ada', 'London', x'00ff'), (2, 'Grace', 'New York', NULL),
                                     (3, 'Edsger', 'Nuenen', NULL);
        CREATE TABLE numbers (n INTEGER);
        WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < 500)
        INSERT INTO numbers SELECT n FROM seq;
    """)
    conn.commit()
    conn.close()
    return path


def db_ctx(workspace, path) -> ToolContext:
    return ToolContext("run", "call", "key", workspace=workspace, attachments={"db": str(path)})


def fingerprint(path):
    return hashlib.sha256(path.read_bytes()).hexdigest(), os.stat(path).st_mtime_ns, sorted(os.listdir(path.parent))


def test_select_returns_a_text_table_and_rows(db, workspace):
    result = call(sql, {"query": "SELECT id, name, photo FROM customers ORDER BY id"}, db_ctx(workspace, db))
    assert not result.is_error
    assert result.content == ("id | name | photo\n--- | ---- | -----\n1 | Ada | <blob 2 bytes>\n2 | Grace | NULL\n"
                              "3 | Edsger | NULL\n(3 rows)")
    assert result.data == {"columns": ["id", "name", "photo"], "truncated": False,
                           "rows": [[1, "Ada", "<blob 2 bytes>"], [2, "Grace", None], [3, "Edsger", None]]}


def test_rows_are_capped_with_a_note(db, workspace):
    result = call(sql, {"query": "SELECT n FROM numbers"}, db_ctx(workspace, db))
    assert len(result.data["rows"]) == 200 and result.data["truncated"]
    assert result.content.splitlines()[-1].startswith("[200 rows shown; the query returned more, cut at max_rows=200")
    small = call(sql, {"query": "SELECT n FROM numbers", "max_rows": 3}, db_ctx(workspace, db))
    assert small.data["rows"] == [[1], [2], [3]] and small.data["truncated"]
    exact = call(sql, {"query": "SELECT n FROM numbers LIMIT 3", "max_rows": 3}, db_ctx(workspace, db))
    assert not exact.data["truncated"] and exact.content.endswith("(3 rows)")


@pytest.mark.parametrize("query", [
    "INSERT INTO customers (name) VALUES ('Mallory')",
    "UPDATE customers SET city = 'Nowhere'",
    "DELETE FROM customers",
    "DROP TABLE customers",
    "CREATE TABLE evil (x)",
    "ATTACH DATABASE '{dir}/evil.db' AS evil",
    "PRAGMA query_only = 0",
    "PRAGMA user_version = 7",
    "PRAGMA journal_mode = WAL",
    "VACUUM INTO '{dir}/copy.db'",
    "REPLACE INTO customers (id, name) VALUES (1, 'Mallory')",
])
def test_writes_are_refused_and_the_file_is_unchanged(db, workspace, query):
    before = fingerprint(db)
    result = call(sql, {"query": query.format(dir=db.parent)}, db_ctx(workspace, db))
    assert result.is_error
    assert result.content.startswith("the sql tool is read-only: only SELECT, WITH and read-only PRAGMA")
    assert fingerprint(db) == before  # same bytes, same mtime, no new files (evil.db, copy.db, -wal, -journal)
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT group_concat(name) FROM customers").fetchone() == ("Ada,Grace,Edsger",)
    conn.close()


def test_read_only_pragmas_and_schema_queries_work(db, workspace):
    info = call(sql, {"query": "PRAGMA table_info(customers)"}, db_ctx(workspace, db))
    assert [row[1] for row in info.data["rows"]] == ["id", "name", "city", "photo"]
    tables = call(sql, {"query": "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"},
                  db_ctx(workspace, db))
    assert tables.data["rows"] == [["customers"], ["numbers"]]


def test_errors_are_results_for_the_model(db, workspace, tmp_path):
    assert call(sql, {"query": "SELECT nope FROM customers"}, db_ctx(workspace, db)).content \
        == "query error: no such column: nope"
    two = call(sql, {"query": "SELECT 1; SELECT 2"}, db_ctx(workspace, db))
    assert two.is_error and "one statement" in two.content
    none = call(sql, {"query": "SELECT 1"}, ToolContext("r", "c", "k", workspace=workspace))
    assert none.content == "no database is attached to this run (attachment 'db')"
    text = tmp_path / "notes.txt"
    text.write_text("hello, not a database")
    wrong = call(sql, {"query": "SELECT 1"}, db_ctx(workspace, text))
    assert wrong.is_error and "is not a SQLite database" in wrong.content


def test_a_runaway_query_is_stopped_by_the_time_limit(db, workspace):
    from types import SimpleNamespace

    quick = sql_tool(SimpleNamespace(agent_sql_timeout_s=0.5))
    forever = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT max(n) FROM r"
    result = call(quick, {"query": forever}, db_ctx(workspace, db))
    assert result.content == "query stopped: it ran past the time limit"


def test_cancel_stops_a_query(db, workspace):
    ctx = db_ctx(workspace, db)
    threading.Timer(0.3, ctx.cancel.set).start()
    forever = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT max(n) FROM r"
    assert call(sql, {"query": forever}, ctx).content == "query cancelled"


@pytest.fixture()
def duck(tmp_path):
    duckdb = pytest.importorskip("duckdb", reason="DuckDB support is the optional `duckdb` extra; not installed")
    path = tmp_path / "sales.duckdb"
    conn = duckdb.connect(str(path))
    conn.execute("CREATE TABLE sales AS SELECT range AS id, range * 1.5 AS amount FROM range(300)")
    conn.close()
    return path


def test_duckdb_select_and_row_cap(duck, workspace):
    result = call(sql, {"query": "SELECT id, amount FROM sales ORDER BY id", "max_rows": 2}, db_ctx(workspace, duck))
    assert result.data == {"columns": ["id", "amount"], "rows": [[0, 0.0], [1, 1.5]], "truncated": True}
    total = call(sql, {"query": "SELECT count(*) AS n, sum(amount) AS s FROM sales"}, db_ctx(workspace, duck))
    assert total.data["rows"] == [[300, 67275.0]]


@pytest.mark.parametrize("query", [
    "INSERT INTO sales VALUES (1000, 1)",
    "DROP TABLE sales",
    "CREATE TABLE evil AS SELECT 1",
    "COPY sales TO '{dir}/leak.csv'",
    "SELECT * FROM read_csv('/etc/passwd')",
    "ATTACH '{dir}/other.duckdb' AS other",
    "SET enable_external_access = true",
    "INSTALL httpfs",
])
def test_duckdb_is_read_only_and_cannot_reach_other_files(duck, workspace, query):
    before = fingerprint(duck)
    result = call(sql, {"query": query.format(dir=duck.parent)}, db_ctx(workspace, duck))
    assert result.content.startswith("the sql tool is read-only and cannot reach other files"), result.content
    assert fingerprint(duck) == before
