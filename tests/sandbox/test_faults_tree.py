"""A job's output tree cannot crash the run: any depth, any width, names that are not UTF-8."""

import dataclasses
import json
import os

import pytest

from mainspring.agents.tools.code import python_tool
from mainspring.agents.tools.base import ToolContext
from mainspring.sandbox import tree
from mainspring.sandbox.workspace import Workspace
from tests.agents.tools.conftest import call

DEEP = 3000  # past Python's recursion limit (os.walk and shutil.rmtree recurse) and past PATH_MAX (4096)


def make_chain(root, depth: int, name: str = "d") -> None:
    """A chain of `depth` directories under `root`, a file at the bottom, built with relative paths only."""
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    fd = top
    for _ in range(depth):
        os.mkdir(name, dir_fd=fd)
        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        if fd != top:
            os.close(fd)
        fd = child
    os.close(os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    os.close(fd)
    os.close(top)


@pytest.fixture
def deep_dir(tmp_path):
    """A folder removed by remove_tree after the test: pytest's own cleanup (shutil.rmtree) recurses."""
    path = tmp_path / "deep"
    path.mkdir()
    yield path
    tree.remove_tree(path)


def test_a_deep_tree_is_walked_to_the_depth_limit_and_says_so(deep_dir):
    tmp_path = deep_dir
    (tmp_path / "top.txt").write_text("top")
    make_chain(tmp_path, DEEP)
    found = tree.list_files(tmp_path)
    assert [f.name for f in found.files] == ["top.txt"] and found.too_deep and not found.too_many
    shallow = tree.list_files(tmp_path, max_depth=DEEP + 1)
    assert len(shallow.files) == 2 and not shallow.too_deep
    bottom = next(f for f in shallow.files if f.name.endswith("leaf.txt"))
    assert len(bottom.name) > 4096 and tree.read_file(tmp_path, bottom.parts) == b""


def test_a_wide_tree_is_walked_without_running_out_of_descriptors_and_the_entry_limit_holds(tmp_path):
    for i in range(3000):  # more directories than the default descriptor limit (1024)
        (tmp_path / f"d{i:04}").mkdir()
        (tmp_path / f"d{i:04}" / "f").write_bytes(b"x")
    found = tree.list_files(tmp_path)
    assert len(found.files) == 3000 and not found.too_many
    capped = tree.list_files(tmp_path, max_entries=1000)
    assert capped.too_many and len(capped.files) < 1000


def test_names_that_are_not_utf8_are_escaped(tmp_path):
    os.mkdir(os.path.join(os.fsencode(tmp_path), b"dir\xff"))
    with open(os.path.join(os.fsencode(tmp_path), b"dir\xff", b"caf\xe9.txt"), "wb") as f:
        f.write(b"bytes")
    found = tree.list_files(tmp_path)
    assert [f.name for f in found.files] == ["dir\\xff/caf\\xe9.txt"] == found.escaped
    json.dumps(found.escaped).encode("utf-8")  # what every layer above has to do with a name
    assert tree.read_file(tmp_path, found.files[0].parts) == b"bytes"


def test_remove_tree_removes_any_depth(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    make_chain(ws, DEEP)
    (ws / "link").symlink_to(tmp_path)  # removed as a link, never followed
    os.mkdir(ws / "locked")
    os.chmod(ws / "locked", 0)
    tree.remove_tree(ws)
    assert os.listdir(tmp_path) == []


def test_a_workspace_reports_tree_limits_and_escaped_names(tmp_path):
    ws = Workspace(tmp_path / "ws", 16, None, None, use_tmpfs=False)
    ws.create()
    make_chain(ws.path, tree.MAX_DEPTH + 5)
    with open(os.path.join(os.fsencode(ws.path), b"r\xe9sum\xe9.txt"), "wb") as f:
        f.write(b"cv")
    got = ws.collect({}, cap_bytes=1 << 20)
    assert got.files == {"r\\xe9sum\\xe9.txt": b"cv"} and got.escaped == ["r\\xe9sum\\xe9.txt"]
    assert got.limits == ["tree_depth"]
    ws.destroy()
    assert not ws.path.exists()


JOB = f"""
import os
open(b"caf\\xe9.txt", "wb").write(b"latin-1 name")
os.mkdir(b"d\\xff")
open(b"d\\xff/x.txt", "wb").write(b"in a bad dir")
open("ok.txt", "w").write("fine")
for _ in range({DEEP}):
    os.mkdir("deep")
    os.chdir("deep")
open("leaf.txt", "w").write("too deep to return")
"""


def test_a_sandboxed_job_with_bad_names_and_a_deep_tree_returns_a_result(sandbox):
    result = sandbox.run(["python3", "-c", JOB], profile="python")
    assert result.exit_code == 0, result.stderr
    assert result.files == {"caf\\xe9.txt": b"latin-1 name", "d\\xff/x.txt": b"in a bad dir", "ok.txt": b"fine"}
    assert sorted(result.files_escaped) == ["caf\\xe9.txt", "d\\xff/x.txt"]
    assert "tree_depth" in result.limits_hit


def test_the_code_tool_saves_escaped_names_and_reports_the_depth_limit(sandbox, tmp_path):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    ctx = dataclasses.replace(ToolContext("run", "call", "key", workspace=workspace), sandbox=sandbox)
    result = call(python_tool(), {"code": JOB}, ctx)
    assert "limits hit: tree_depth" in result.content
    assert "caf\\xe9.txt" in result.data["files_saved"]
    json.dumps(result.data, ensure_ascii=False).encode("utf-8")  # journaled as is: no lone surrogate anywhere
    assert (workspace / "caf\\xe9.txt").read_bytes() == b"latin-1 name"
