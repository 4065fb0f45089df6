"""The project data policy (store/data_policy.py), its CLI (store/projects_cli.py) and the retention sweeper
(store/retention.py): on SQLite and on Postgres."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from mainspring.billing.keys import create_key
from mainspring.store.data_policy import (DEFAULT_POLICY, UNCHANGED, DataPolicy, PolicyError, find_project,
                                          get_policy, set_policy)
from mainspring.store.db import session
from mainspring.store.projects_cli import projects_app
from mainspring.store.retention import sweep
from mainspring.store.tables import ApiKey, BatchRow, FileRow, LedgerEntry, Project, ResponseRow, SceneThreadRow

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
OLD = NOW - timedelta(days=40)
RECENT = NOW - timedelta(days=2)


def test_a_new_project_has_the_default_policy_and_set_changes_only_what_is_given(database_url):
    with session(database_url) as s:
        pid = create_key(s, "acme", "bot").key.project_id
    with session(database_url) as s:
        assert get_policy(s, pid) == DEFAULT_POLICY == DataPolicy(True, False, None)
        assert get_policy(s, None) == DEFAULT_POLICY  # an anonymous caller
        assert set_policy(s, pid, training_allowed=False) == DataPolicy(False, False, None)
        assert set_policy(s, pid, local_only=True, retention_days=30) == DataPolicy(False, True, 30)
        assert set_policy(s, pid, retention_days=UNCHANGED) == DataPolicy(False, True, 30)
        assert set_policy(s, pid, retention_days=None) == DataPolicy(False, True, None)
    with session(database_url, readonly=True) as s:
        assert get_policy(s, pid) == DataPolicy(False, True, None)


@pytest.mark.parametrize("days", [0, -3, 10**6])
def test_retention_out_of_range_is_refused(database_url, days):
    with session(database_url) as s:
        pid = create_key(s, "acme").key.project_id
        with pytest.raises(PolicyError, match="retention_days"):
            set_policy(s, pid, retention_days=days)
        with pytest.raises(PolicyError, match="no project 'nope'"):
            find_project(s, "nope")


# ---- CLI -------------------------------------------------------------------------------------------------
@pytest.fixture
def cli_env(monkeypatch, tmp_path, blank_database_url):
    monkeypatch.setenv("MAINSPRING_DATA_DIR", str(tmp_path))
    if blank_database_url.startswith("sqlite"):
        monkeypatch.delenv("MAINSPRING_DATABASE_URL", raising=False)
    else:
        monkeypatch.setenv("MAINSPRING_DATABASE_URL", blank_database_url)
    yield blank_database_url


def test_projects_cli_set_and_show(cli_env):
    from mainspring.billing.cli import keys_app

    runner = CliRunner()
    assert runner.invoke(keys_app, ["create", "--project", "acme"]).exit_code == 0
    r = runner.invoke(projects_app, ["show", "acme"])
    assert r.exit_code == 0, r.output
    assert "training: allowed" in r.stdout and "local-only: no" in r.stdout and "retention: keep" in r.stdout
    r = runner.invoke(projects_app, ["set", "acme", "--no-training", "--local-only", "--retention-days", "30"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(projects_app, ["show", "acme"])
    assert "training: never" in r.stdout and "local-only: yes" in r.stdout and "retention: 30 days" in r.stdout
    r = runner.invoke(projects_app, ["set", "acme", "--retention-days", "none", "--training"])
    assert r.exit_code == 0 and "retention: keep" in r.stdout and "training: allowed" in r.stdout
    assert "local-only: yes" in r.stdout  # not given: unchanged
    with session(cli_env, readonly=True) as s:
        assert get_policy(s, find_project(s, "acme").id) == DataPolicy(True, True, None)


@pytest.mark.parametrize("args, message", [
    (["show", "nope"], "no project 'nope'"),
    (["set", "nope", "--no-training"], "no project 'nope'"),
    (["set", "acme"], "nothing to set"),
    (["set", "acme", "--retention-days", "soon"], "--retention-days"),
    (["set", "acme", "--retention-days", "0"], "retention_days 0 is out of range"),
    (["sweep", "--project", "nope"], "no project 'nope'"),
])
def test_projects_cli_bad_input_exits_2(cli_env, args, message):
    from mainspring.billing.cli import keys_app

    assert CliRunner().invoke(keys_app, ["create", "--project", "acme"]).exit_code == 0
    r = CliRunner().invoke(projects_app, args)
    assert r.exit_code == 2, r.output
    assert message in r.stderr and "Traceback" not in r.output


# ---- the sweeper -----------------------------------------------------------------------------------------
def _stored(s, key: ApiKey, tag: str, at: datetime, data_dir) -> None:
    """One response, one finished batch with its input and output files, one ledger row, all made at `at`."""
    s.add(ResponseRow(id=f"resp_{tag}", project_id=key.project_id, api_key_id=key.id, model="m", status="completed",
                      request_json="{}", input_json="[]", output_json="[]", usage_json="{}", created_at=at))
    for f in ("in", "out"):
        (data_dir / "files").mkdir(exist_ok=True)
        (data_dir / "files" / f"file-{tag}-{f}").write_text("a prompt")
        s.add(FileRow(id=f"file-{tag}-{f}", purpose="batch", filename="x.jsonl", bytes=8,
                      path=f"files/file-{tag}-{f}", api_key_id=key.id, created_at=at))
    s.flush()
    s.add(BatchRow(id=f"batch_{tag}", input_file_id=f"file-{tag}-in", output_file_id=f"file-{tag}-out",
                   endpoint="/v1/chat/completions", status="completed", api_key_id=key.id, created_at=at))
    s.add(SceneThreadRow(id=f"sth_{tag}", project_id=key.project_id, api_key_id=key.id, model="m", state_json="{}",
                         created_at=at, updated_at=at))
    s.add(LedgerEntry(request_id=f"req-{tag}", api_key_id=key.id, project_id=key.project_id, model="m",
                      tier="standard", endpoint="/v1/responses", price_sheet_version="v1", ts=at))


def test_sweep_deletes_only_old_rows_of_the_project_and_keeps_the_ledger(database_url, tmp_path):
    with session(database_url) as s:
        acme = create_key(s, "acme").key
        other = create_key(s, "other").key  # no retention setting: nothing of it is touched
        for key in (acme, other):
            _stored(s, key, f"{key.id}-old", OLD, tmp_path)
            _stored(s, key, f"{key.id}-new", RECENT, tmp_path)
        s.add(SceneThreadRow(id="sth_talked_to", project_id=acme.project_id, model="m", state_json="{}",
                             created_at=OLD, updated_at=RECENT))  # opened long ago, its last turn recent: kept
        set_policy(s, acme.project_id, retention_days=30)

    dry = sweep(database_url, tmp_path, dry_run=True, now=NOW)
    assert [(r.project, r.responses, r.batches, r.files, r.scene_threads) for r in dry] == [("acme", 1, 1, 2, 1)]
    with session(database_url, readonly=True) as s:
        assert s.scalar(select(func.count()).select_from(ResponseRow)) == 4  # a dry run deletes nothing

    done = sweep(database_url, tmp_path, now=NOW)
    assert [(r.project, r.responses, r.batches, r.files, r.scene_threads) for r in done] == [("acme", 1, 1, 2, 1)]
    with session(database_url, readonly=True) as s:
        assert set(s.scalars(select(ResponseRow.id))) == {f"resp_{acme.id}-new", f"resp_{other.id}-old",
                                                          f"resp_{other.id}-new"}
        assert set(s.scalars(select(BatchRow.id))) == {f"batch_{acme.id}-new", f"batch_{other.id}-old",
                                                       f"batch_{other.id}-new"}
        assert set(s.scalars(select(SceneThreadRow.id))) == {f"sth_{acme.id}-new", "sth_talked_to",
                                                             f"sth_{other.id}-old", f"sth_{other.id}-new"}
        assert f"file-{acme.id}-old-in" not in set(s.scalars(select(FileRow.id)))
        assert s.scalar(select(func.count()).select_from(FileRow)) == 6
        assert s.scalar(select(func.count()).select_from(LedgerEntry)) == 4  # books and records stay
        assert s.scalar(select(func.count()).select_from(Project)) == 2
    assert not (tmp_path / "files" / f"file-{acme.id}-old-in").exists()
    assert (tmp_path / "files" / f"file-{acme.id}-new-in").exists()
    assert (tmp_path / "files" / f"file-{other.id}-old-in").exists()
    assert [r.total for r in sweep(database_url, tmp_path, now=NOW)] == [0]  # nothing left to sweep


def test_sweep_keeps_a_file_that_an_unfinished_batch_reads(database_url, tmp_path):
    with session(database_url) as s:
        key = create_key(s, "acme").key
        _stored(s, key, "a", OLD, tmp_path)
        s.get(BatchRow, "batch_a").status = "in_progress"  # a long batch: its input is still being read
        set_policy(s, key.project_id, retention_days=30)
    [r] = sweep(database_url, tmp_path, now=NOW)
    assert (r.responses, r.batches, r.files) == (1, 0, 0)
    with session(database_url, readonly=True) as s:
        assert s.get(FileRow, "file-a-in") is not None and s.get(BatchRow, "batch_a") is not None
