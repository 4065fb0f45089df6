"""`sql`: read-only queries on the database the user attached to the run (`ctx.attachments["db"]`).

SQLite is opened read-only three ways over, because each alone has a gap: the `mode=ro` URI (the file is never
opened for writing), `PRAGMA query_only` (no statement may write), and an authorizer that allows only reads,
so neither `ATTACH` (which could create a file elsewhere) nor a `PRAGMA` that undoes `query_only` gets through.
DuckDB (a `.duckdb` file, with the optional `duckdb` package) is opened `read_only` with external access off and
the configuration locked, so `COPY ... TO`, `read_csv('/etc/...')`, `ATTACH` and `INSTALL` are refused.

The attached file is never open()ed by Python: closing any descriptor of a file drops all of this process's POSIX
locks on it, SQLite's included, so a header check by open() once let another process delete the live server's WAL.
SQLite itself tells a non-database apart (SQLITE_NOTADB), and the platform's own database files are refused.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field
from pydantic_core import to_jsonable_python

from mainspring.agents.tools.base import ToolContext, ToolError, ToolResult
from mainspring.agents.tools.decorator import FunctionTool, tool
from mainspring.config import Settings
from mainspring.store.db import is_platform_db

MAX_ROWS = 200
QUERY_TIMEOUT_S = 30.0
CELL_CHARS = 80  # per cell in the text table the model sees; data rows keep the whole value
TABLE_CHARS = 20_000
DUCKDB_SUFFIXES = (".duckdb", ".ddb")
SQLITE_READ_PRAGMAS = frozenset({
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo", "foreign_key_list",
    "database_list", "collation_list", "function_list", "pragma_list", "user_version", "schema_version",
    "encoding", "page_count", "page_size",
})


def sql_tool(settings: Settings | None = None) -> FunctionTool:
    timeout_s = float(getattr(settings, "agent_sql_timeout_s", QUERY_TIMEOUT_S))

    @tool(name="sql", idempotent=True, timeout_s=timeout_s + 15)
    def sql(ctx: ToolContext, query: str,
            max_rows: Annotated[int, Field(ge=1, le=1000)] = MAX_ROWS) -> ToolResult:
        """Run one read-only SQL query (SELECT, WITH, or a read-only PRAGMA) on the database attached to this
        run, a SQLite or DuckDB file. To see the tables: SQLite `SELECT name, sql FROM sqlite_master`, DuckDB
        `SELECT table_name, column_name, data_type FROM information_schema.columns`.

        Args:
            query: a single SQL statement
            max_rows: the most rows to return; more are cut with a note
        """
        path = _database_path(ctx, settings if isinstance(settings, Settings) else None)
        deadline = time.monotonic() + timeout_s
        if path.suffix.lower() in DUCKDB_SUFFIXES:
            columns, rows, more = _duckdb_query(path, query, max_rows, deadline, ctx.cancel)
        else:
            columns, rows, more = _sqlite_query(path, query, max_rows, deadline, ctx.cancel)
        return render(columns, rows, more, max_rows)

    return sql


def _database_path(ctx: ToolContext, settings: Settings | None) -> Path:
    attached = ctx.attachments.get("db")
    if not attached:
        raise ToolError("no database is attached to this run (attachment 'db')")
    path = Path(attached)
    if is_platform_db(path, settings):  # before anything else touches it
        raise ToolError(f"the attached database {path.name!r} is the platform's own database, which the sql tool "
                        "may not read")
    if not path.is_file():
        raise ToolError(f"the attached database {path.name!r} does not exist")
    return path


# ---- SQLite ----------------------------------------------------------------------------------------------------
def _sqlite_query(path: Path, query: str, max_rows: int, deadline: float,
                  cancel: threading.Event) -> tuple[list[str], list[tuple], bool]:
    try:
        conn = connect_sqlite_readonly(path)
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_NOTADB:
            raise ToolError(f"{path.name} is not a SQLite database (DuckDB files must end in .duckdb)") from exc
        raise ToolError(f"cannot open {path.name}: {exc}") from exc
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline or cancel.is_set()), 10_000)
    try:
        cursor = conn.execute(query)
        columns = [d[0] for d in cursor.description or ()]
        rows = cursor.fetchmany(max_rows + 1)
    except sqlite3.Warning as exc:  # "You can only execute one statement at a time."
        raise ToolError(f"query error: {exc}") from exc
    except sqlite3.Error as exc:
        raise ToolError(_explain_sqlite_error(exc, deadline, cancel)) from exc
    finally:
        conn.close()
    return columns, rows[:max_rows], len(rows) > max_rows


def connect_sqlite_readonly(path: Path) -> sqlite3.Connection:
    """A connection that cannot change `path` or any other file."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
    try:
        conn.execute("PRAGMA schema_version").fetchone()  # reads the header: SQLITE_NOTADB for other files
    except sqlite3.Error:
        conn.close()
        raise
    conn.execute("PRAGMA query_only = 1")
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.set_authorizer(_sqlite_authorizer)  # after our own PRAGMA, which it would refuse
    return conn


_SQLITE_READ_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
                                  sqlite3.SQLITE_RECURSIVE})


def _sqlite_authorizer(action: int, arg1: str | None, arg2: str | None, db: str | None, source: str | None) -> int:
    if action in _SQLITE_READ_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in SQLITE_READ_PRAGMAS:
        # user_version = 5 would be a write; table_info(x) passes the table name as arg2, which is fine
        if (arg1 or "").lower() not in ("user_version", "schema_version") or arg2 is None:
            return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def _explain_sqlite_error(exc: sqlite3.Error, deadline: float, cancel: threading.Event) -> str:
    text = str(exc)
    if "interrupted" in text:
        return "query cancelled" if cancel.is_set() else "query stopped: it ran past the time limit"
    if any(word in text for word in ("not authorized", "authorization denied", "readonly", "read-only")):
        return f"the sql tool is read-only: only SELECT, WITH and read-only PRAGMA queries are allowed ({text})"
    return f"query error: {text}"


# ---- DuckDB ----------------------------------------------------------------------------------------------------
def _duckdb_query(path: Path, query: str, max_rows: int, deadline: float,
                  cancel: threading.Event) -> tuple[list[str], list[tuple], bool]:
    try:
        import duckdb
    except ImportError:
        raise ToolError("DuckDB files need the optional `duckdb` package (pip install duckdb)") from None
    try:
        conn = duckdb.connect(str(path), read_only=True, config={
            "enable_external_access": False, "autoinstall_known_extensions": False,
            "autoload_known_extensions": False, "lock_configuration": True, "threads": 2, "memory_limit": "1GB"})
    except duckdb.Error as exc:
        raise ToolError(f"cannot open {path.name} as a DuckDB database: {exc}") from exc
    done = threading.Event()

    def watchdog() -> None:  # DuckDB has no progress callback; interrupt() from another thread stops a query
        while not done.wait(0.05):
            if time.monotonic() > deadline or cancel.is_set():
                conn.interrupt()
                return

    threading.Thread(target=watchdog, daemon=True, name="sql-duckdb-watchdog").start()
    try:
        cursor = conn.execute(query)
        columns = [d[0] for d in cursor.description or ()]
        rows = cursor.fetchmany(max_rows + 1) if cursor.description else []
    except duckdb.InterruptException as exc:
        raise ToolError("query cancelled" if cancel.is_set() else "query stopped: it ran past the time limit") \
            from exc
    except (duckdb.PermissionException, duckdb.InvalidInputException) as exc:
        raise ToolError(f"the sql tool is read-only and cannot reach other files: {exc}") from exc
    except duckdb.Error as exc:
        raise ToolError(f"query error: {exc}") from exc
    finally:
        done.set()
        conn.close()
    return columns, rows[:max_rows], len(rows) > max_rows


# ---- results ---------------------------------------------------------------------------------------------------
def render(columns: list[str], rows: list[tuple], more: bool, max_rows: int) -> ToolResult:
    """A compact `a | b` text table for the model, and JSON-safe rows for the journal."""
    data_rows = [[_json_cell(v) for v in row] for row in rows]
    if not columns:
        return ToolResult("(statement returned no rows)", data={"columns": [], "rows": [], "truncated": False})
    lines = [" | ".join(columns), " | ".join("-" * max(len(c), 3) for c in columns)]
    size = sum(len(line) for line in lines)
    shown = 0
    for row in rows:
        line = " | ".join(_text_cell(v) for v in row)
        if size + len(line) > TABLE_CHARS:
            break
        lines.append(line)
        size += len(line) + 1
        shown += 1
    count = f"{len(rows)} row{'s' if len(rows) != 1 else ''}"
    if more:
        lines.append(f"[{count} shown; the query returned more, cut at max_rows={max_rows}: add a LIMIT, a WHERE "
                     "or an aggregate]")
    elif shown < len(rows):
        lines.append(f"[{shown} of {count} shown; the rest did not fit in the output]")
    else:
        lines.append(f"({count})")
    return ToolResult("\n".join(lines), data={"columns": columns, "rows": data_rows, "truncated": more})


def _json_cell(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<blob {len(bytes(value))} bytes>"
    if isinstance(value, Decimal):  # a JSON number when a float holds it exactly, else the exact digits
        as_float = float(value)
        return as_float if value.is_finite() and Decimal(repr(as_float)) == value else str(value)
    return to_jsonable_python(value, fallback=str)


def _text_cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<blob {len(bytes(value))} bytes>"
    text = str(value).replace("\n", "\\n").replace("|", "\\|")
    return text if len(text) <= CELL_CHARS else text[: CELL_CHARS - 1] + "…"
