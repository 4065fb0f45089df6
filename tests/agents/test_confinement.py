"""What a run may touch: only its agent's tools, and only attachments its project may see (uploaded files, or
paths under the operator's roots) — never the data directory or the platform's database, not through a
symlink, and not through a path that turns into one after the run was created."""

from __future__ import annotations

import json
import os
from pathlib import Path
from dataclasses import dataclass, field

import pytest

from mainspring.agents.attachments import AttachmentRefused
from mainspring.agents.journal import JournalError
from mainspring.agents.tools.base import ToolResult
from mainspring.store.db import session
from mainspring.store.tables import FileRow

from .conftest import CountTool, PolicyModel, TERMINAL, drive, make_runtime, spec, wait_status


@dataclass
class ReadDb:
    """TEST-ONLY: returns the bytes of the run's `db` attachment (what a careless tool could leak)."""
    name: str = "read_db"
    description: str = "read the attached database file"
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})
    idempotent: bool = True
    requires_approval: bool = False
    timeout_s: float = 30
    retries: int = 0
    calls: list = field(default_factory=list)

    async def call(self, args: dict, ctx) -> ToolResult:
        self.calls.append(ctx.attachments)
        with open(ctx.attachments["db"], "rb") as f:
            return ToolResult(f"read {len(f.read())} bytes")


def tool_results(rt, run_id: str) -> list[dict]:
    return [c for st in rt.steps(run_id) for c in st["tool_calls"]]


def test_a_tool_the_agent_does_not_list_is_refused_and_journaled(tmp_path, db_url):
    listed, unlisted = CountTool(tmp_path / "ledger"), CountTool(tmp_path / "other", name="shell")
    rt = make_runtime(tmp_path, db_url, PolicyModel(tool="shell"), {"count": listed, "shell": unlisted})
    rt.put_agent(spec(tools=("count",)))
    run = rt.start_run("tester", "call the unlisted tool")
    done = drive(rt, lambda: wait_status(rt, run.id, TERMINAL))
    assert unlisted.calls == [] and not (tmp_path / "other").exists()  # never ran
    call = tool_results(rt, run.id)[0]
    assert call["name"] == "shell" and call["status"] == "failed"
    assert "not one of this agent's tools (refused, not run)" in call["result"]["content"]
    audit = [json.loads(line) for line in rt.export_audit(run.id)]
    assert [e["payload"]["unknown_tools"] for e in audit if e["kind"] == "model.step"][0] == ["shell"]
    assert done.status == "succeeded"


@pytest.fixture
def roots(tmp_path):
    root = tmp_path / "shared"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.txt").write_text("hello")
    (root / "other.db").write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    return root


def test_paths_must_lie_under_an_allowed_root_and_outside_the_data_dir(tmp_path, roots):
    platform = roots / "platform.db"  # the platform database inside an allowed root: still never attachable
    url = f"sqlite:///{platform}"
    rt = make_runtime(tmp_path / "data", url, PolicyModel(), {"count": CountTool(tmp_path / "l")},
                      agent_attach_roots=[roots, tmp_path / "data"])
    rt.put_agent(spec())
    ok = rt.start_run("tester", "x", attachments={"docs": str(roots / "docs"), "db": str(roots / "other.db")})
    assert json.loads(ok.attachments_json) == {"docs": str(roots / "docs"), "db": str(roots / "other.db")}
    (roots / "link.db").symlink_to(platform)
    (roots / "wal-link").symlink_to(f"{platform}-wal")
    refused = {
        "/etc/hostname": "outside the attachable roots",
        str(platform): "platform's own database",
        str(roots / "link.db"): "platform's own database",
        str(roots / "wal-link"): "platform's own database",
        str(tmp_path / "data"): "data directory",
        str(tmp_path / "data" / "files" / "file-x"): "data directory",
    }
    for path, why in refused.items():
        with pytest.raises(AttachmentRefused, match=why):
            rt.start_run("tester", "x", attachments={"db": path})
    with pytest.raises(AttachmentRefused, match="must be a folder"):
        rt.start_run("tester", "x", attachments={"docs": str(roots / "other.db")})


def test_no_roots_configured_means_uploaded_files_only(tmp_path, db_url, roots):
    data = tmp_path / "data"
    rt = make_runtime(data, db_url, PolicyModel(), {"count": CountTool(tmp_path / "l")})
    rt.put_agent(spec())
    with pytest.raises(AttachmentRefused, match="none configured"):
        rt.start_run("tester", "x", attachments={"docs": str(roots / "docs")})
    (data / "files").mkdir(parents=True)
    (data / "files" / "file-abc").write_text("uploaded notes")
    with session(db_url) as s:
        s.add(FileRow(id="file-abc", purpose="assistants", filename="notes.txt", bytes=14, path="files/file-abc"))
    run = rt.start_run("tester", "x", attachments={"docs": ["file-abc"], "db": "file-abc"})
    attached = json.loads(run.attachments_json)
    assert Path(attached["db"]).name == "notes.txt" and Path(attached["db"]).read_text() == "uploaded notes"
    assert (data.resolve() / attached["docs"] / "notes.txt").read_text() == "uploaded notes"
    with pytest.raises(JournalError, match="no file 'file-nope'") as exc:
        rt.start_run("tester", "x", attachments={"docs": ["file-abc", "file-nope"]})
    assert exc.value.status == 404


def test_a_path_that_becomes_a_symlink_later_is_refused_when_the_tool_runs(tmp_path, roots):
    platform = tmp_path / "data" / "mainspring.db"
    reader = ReadDb()
    rt = make_runtime(tmp_path / "data", f"sqlite:///{platform}", PolicyModel(tool="read_db"), {"read_db": reader},
                      agent_attach_roots=[roots])
    rt.put_agent(spec(tools=("read_db",)))
    target = roots / "other.db"
    run = rt.start_run("tester", "read it", attachments={"db": str(target)})
    target.unlink()
    os.symlink(platform, target)  # swapped after the run was created, before its tool call
    done = drive(rt, lambda: wait_status(rt, run.id, TERMINAL))
    assert reader.calls == []
    call = tool_results(rt, run.id)[0]
    assert call["status"] == "failed" and "platform's own database" in call["result"]["content"]
    assert done.status == "succeeded"
