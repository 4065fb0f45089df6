"""The database fixtures every database-facing suite uses: each test runs once on SQLite and once on Postgres.

`database_url` is a fresh, migrated database; `blank_database_url` an empty one (for the migration tests). SQLite is
a file in the test's tmp_path, as before. Postgres is one throwaway cluster per pytest process (so one per xdist
worker; tests/pg.py), a template database migrated once in it, and a copy of that template per test
(`CREATE DATABASE ... TEMPLATE`, tens of milliseconds), dropped after the test: every test sees an isolated database
at the head migration without running the migrations again.

Without Postgres on the host the postgres cases skip, saying why; under CI (env CI set) they fail, as the sandbox
fixture does: CI installs postgresql-15 (.ci/run), so a missing one there is a broken setup, not a reason to skip.
Tests that are SQLite by nature (WAL, file corruption, POSIX locks) keep their own SQLite URLs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from mainspring.store.db import dispose_engines, init_db
from tests.pg import PgCluster, PostgresUnavailable

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    try:
        cluster = PgCluster().start()
    except PostgresUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the database tests on Postgres: {exc}")
        pytest.skip(str(exc))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def pg_template(pg_cluster: PgCluster) -> str:
    """A database migrated to the head once per session: the template each test's database is copied from."""
    name = pg_cluster.create_database()
    init_db(pg_cluster.url(name))
    dispose_engines()  # CREATE DATABASE ... TEMPLATE refuses a template anyone is connected to
    return name


def _sqlite(tmp_path: Path, migrate: bool) -> str:
    url = f"sqlite:///{tmp_path / 'mainspring.db'}"
    if migrate:
        init_db(url)
    return url


def _postgres(request: pytest.FixtureRequest, migrate: bool) -> Iterator[str]:
    cluster: PgCluster = request.getfixturevalue("pg_cluster")
    template = request.getfixturevalue("pg_template") if migrate else None
    name = cluster.create_database(template)
    try:
        yield cluster.url(name)
    finally:
        dispose_engines()
        cluster.drop_database(name)


def _database(request: pytest.FixtureRequest, tmp_path: Path, migrate: bool) -> Iterator[str]:
    if request.param == "sqlite":
        yield _sqlite(tmp_path, migrate)
        dispose_engines()
    else:
        yield from _postgres(request, migrate)


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh database at the newest migration: a SQLite file (WAL, like production) or Postgres."""
    yield from _database(request, tmp_path, migrate=True)


@pytest.fixture(params=BACKENDS)
def blank_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty database (no tables, no migrations run): SQLite's file does not exist yet."""
    yield from _database(request, tmp_path, migrate=False)


@pytest.fixture
def sqlite_database_url(tmp_path: Path) -> Iterator[str]:
    """A migrated SQLite file only: for the tests of what is SQLite's alone (its file, WAL, locks)."""
    yield _sqlite(tmp_path, migrate=True)
    dispose_engines()


def is_postgres(url: str) -> bool:
    return url.startswith("postgresql")
