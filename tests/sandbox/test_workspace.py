"""Workspace: safe input paths, and outputs read back without following the job's links."""

import os

import pytest

from mainspring.sandbox.errors import SandboxError
from mainspring.sandbox.workspace import Workspace, safe_relpath


def test_safe_relpath_normalises_and_refuses_escapes():
    assert safe_relpath("a/./b.txt") == "a/b.txt"
    for bad in ("/abs", "../up", "a/../../b", "", "nul\x00"):
        with pytest.raises(SandboxError):
            safe_relpath(bad)


def test_collect_skips_links_unchanged_inputs_and_special_files(tmp_path):
    ws = Workspace(tmp_path / "ws", 16, None, None, use_tmpfs=False)
    ws.create()
    inputs = ws.write_inputs({"keep.txt": "same", "edit.txt": "before", "run.sh": "#!/bin/sh\necho hi\n"})
    assert os.access(ws.path / "run.sh", os.X_OK) and not os.access(ws.path / "keep.txt", os.X_OK)
    (ws.path / "edit.txt").write_text("after")
    (ws.path / "leak").symlink_to("/etc/passwd")
    (ws.path / "dirlink").symlink_to("/etc")
    os.mkfifo(ws.path / "fifo")
    (ws.path / "sub").mkdir()
    (ws.path / "sub" / "new.bin").write_bytes(b"\x00\x01")
    got = ws.collect(inputs, cap_bytes=1 << 20)
    assert got.files == {"edit.txt": b"after", "sub/new.bin": b"\x00\x01"} and got.omitted == []
    ws.destroy()
    assert not (tmp_path / "ws").exists()


def test_inputs_that_conflict_are_a_clear_error(tmp_path):
    ws = Workspace(tmp_path / "ws", 16, None, None, use_tmpfs=False)
    ws.create()
    with pytest.raises(SandboxError, match="input file .a.b. cannot be written"):
        ws.write_inputs({"a": "file", "a/b": "under a file"})
