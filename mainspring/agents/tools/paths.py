"""Paths a model names, kept inside the run's workspace.

A model (or text it read) may try `../../etc/passwd`, `/etc/passwd`, or a symlink planted to point outside; every
path the workspace tools touch goes through `workspace_path`, and writes open with O_NOFOLLOW so a link swapped in
at the last moment is not followed either.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from mainspring.agents.tools.base import ToolError


def workspace_path(workspace: Path, name: str, *, allow_root: bool = False) -> Path:
    """`workspace/name` after checking `name` is relative, has no `..`, and resolves (links too) inside."""
    if not isinstance(name, str) or "\x00" in name:
        raise ToolError(f"bad path {name!r}")
    text = name.strip()
    pure = PurePosixPath(text) if text else PurePosixPath(".")
    if pure.is_absolute() or text.startswith("~"):
        raise ToolError(f"path {name!r} must be relative to the workspace (no leading '/' or '~')")
    if ".." in pure.parts:
        raise ToolError(f"path {name!r} must not contain '..'")
    root = Path(os.path.realpath(workspace))
    target = root.joinpath(*pure.parts)
    resolved = Path(os.path.realpath(target))
    if resolved != root and root not in resolved.parents:
        raise ToolError(f"path {name!r} resolves outside the workspace (through a symbolic link)")
    if resolved == root and not allow_root:
        raise ToolError("a file path is needed here, not the workspace itself")
    return target


def relative_name(workspace: Path, path: Path) -> str:
    """`path` as the model sees it: relative to the workspace, with '/' separators."""
    return Path(os.path.relpath(path, os.path.realpath(workspace))).as_posix()


def write_file_nofollow(path: Path, data: bytes) -> None:
    """Write `data` to `path`, creating parents, never following a link at the final component."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
