"""Persistence: SQLAlchemy tables, sessions and Alembic migrations (SQLite by default, Postgres)."""

from mainspring.store.db import dispose_engines, get_engine, init_db, session

__all__ = ["dispose_engines", "get_engine", "init_db", "session"]
