"""billing/keys: secrets shown once, stored hashed; verify, revoke, list; the `keys` CLI sub-app."""

import re

import pytest
from typer.testing import CliRunner

from mainspring.billing import budgets
from mainspring.billing.cli import keys_app
from mainspring.billing.keys import (
    KeyAdminError,
    create_key,
    effective_limits,
    hash_secret,
    list_keys,
    revoke_key,
    verify_key,
)
from mainspring.store.db import dispose_engines, session


def test_create_and_verify(db):
    with session(db) as s:
        made = create_key(s, "acme", "ci bot", rpm_limit=60)
    assert re.fullmatch(r"ms-acme-[A-Za-z0-9]{40}", made.secret)
    assert made.key.id.startswith("key_") and made.secret.startswith(made.key.prefix)
    assert made.key.hashed_secret == hash_secret(made.secret) != made.secret
    with session(db, readonly=True) as s:
        found = verify_key(s, made.secret)
        assert found is not None and found.id == made.key.id and found.rpm_limit == 60
        assert verify_key(s, made.secret[:-1] + ("A" if made.secret[-1] != "A" else "B")) is None
        assert verify_key(s, "ms-acme-") is None and verify_key(s, "sk-whatever") is None
        assert verify_key(s, "") is None


def test_secret_never_reaches_the_database_file(sqlite_database_url, tmp_path):
    """SQLite only: reads the database file's bytes (Postgres stores the same columns)."""
    db = sqlite_database_url
    with session(db) as s:
        secrets = [create_key(s, "acme").secret for _ in range(3)]
    dispose_engines()  # close connections; WAL content stays in the -wal file, which is scanned too
    blobs = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("mainspring.db"))
    for secret in secrets:
        assert secret.encode() not in blobs
        assert secret.rpartition("-")[2].encode() not in blobs  # not even the random part
        assert hash_secret(secret).encode() in blobs


def test_revoke_and_list(db):
    with session(db) as s:
        a = create_key(s, "acme", "a").key
        b = create_key(s, "acme", "b")
        c = create_key(s, "beta", "c").key
    with session(db) as s:
        first = revoke_key(s, b.key.id).revoked_at
    with session(db) as s:
        assert revoke_key(s, b.key.id).revoked_at == first  # the first revocation time stays
        assert verify_key(s, b.secret) is None
        assert [k.id for k, _ in list_keys(s)] == [a.id, b.key.id, c.id]
        assert [k.id for k, _ in list_keys(s, include_revoked=False)] == [a.id, c.id]
        assert [(k.id, p) for k, p in list_keys(s, "beta")] == [(c.id, "beta")]
        with pytest.raises(KeyAdminError, match="no API key"):
            revoke_key(s, "key_nope")


@pytest.mark.parametrize("project", ["", "Acme", "a-b", "x" * 65, "has space"])
def test_bad_project_names(db, project):
    with session(db) as s, pytest.raises(KeyAdminError, match="project name"):
        create_key(s, project)


def test_effective_limits(db):
    with session(db) as s:
        own = create_key(s, "acme", rpm_limit=10, tpm_limit=0).key
        default = create_key(s, "acme").key
    assert effective_limits(own, 100, 5000) == (10, 0)
    assert effective_limits(default, 100, 5000) == (100, 5000)
    assert effective_limits(None, 0, 0) == (0, 0)


@pytest.fixture
def cli_env(monkeypatch, tmp_path, blank_database_url):
    """The CLI on Settings' database (it migrates it itself): the data dir's SQLite file, or Postgres by URL."""
    monkeypatch.setenv("MAINSPRING_DATA_DIR", str(tmp_path))
    if blank_database_url.startswith("sqlite"):  # the default URL, as a user without the setting gets
        monkeypatch.delenv("MAINSPRING_DATABASE_URL", raising=False)
    else:
        monkeypatch.setenv("MAINSPRING_DATABASE_URL", blank_database_url)
    yield blank_database_url


def test_keys_cli(cli_env):
    runner = CliRunner()
    r = runner.invoke(keys_app, ["create", "--project", "acme", "--name", "bot", "--budget", "5.00", "--rpm", "30"])
    assert r.exit_code == 0, r.output
    key_id = re.search(r"key id:\s+(key_\w+)", r.stdout).group(1)
    secret = re.search(r"secret:\s+(ms-acme-\w+)", r.stdout).group(1)
    assert "$5.00 (total)" in r.stdout and "not shown again" in r.stderr
    with session(cli_env, readonly=True) as s:
        key = verify_key(s, secret)
        assert key.id == key_id and key.rpm_limit == 30
        assert [b.hard_limit_u for b in budgets.status(s, "key", key_id)] == [5_000_000]

    r = runner.invoke(keys_app, ["list"])
    assert r.exit_code == 0 and key_id in r.stdout and "active" in r.stdout and secret not in r.stdout
    r = runner.invoke(keys_app, ["revoke", key_id])
    assert r.exit_code == 0 and f"revoked {key_id}" in r.stdout
    assert "revoked" in runner.invoke(keys_app, ["list"]).stdout
    assert "no API keys" in runner.invoke(keys_app, ["list", "--active"]).stdout


@pytest.mark.parametrize("args, message", [
    (["create", "--project", "Bad Name"], "project name"),
    (["create", "--project", "acme", "--budget", "five"], "--budget"),
    (["create", "--project", "acme", "--budget", "-1"], "--budget"),
    (["create", "--project", "acme", "--period", "week"], "--period"),
    (["create", "--project", "acme", "--rpm", "-5"], "rpm"),
    (["revoke", "key_missing"], "no API key"),
])
def test_keys_cli_bad_input_exits_2_without_traceback(cli_env, args, message):
    r = CliRunner().invoke(keys_app, args)
    assert r.exit_code == 2, r.output
    assert message in r.stderr and "Traceback" not in r.output
    assert isinstance(r.exception, SystemExit)  # a clean exit, not an escaped exception
