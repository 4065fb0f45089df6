"""What this host offers for isolation, and how the project's Python runtime is shown inside a sandbox."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from mainspring.sandbox.cgroups import CgroupLayout
from mainspring.sandbox.seccomp import SeccompUnavailable, deny_list_bpf
from mainspring.sandbox.shim import landlock_abi

SYSTEM_PYTHON = "/usr/bin/python3"


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


@dataclass
class RuntimeMounts:
    """Read-only binds that make the project's Python packages importable inside a sandbox."""
    binds: list[tuple[str, str]] = field(default_factory=list)  # (host path, sandbox path)
    path_prefix: list[str] = field(default_factory=list)
    problem: str | None = None  # why the runtime cannot be shown (profiles that need it refuse to run)


def others_can_read(path: Path) -> bool:
    """Whether a uid with no relation to the owner can traverse to `path` and read it."""
    path = path.resolve()
    try:
        for parent in reversed(path.parents):
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return bool(mode & stat.S_IROTH) and (not stat.S_ISDIR(mode) or bool(mode & stat.S_IXOTH))


@lru_cache(maxsize=1)
def _system_python_site() -> tuple[tuple[int, int], str] | None:
    """(version, first site directory) of the host's /usr/bin/python3."""
    try:
        out = subprocess.run(
            [SYSTEM_PYTHON, "-I", "-c", "import site, sys; print(*sys.version_info[:2], site.getsitepackages()[0])"],
            capture_output=True, text=True, timeout=30,
        ).stdout.split()
        return (int(out[0]), int(out[1])), out[2]
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def runtime_mounts(unprivileged_uid: bool) -> RuntimeMounts:
    """How to show this interpreter's packages (and the mainspring package) to a sandbox.

    When the interpreter is readable by the sandbox's uid, it is bound at its own path. A root-owned
    interpreter under /root (pyenv) is not; then the venv's site-packages is bound over the system
    python's site directory, which works when the minor versions match.
    """
    mounts = RuntimeMounts()
    readable = (lambda p: others_can_read(Path(p))) if unprivileged_uid else (lambda p: True)
    purelib = sysconfig.get_paths()["purelib"]
    in_venv = sys.prefix != sys.base_prefix
    if not sys.base_prefix.startswith("/usr") and readable(sys.base_prefix) and readable(sys.prefix):
        mounts.binds.append((sys.base_prefix, sys.base_prefix))
        if in_venv:
            mounts.binds.append((sys.prefix, sys.prefix))
        mounts.path_prefix.append(str(Path(sys.prefix) / "bin"))
    elif sys.base_prefix.startswith("/usr") and not in_venv:
        pass  # the system interpreter: /usr is already there
    else:
        system = _system_python_site()
        if system is None:
            mounts.problem = f"{SYSTEM_PYTHON} is unusable, and {sys.base_prefix} is not readable by sandbox uids"
        elif system[0] != sys.version_info[:2]:
            mounts.problem = (f"{sys.base_prefix} is not readable by sandbox uids and {SYSTEM_PYTHON} is "
                              f"{system[0][0]}.{system[0][1]}, not {sys.version_info[0]}.{sys.version_info[1]}")
        elif not readable(purelib) or not Path(system[1]).is_dir():
            mounts.problem = f"{purelib} cannot be shown at {system[1]}"
        else:
            mounts.binds.append((purelib, system[1]))
    package = Path(__file__).resolve().parent.parent
    if not package.is_relative_to(purelib) and readable(package):  # an editable install: bind the source
        mounts.binds.append((str(package), str(package)))
    return mounts
