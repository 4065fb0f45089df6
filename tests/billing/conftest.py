"""A migrated database per test (SQLite and Postgres: tests/databases.py), and the built-in price sheet."""

import pytest

from mainspring.billing.prices import load_price_sheet


@pytest.fixture
def db(database_url):
    """The URL of a fresh, migrated database: a SQLite file (WAL, like production) or a Postgres database."""
    return database_url


@pytest.fixture(scope="session")
def sheet():
    return load_price_sheet()
