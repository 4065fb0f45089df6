"""The mounts the root launcher makes in the host's mount namespace: a job's tmpfs workspace, and read-only binds
that bridge the project runtime to a job's uid (see runtime.py)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 16384
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: bytes | None, target: Path, fstype: bytes | None, flags: int, data: bytes | None,
           what: str) -> None:
    if _libc.mount(source, os.fsencode(target), fstype, flags, data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount_tmpfs(target: Path, options: str) -> None:
    _mount(b"tmpfs", target, b"tmpfs", MS_NOSUID | MS_NODEV, options.encode(), f"mount tmpfs on {target}")


def bind_read_only(source: str | Path, target: Path) -> None:
    """Bind `source` (and the mounts below it) on `target`, read-only; a bind takes its flags only from a remount."""
    _mount(os.fsencode(source), target, None, MS_BIND | MS_REC, None, f"bind {source} on {target}")
    try:
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None,
               f"remount {target} read-only")
    except OSError:
        detach(target)
        raise


def detach(target: Path) -> bool:
    """Lazily unmount `target`; False when nothing was mounted there (or it cannot be unmounted)."""
    return _libc.umount2(os.fsencode(target), MNT_DETACH) == 0
