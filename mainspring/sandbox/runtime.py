"""How the project's Python runtime (interpreter, site-packages, the mainspring package) is shown inside a sandbox.

A job sees the runtime read-only at the same paths as the host, so a venv's absolute links (bin/python to the
base interpreter, an editable install's finder) resolve inside. bwrap resolves a bind's source as the uid that
runs it, and when the launcher is root that is the job's slot uid, which may not traverse the runtime's parents
(a checkout under a 0700 home, or `mktemp -d`). So the root launcher first binds each runtime path under the
run's stage directory, which only the slot uid may enter, and bwrap binds from there.
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from mainspring.sandbox.mounts import bind_read_only, detach

SYSTEM_PYTHON = "/usr/bin/python3"
log = logging.getLogger("mainspring.sandbox")


@dataclass
class RuntimeMounts:
    """Read-only binds that make the project's Python packages importable inside a sandbox."""
    binds: list[tuple[str, str]] = field(default_factory=list)  # (host path, sandbox path)
    path_prefix: list[str] = field(default_factory=list)
    problem: str | None = None  # why the runtime cannot be shown (profiles that need it refuse to run)


def others_may_read(path: Path) -> bool:
    """Whether a uid with no relation to the owner may read `path` itself; its parents are bridged by a stage."""
    try:
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

    An interpreter the sandbox's uid may read is bound at its own path. One it may not (a root-only pyenv)
    is replaced by the host's /usr/bin/python3 with the venv's site-packages bound over its site directory,
    which works when the minor versions match.
    """
    mounts = RuntimeMounts()
    readable = (lambda p: others_may_read(Path(p))) if unprivileged_uid else (lambda p: True)
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


class RuntimeStage:
    """One run's bridge to the runtime: read-only binds under `directory`, which only the job's `uid` may enter."""

    def __init__(self, directory: Path, uid: int):
        self.directory, self.uid = directory, uid

    def bind(self, binds: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The same binds with each host path replaced by its bridge under the stage."""
        self.directory.mkdir(mode=0o700)
        staged = []
        try:
            for index, (source, dest) in enumerate(binds):
                target = self.directory / str(index)
                if os.path.isdir(source):
                    target.mkdir(mode=0o700)
                else:
                    target.touch(mode=0o600)
                bind_read_only(source, target)
                staged.append((str(target), dest))
            os.chown(self.directory, self.uid, self.uid)
            os.chmod(self.directory, 0o500)
        except BaseException:
            self.remove()
            raise
        return staged

    def remove(self) -> None:
        remove_stage(self.directory)


def remove_stage(directory: Path) -> None:
    """Unmount and remove a stage; never deletes through a mount: an entry goes only once nothing is mounted there."""
    if not directory.exists():
        return
    for entry in directory.iterdir():
        detach(entry)  # os.path.ismount cannot tell a bind from the same filesystem: always try
        try:
            entry.rmdir() if entry.is_dir() else entry.unlink()
        except OSError as exc:  # still mounted: leave it rather than delete what it shows
            log.warning("sandbox: runtime stage %s not removed: %s", entry, exc)
    try:
        directory.rmdir()
    except OSError as exc:
        log.warning("sandbox: runtime stage %s not removed: %s", directory, exc)
