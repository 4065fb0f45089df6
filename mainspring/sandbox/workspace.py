"""A job's workspace: a size-limited tmpfs owned by the job's uid; inputs copied in, results copied out.

The launcher is root and the job is not, so everything read back is read without following links:
a job that leaves `out.txt -> /etc/shadow` gets nothing of the host's. The tree is walked by `tree.py`:
iteratively, within depth and entry limits, with file names that are not UTF-8 escaped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Mapping, Union

from mainspring.sandbox.errors import SandboxError
from mainspring.sandbox.mounts import detach, mount_tmpfs
from mainspring.sandbox.tree import list_files, read_file, remove_tree

FileData = Union[bytes, str]


def safe_relpath(name: str) -> str:
    """A workspace-relative path, or SandboxError for absolute paths, '..' and the like."""
    if not name or "\x00" in name:
        raise SandboxError(f"bad input file name {name!r}")
    path = PurePosixPath(name)
    if path.is_absolute() or any(part in ("..", "") for part in path.parts) or path.parts[0] == ".":
        raise SandboxError(f"input file {name!r} must be a relative path inside the workspace")
    return str(path)


@dataclass
class Collected:
    """What `Workspace.collect` read back."""

    files: dict[str, bytes] = field(default_factory=dict)  # new or changed regular files
    omitted: list[str] = field(default_factory=list)  # over the byte cap (or a second file of one escaped name)
    escaped: list[str] = field(default_factory=list)  # names that were not UTF-8, as returned (\xNN escapes)
    limits: list[str] = field(default_factory=list)  # "tree_depth", "tree_entries": the walk stopped there
    largest: int = 0  # bytes of the largest regular file


class Workspace:
    def __init__(self, path: Path, size_mb: int, uid: int | None, gid: int | None, use_tmpfs: bool):
        self.path, self.size_mb, self.uid, self.gid, self.use_tmpfs = path, size_mb, uid, gid, use_tmpfs
        self.mounted = False

    def create(self) -> None:
        self.path.mkdir(mode=0o700, parents=False, exist_ok=False)
        if self.use_tmpfs:
            owner = f",uid={self.uid},gid={self.gid}" if self.uid is not None else ""
            try:
                mount_tmpfs(self.path, f"size={self.size_mb}m,nr_inodes=16384,mode=0700{owner}")
            except OSError:
                self.path.rmdir()
                raise
            self.mounted = True
        elif self.uid is not None:
            os.chown(self.path, self.uid, self._chown_gid)

    def write_inputs(self, files: Mapping[str, FileData]) -> dict[str, bytes]:
        """Copy the job's inputs in; returns them as bytes by normalised path (to tell outputs from inputs)."""
        written: dict[str, bytes] = {}
        for name, data in files.items():
            rel = safe_relpath(name)
            content = data.encode() if isinstance(data, str) else bytes(data)
            target = self.path / rel
            try:
                self._make_parents(target.parent)
                target.write_bytes(content)
            except OSError as exc:
                raise SandboxError(f"input file {rel!r} cannot be written ({exc.strerror}); "
                                   f"the workspace holds {self.size_mb} MiB") from exc
            os.chmod(target, 0o755 if content.startswith(b"#!") else 0o644)
            self._own(target)
            written[rel] = content
        return written

    def _make_parents(self, directory: Path) -> None:
        missing = []
        while not directory.exists():
            missing.append(directory)
            directory = directory.parent
        for d in reversed(missing):
            d.mkdir(mode=0o755)
            self._own(d)

    def _own(self, path: Path) -> None:
        if self.uid is not None:
            os.chown(path, self.uid, self._chown_gid, follow_symlinks=False)

    @property
    def _chown_gid(self) -> int:
        return -1 if self.gid is None else self.gid  # -1: os.chown leaves the group as it is

    def collect(self, inputs: Mapping[str, bytes], cap_bytes: int) -> Collected:
        """New or changed regular files, in path order, until the byte cap; the rest are named as omitted."""
        tree = list_files(self.path)
        out = Collected(escaped=tree.escaped, largest=max((f.size for f in tree.files), default=0),
                        limits=[name for name, hit in (("tree_depth", tree.too_deep), ("tree_entries", tree.too_many))
                                if hit])
        total = 0
        for f in sorted(tree.files, key=lambda f: f.name):
            content = read_file(self.path, f.parts)
            if content is None or inputs.get(f.name) == content:
                continue
            if total + len(content) > cap_bytes or f.name in out.files:
                out.omitted.append(f.name)
                continue
            out.files[f.name] = content
            total += len(content)
        return out

    def destroy(self) -> None:
        if self.mounted:
            if detach(self.path):
                self.mounted = False
        if not self.mounted:
            remove_tree(self.path)
