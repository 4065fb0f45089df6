"""A migrated SQLite file per test, and the built-in price sheet."""

import pytest

from mainspring.billing.prices import load_price_sheet
from mainspring.store.db import dispose_engines, init_db


@pytest.fixture
def db(tmp_path):
    """The URL of a fresh, migrated SQLite database file (WAL, like production)."""
    url = f"sqlite:///{tmp_path / 'billing.db'}"
    init_db(url)
    yield url
    dispose_engines()


@pytest.fixture(scope="session")
def sheet():
    return load_price_sheet()
