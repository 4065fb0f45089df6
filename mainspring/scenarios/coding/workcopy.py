"""The coding run's working copy: the repository copied into the run's workspace, a pristine snapshot beside it,
the task's options, the loop's counters, and the unified diff between the two copies.

    <workspace>/repo/               what the agent's tools see and change (paths are relative to it)
    <workspace>/.coding/snapshot/   the repository as it was when the run started: the diff's left side
    <workspace>/.coding/task.json   TaskOptions (test edits allowed? iteration cap, test ids)
    <workspace>/.coding/state.json  edits since the last test run, iterations, failure signatures, results by
                                    idempotency key (a call re-run after a crash returns its first result)

The user's repository is never written: `mainspring code` prints the diff (and applies it only when asked).
`prepare` makes the copy before the run exists, under the run id it will have, so no tool can run first.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import stat
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from mainspring.agents.tools.base import ToolContext, ToolError
from mainspring.agents.tools.paths import workspace_path, write_file_nofollow
from mainspring.scenarios.coding.repo_map import SKIP_DIRS

REPO, META = "repo", ".coding"
MAX_FILE_BYTES = 1 << 20  # a bigger file is left out of the copy (data, not code to edit)
MAX_COPY_BYTES = 32 << 20  # the sandbox's per-job copy cap (agents/tools/code.py) bounds what tests can see
MAX_COPY_FILES = 2000
MAX_ITERATIONS = 5
_lock = threading.Lock()  # state.json's read-modify-write, across the worker's tool threads


@dataclass
class TaskOptions:
    allow_test_edits: bool = False  # edits to tests/ and test_*.py are refused unless the task allows them
    max_iterations: int = 3  # test runs after edits; 1..MAX_ITERATIONS
    test_ids: list[str] = field(default_factory=list)  # what run_tests runs by default; empty: every test

    def __post_init__(self) -> None:
        if not 1 <= self.max_iterations <= MAX_ITERATIONS:
            raise ValueError(f"max_iterations must be 1..{MAX_ITERATIONS}, not {self.max_iterations}")


def is_test_path(rel: str) -> bool:
    """A test file: under a tests/ or test/ folder, test_*.py, *_test.py or conftest.py."""
    parts = PurePosixPath(rel).parts
    name = parts[-1] if parts else ""
    return (any(p in ("tests", "test") for p in parts[:-1]) or name.startswith("test_")
            or name.endswith("_test.py") or name == "conftest.py")


def copy_repository(source: Path, target: Path) -> list[str]:
    """Copy the repository's regular files (no hidden folders, caches, environments or links); returns what
    was left out and why."""
    left_out, total, count = [], 0, 0
    for here, dirs, names in os.walk(source):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS)
        for name in sorted(names):
            src = Path(here, name)
            rel = src.relative_to(source).as_posix()
            info = os.lstat(src)
            if not stat.S_ISREG(info.st_mode) or name.endswith((".pyc", ".pyo")):
                continue
            if info.st_size > MAX_FILE_BYTES or total + info.st_size > MAX_COPY_BYTES or count >= MAX_COPY_FILES:
                left_out.append(f"{rel} ({info.st_size} bytes)")
                continue
            dst = target / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            total, count = total + info.st_size, count + 1
    target.mkdir(parents=True, exist_ok=True)
    return left_out


def _files(root: Path) -> dict[str, Path]:
    out = {}
    if root.is_dir():
        for here, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in names:
                full = Path(here, name)
                if full.is_file() and not full.is_symlink():
                    out[full.relative_to(root).as_posix()] = full
    return out


def _text_lines(data: bytes) -> list[str] | None:
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def unified_diff(before: Path, after: Path) -> str:
    """`git diff`-style unified diff (a/ b/ prefixes, /dev/null for added or removed files) of two trees."""
    left, right = _files(before), _files(after)
    chunks: list[str] = []
    for rel in sorted(set(left) | set(right)):
        a = left[rel].read_bytes() if rel in left else b""
        b = right[rel].read_bytes() if rel in right else b""
        if a == b and (rel in left) == (rel in right):
            continue
        a_lines, b_lines = _text_lines(a), _text_lines(b)
        if a_lines is None or b_lines is None:
            chunks.append(f"Binary files a/{rel} and b/{rel} differ\n")
            continue
        fromfile = f"a/{rel}" if rel in left else "/dev/null"
        tofile = f"b/{rel}" if rel in right else "/dev/null"
        chunks.append(f"diff --git a/{rel} b/{rel}\n")
        if (rel in left) != (rel in right):  # git apply creates or deletes a file only when the header says so
            path = right[rel] if rel in right else left[rel]
            mode = "100755" if os.access(path, os.X_OK) else "100644"
            chunks.append(f"{'new' if rel in right else 'deleted'} file mode {mode}\n")
        for line in difflib.unified_diff(a_lines, b_lines, fromfile, tofile):
            chunks.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(chunks)


class WorkCopy:
    def __init__(self, workspace: Path):
        self.workspace = Path(workspace)
        self.repo = self.workspace / REPO
        self.meta = self.workspace / META
        self.snapshot = self.meta / "snapshot"

    @classmethod
    def prepare(cls, workspace: Path, source: Path, options: TaskOptions | None = None) -> WorkCopy:
        """Copy `source` in twice (working copy and snapshot) and write the task's options."""
        wc = cls(workspace)
        if wc.repo.exists():
            raise ValueError(f"{wc.repo} exists already: a working copy is prepared once")
        copy_repository(source, wc.snapshot)
        copy_repository(source, wc.repo)
        (wc.meta / "task.json").write_text(json.dumps(asdict(options or TaskOptions())))
        return wc

    @classmethod
    def of_call(cls, ctx: ToolContext) -> WorkCopy:
        """The run's working copy; a run started without one (over HTTP, say) that attached a folder as `docs`
        gets that folder copied in on its first call, with the default options."""
        wc = cls(ctx.workspace)
        if not wc.repo.is_dir():
            source = ctx.attachments.get("docs")
            if not source or not Path(source).is_dir():
                raise ToolError("this run has no repository to work on: start it with `mainspring code`, "
                                "or attach the repository folder as 'docs'")
            with _lock:
                if not wc.repo.is_dir():
                    cls.prepare(ctx.workspace, Path(source))
        return wc

    def options(self) -> TaskOptions:
        path = self.meta / "task.json"
        return TaskOptions(**json.loads(path.read_text())) if path.exists() else TaskOptions()

    def path(self, name: str, *, allow_root: bool = False) -> Path:
        """`name` inside the working copy (no '..', no absolute path, no link out): ToolError otherwise."""
        return workspace_path(self.repo, name, allow_root=allow_root)

    def rel(self, path: Path) -> str:
        return Path(os.path.relpath(path, os.path.realpath(self.repo))).as_posix()

    def write(self, path: Path, text: str) -> None:
        write_file_nofollow(path, text.encode("utf-8"))

    def files(self) -> dict[str, bytes]:
        """Every file of the working copy, for a sandbox job."""
        return {rel: p.read_bytes() for rel, p in sorted(_files(self.repo).items())}

    def diff(self) -> str:
        return unified_diff(self.snapshot, self.repo)

    # ---- the loop's state ------------------------------------------------------------------------------
    def load_state(self) -> dict[str, Any]:
        path = self.meta / "state.json"
        state = json.loads(path.read_text()) if path.exists() else {}
        state.setdefault("edits_since_tests", 0)
        state.setdefault("iterations", 0)
        state.setdefault("signatures", [])
        state.setdefault("calls", {})
        return state

    def save_state(self, state: dict[str, Any]) -> None:
        self.meta.mkdir(parents=True, exist_ok=True)
        tmp = self.meta / f"state.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_text(json.dumps(state, sort_keys=True))
        tmp.replace(self.meta / "state.json")

    @staticmethod
    def lock() -> threading.Lock:
        return _lock
