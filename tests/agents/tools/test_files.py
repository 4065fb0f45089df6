import os
from types import SimpleNamespace

import pytest

from mainspring.agents.tools.files import files_tool

from .conftest import call

files = files_tool()


def test_write_read_list_delete_round_trip(ctx, workspace):
    assert call(files, {"action": "write", "path": "notes/plan.md", "content": "step 1\nstep 2\n"}, ctx).content \
        == "wrote 14 bytes to notes/plan.md"
    assert (workspace / "notes" / "plan.md").read_text() == "step 1\nstep 2\n"
    assert call(files, {"action": "read", "path": "notes/plan.md"}, ctx).content == "step 1\nstep 2\n"
    call(files, {"action": "write", "path": "a.txt", "content": "x"}, ctx)
    listing = call(files, {"action": "list"}, ctx)
    assert listing.content == "a.txt (1 bytes)\nnotes/\nnotes/plan.md (14 bytes)"
    assert [e["path"] for e in listing.data["entries"]] == ["a.txt", "notes", "notes/plan.md"]
    assert call(files, {"action": "delete", "path": "notes"}, ctx).is_error  # not empty
    assert call(files, {"action": "delete", "path": "notes/plan.md"}, ctx).content == "deleted notes/plan.md"
    assert call(files, {"action": "delete", "path": "notes"}, ctx).content == "deleted notes"
    assert sorted(os.listdir(workspace)) == ["a.txt"]
    missing = call(files, {"action": "read", "path": "notes/plan.md"}, ctx)
    assert missing.is_error and missing.content == "no file 'notes/plan.md' in the workspace"


def test_long_files_are_read_in_pages(ctx, workspace):
    (workspace / "long.txt").write_text("0123456789" * 3)
    small = files_tool(SimpleNamespace(agent_files_read_chars=12))
    first = call(small, {"action": "read", "path": "long.txt"}, ctx)
    assert first.content.startswith("012345678901\n[showing characters 0-12 of 30; read again with offset=12")
    assert first.data["truncated"] and first.data["end"] == 12
    last = call(small, {"action": "read", "path": "long.txt", "offset": 24}, ctx)
    assert last.content.startswith("456789\n[showing characters 24-30 of 30") and not last.data["truncated"]


def test_binary_files_are_not_dumped(ctx, workspace):
    (workspace / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    result = call(files, {"action": "read", "path": "img.png"}, ctx)
    assert result.content == "img.png is a binary file (10 bytes); it cannot be shown as text"


def test_writes_over_the_size_cap_are_refused(ctx, workspace):
    tiny = files_tool(SimpleNamespace(agent_files_write_bytes=4))
    result = call(tiny, {"action": "write", "path": "big.txt", "content": "12345"}, ctx)
    assert result.is_error and "at most 4 bytes" in result.content and not (workspace / "big.txt").exists()
    assert call(files, {"action": "write", "path": "x.txt"}, ctx).content == "write needs `content`"


@pytest.mark.parametrize("path, message", [
    ("../escape.txt", "must not contain '..'"),
    ("a/../../escape.txt", "must not contain '..'"),
    ("/etc/passwd", "must be relative to the workspace"),
    ("~/.bashrc", "must be relative to the workspace"),
    ("bad\x00name", "bad path"),
])
@pytest.mark.parametrize("action", ["read", "write", "delete", "list"])
def test_paths_outside_the_workspace_are_refused(ctx, workspace, path, message, action):
    result = call(files, {"action": action, "path": path, "content": "pwned"}, ctx)
    assert result.is_error and message in result.content
    assert not (workspace.parent / "escape.txt").exists()


def test_symlinks_leading_out_are_refused_and_inside_ones_work(ctx, workspace, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    os.symlink(outside / "secret.txt", workspace / "link.txt")
    os.symlink(outside, workspace / "linkdir")
    for args in ({"action": "read", "path": "link.txt"}, {"action": "write", "path": "link.txt", "content": "x"},
                 {"action": "read", "path": "linkdir/secret.txt"}, {"action": "list", "path": "linkdir"},
                 {"action": "write", "path": "linkdir/new.txt", "content": "x"},
                 {"action": "delete", "path": "linkdir/secret.txt"}):
        result = call(files, args, ctx)
        assert result.is_error and "resolves outside the workspace" in result.content, args
    assert (outside / "secret.txt").read_text() == "secret" and sorted(os.listdir(outside)) == ["secret.txt"]
    (workspace / "real.txt").write_text("inside")
    os.symlink("real.txt", workspace / "alias.txt")
    assert call(files, {"action": "read", "path": "alias.txt"}, ctx).content == "inside"
    listing = call(files, {"action": "list"}, ctx).content.splitlines()
    assert "link.txt -> (link)" in listing and "linkdir -> (link)" in listing  # listed, never followed
