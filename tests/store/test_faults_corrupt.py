"""A corrupt database is refused at start, with one message naming the file and what to do; never a traceback.

SQLite only, by nature: it corrupts the database file's bytes (tests/databases.py runs the rest on Postgres too)."""

import os
import socket
import subprocess
import sys

import pytest

from mainspring.store.db import DatabaseCorrupt, dispose_engines, init_db, session
from mainspring.store.tables import Project


def corrupt(path, how: str) -> None:
    with open(path, "r+b") as f:
        if how == "header":
            f.write(b"this is no longer a database" * 4)
        else:  # b-tree pages overwritten in the middle of the file
            f.seek(4096 * 2)
            f.write(os.urandom(4096 * 4))


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "data" / "mainspring.db"
    url = f"sqlite:///{path}"
    init_db(url)
    with session(url) as s:
        s.add(Project(name="acme"))
    dispose_engines()  # the last connection checkpoints the WAL into the file
    yield path
    dispose_engines()


@pytest.mark.parametrize("how", ["header", "pages"])
def test_init_db_refuses_a_corrupt_file_naming_it_and_what_to_do(db, how):
    corrupt(db, how)
    with pytest.raises(DatabaseCorrupt) as e:
        init_db(f"sqlite:///{db}")
    message = str(e.value)
    assert str(db) in message and "corrupt" in message and "mainspring up" in message and "backup" in message
    assert "\n" not in message


def test_a_sound_database_passes_and_keeps_its_rows(db):
    init_db(f"sqlite:///{db}")
    with session(f"sqlite:///{db}", readonly=True) as s:
        assert s.query(Project.name).scalar() == "acme"


def cli(db, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    with socket.socket() as sock:  # should `serve` start after all, it must not take the default port
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "MAINSPRING_DATABASE_URL": f"sqlite:///{db}", "MAINSPRING_DATA_DIR": str(db.parent),
           "MAINSPRING_PORT": str(port)}
    return subprocess.run([sys.executable, "-m", "mainspring", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("args", [["serve"], ["up", "--timeout", "20"], ["keys", "list"]])
def test_the_server_and_the_cli_exit_2_with_one_message(db, args):
    corrupt(db, "pages")
    done = cli(db, *args)
    assert done.returncode == 2, done.stderr
    assert "corrupt" in done.stderr and str(db.name) in done.stderr and "mainspring up" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
