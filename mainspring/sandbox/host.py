"""What this host offers for isolation."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from mainspring.sandbox.cgroups import CgroupLayout
from mainspring.sandbox.runtime import SYSTEM_PYTHON
from mainspring.sandbox.seccomp import SeccompUnavailable, deny_list_bpf
from mainspring.sandbox.shim import landlock_abi


@dataclass
class Host:
    bwrap: str | None
    bwrap_version: tuple[int, ...]
    is_root: bool
    cgroups: CgroupLayout
    landlock_abi: int
    seccomp_error: str | None
    system_python: str | None

    @classmethod
    def detect(cls, bwrap: str = "") -> "Host":
        path = bwrap or shutil.which("bwrap")
        version: tuple[int, ...] = ()
        if path:
            try:
                out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
                version = tuple(int(x) for x in out.split()[-1].split("."))
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                path = None
        try:
            deny_list_bpf()
            seccomp_error = None
        except SeccompUnavailable as exc:
            seccomp_error = str(exc)
        return cls(
            bwrap=path, bwrap_version=version, is_root=os.geteuid() == 0, cgroups=CgroupLayout.detect(),
            landlock_abi=landlock_abi(), seccomp_error=seccomp_error,
            system_python=SYSTEM_PYTHON if os.access(SYSTEM_PYTHON, os.X_OK) else None,
        )

    def missing(self) -> list[str]:
        """What prevents isolation; empty when jobs can be isolated."""
        problems = []
        if not self.bwrap:
            problems.append("bubblewrap is not installed (Debian: apt-get install bubblewrap)")
        elif self.bwrap_version < (0, 5):
            problems.append(f"bubblewrap {'.'.join(map(str, self.bwrap_version))} is too old (need 0.5 or later)")
        if self.seccomp_error:
            problems.append(self.seccomp_error)
        if not self.system_python:
            problems.append(f"{SYSTEM_PYTHON} is missing (the in-sandbox launcher runs on it)")
        return problems

    def weaker_layers(self) -> list[str]:
        """Layers this host lacks; jobs still run isolated, with the fallbacks named here."""
        notes = []
        if not self.is_root:
            notes.append("not root: all jobs share this user's uid (no per-slot uid)")
        if self.landlock_abi == 0:
            notes.append("no Landlock: the filesystem allow-list rests on bubblewrap's mounts alone")
        if self.bwrap_version and self.bwrap_version < (0, 8):
            notes.append("bubblewrap < 0.8: no --disable-userns (seccomp still denies unshare/clone(CLONE_NEWUSER))")
        for resource in ("memory", "pids", "cpu"):
            if not self.cgroups.home(resource):
                notes.append(f"no {resource} cgroup: falling back to rlimits")
        return notes
