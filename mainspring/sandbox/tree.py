"""A job's directory tree, read back and removed without recursion, links or trust in its file names.

A job controls its workspace's shape: a directory chain thousands deep overflows a recursive walk (os.walk,
shutil.rmtree) and its paths outgrow PATH_MAX, and its file names are bytes that need not be UTF-8 (Python hands
them over as lone surrogates, which every encoder downstream refuses). So the walk here is iterative and opens
each level relative to its parent (openat, never following a link), stops at `MAX_DEPTH` levels and
`MAX_ENTRIES` entries (saying so), and names each file with its undecodable bytes escaped (`b\\xff.txt`).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Tuple

MAX_DEPTH = 64  # directory levels below the workspace that are read back
MAX_ENTRIES = 20_000  # files and directories looked at (a tmpfs workspace holds 16384 inodes)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class TreeFile:
    name: str  # '/'-separated, relative; bytes that are not UTF-8 escaped as \xNN
    parts: tuple[str, ...]  # the real components (os.fsdecode'd), to open it again
    size: int


@dataclass
class Tree:
    files: list[TreeFile] = field(default_factory=list)
    escaped: list[str] = field(default_factory=list)  # names of files whose real name was not UTF-8
    too_deep: bool = False  # some directory was deeper than MAX_DEPTH and not entered
    too_many: bool = False  # the walk stopped at MAX_ENTRIES


def shown_name(parts: tuple[str, ...]) -> str:
    """The components joined by '/', bytes that are not UTF-8 as \\xNN: always encodable."""
    return os.fsencode("/".join(parts)).decode("utf-8", "backslashreplace")


class _Entries(Protocol):
    """What os.scandir returns (its class is private): entries, and a close that frees the descriptor now."""

    def __next__(self) -> os.DirEntry[str]: ...

    def close(self) -> None: ...


_Level = Tuple[int, _Entries, Tuple[str, ...]]  # a directory's descriptor, its entries, its path


def list_files(root: Path, max_depth: int = MAX_DEPTH, max_entries: int = MAX_ENTRIES) -> Tree:
    """The regular files under `root` (links and special files are left out), depth first. Open are only the
    directories on the current path (two descriptors a level), however wide the tree."""
    tree = Tree()
    seen = 0
    root_fd = os.open(root, _DIR_FLAGS)
    try:
        levels: list[_Level] = [(root_fd, os.scandir(root_fd), ())]
    except OSError:
        os.close(root_fd)
        raise
    try:
        while levels:
            fd, entries, parts = levels[-1]
            try:
                entry = next(entries, None)
            except OSError:
                entry = None
            if entry is None:
                _close_level(levels.pop())
                continue
            seen += 1
            if seen > max_entries:
                tree.too_many = True
                break
            here = parts + (entry.name,)
            try:
                if entry.is_dir(follow_symlinks=False):
                    if len(here) > max_depth:
                        tree.too_deep = True
                        continue
                    child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                    try:
                        levels.append((child, os.scandir(child), here))
                    except OSError:
                        os.close(child)
                elif entry.is_file(follow_symlinks=False):
                    size = entry.stat(follow_symlinks=False).st_size
                    name = shown_name(here)
                    if name != "/".join(here):
                        tree.escaped.append(name)
                    tree.files.append(TreeFile(name, here, size))
            except OSError:  # gone, or not ours to read: left out
                continue
    finally:
        for level in reversed(levels):
            _close_level(level)
    return tree


def _close_level(level: _Level) -> None:
    level[1].close()
    os.close(level[0])


def read_file(root: Path, parts: tuple[str, ...]) -> bytes | None:
    """The content of the regular file `root/parts...`, opened level by level without following a link;
    None if it is gone, a link, or not a regular file."""
    fds: list[int] = []
    try:
        fds.append(os.open(root, _DIR_FLAGS))
        for part in parts[:-1]:
            fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fds[-1])
        fds.append(fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    except OSError:
        return None
    finally:
        for fd in fds:
            os.close(fd)


def remove_tree(root: Path) -> None:
    """`rm -rf root`, at any depth, without following links; gives up quietly on an error (as
    shutil.rmtree(ignore_errors=True), which recurses). One descriptor open at a time: it climbs back by '..'."""
    try:
        fd = os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        return
    except OSError:  # a link or a file where the directory was
        try:
            os.unlink(root)
        except OSError:
            pass
        return
    pending: list[list[str]] = []  # per level: its subdirectories still to remove
    path: list[str] = []  # from root down to fd's directory
    try:
        while True:
            try:
                os.fchmod(fd, 0o700)  # a job may leave a directory we cannot list or empty
            except OSError:
                pass
            subdirs = []
            with os.scandir(fd) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        subdirs.append(entry.name)
                    else:
                        os.unlink(entry.name, dir_fd=fd)
            pending.append(subdirs)
            while not pending[-1]:  # this level is empty: remove it and go up
                pending.pop()
                if not path:
                    os.close(fd)
                    fd = -1
                    os.rmdir(root)
                    return
                parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = parent
                os.rmdir(path.pop(), dir_fd=fd)
            name = pending[-1].pop()
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
            path.append(name)
    except OSError:
        return
    finally:
        if fd >= 0:
            os.close(fd)
