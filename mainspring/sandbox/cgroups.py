"""One cgroup per sandboxed job: memory, pids and CPU limits, accounting, and a kill that reaches every process.

Hosts come in three layouts and all three are handled: cgroup v1 (a mount per controller), pure v2 (one
unified tree) and hybrid (v1 controllers plus a v2 tree with no controllers, still useful for `cgroup.kill`).
Each resource goes to whichever tree serves it.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

BASE = "mainspring-sandbox"
CPU_PERIOD_US = 100_000


@dataclass
class CgroupLayout:
    v1: dict[str, Path] = field(default_factory=dict)  # controller -> directory of this process's cgroup
    v2: Path | None = None  # the unified tree's mount
    v2_controllers: frozenset[str] = frozenset()

    @classmethod
    def detect(cls) -> "CgroupLayout":
        own = _own_cgroups()
        layout = cls()
        try:
            mounts = Path("/proc/self/mounts").read_text().splitlines()
        except OSError:
            return layout
        for line in mounts:
            parts = line.split()
            if len(parts) < 4:
                continue
            mountpoint, fstype, options = Path(parts[1]), parts[2], set(parts[3].split(","))
            if fstype == "cgroup":
                for controller in ("memory", "pids", "cpu", "cpuacct") :
                    if controller in options:
                        layout.v1[controller] = mountpoint / own.get(controller, "").lstrip("/")
            elif fstype == "cgroup2" and layout.v2 is None:
                layout.v2 = mountpoint
                try:
                    layout.v2_controllers = frozenset((mountpoint / "cgroup.controllers").read_text().split())
                except OSError:
                    pass
        return layout

    def home(self, resource: str) -> tuple[int, Path] | None:
        """(version, parent directory) of the tree that serves a resource, or None."""
        if resource in self.v1:
            return 1, self.v1[resource] / BASE
        v2_name = "cpu" if resource == "cpuacct" else resource
        if self.v2 is not None and (resource in ("kill", "cpuacct") or v2_name in self.v2_controllers):
            return 2, self.v2 / BASE
        return None

    def describe(self) -> str:
        served = {r: self.home(r) for r in ("memory", "pids", "cpu", "cpuacct", "kill")}
        return ", ".join(f"{r}: v{h[0]}" if h else f"{r}: none" for r, h in served.items())


def _own_cgroups() -> dict[str, str]:
    """controller -> this process's cgroup path (v1 lines of /proc/self/cgroup)."""
    own: dict[str, str] = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(","):
                if controller:
                    own[controller] = path
    except (OSError, ValueError):
        pass
    return own


@dataclass
class CgroupStats:
    peak_memory: int = 0
    oom_kills: int = 0
    pids_refused: int = 0
    cpu_s: float = 0.0


class RunCgroup:
    """The cgroup(s) of one job. `create` sets the limits; `attach` moves a process in before it runs the job."""

    def __init__(self, layout: CgroupLayout, name: str):
        self.dirs: dict[str, tuple[int, Path]] = {}
        for resource in ("memory", "pids", "cpu", "cpuacct", "kill"):
            home = layout.home(resource)
            if home:
                self.dirs[resource] = (home[0], home[1] / name)
        self._v2_controllers = layout.v2_controllers

    @property
    def limits_memory(self) -> bool:
        return "memory" in self.dirs

    def create(self, memory_bytes: int, pids: int, cpus: float) -> None:
        for version, path in set(self.dirs.values()):
            if version == 2:
                self._enable_v2_controllers(path.parent)
            path.mkdir(parents=True, exist_ok=True)
        quota = max(1000, int(cpus * CPU_PERIOD_US))
        if "memory" in self.dirs:
            version, path = self.dirs["memory"]
            if version == 1:
                _write(path / "memory.limit_in_bytes", memory_bytes)
                _write_if_present(path / "memory.memsw.limit_in_bytes", memory_bytes)  # no escape into swap
            else:
                _write(path / "memory.max", memory_bytes)
                _write_if_present(path / "memory.swap.max", 0)
        if "pids" in self.dirs:
            _write(self.dirs["pids"][1] / "pids.max", pids)
        if "cpu" in self.dirs:
            version, path = self.dirs["cpu"]
            if version == 1:
                _write(path / "cpu.cfs_period_us", CPU_PERIOD_US)
                _write(path / "cpu.cfs_quota_us", quota)
            else:
                _write(path / "cpu.max", f"{quota} {CPU_PERIOD_US}")

    def _enable_v2_controllers(self, parent: Path) -> None:
        wanted = [c for c in ("memory", "pids", "cpu") if c in self._v2_controllers]
        if not wanted:
            return
        parent.mkdir(parents=True, exist_ok=True)
        for directory in (parent.parent, parent):  # the mount root, then our base
            _write_if_present(directory / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))

    def attach(self, pid: int) -> None:
        for _, path in set(self.dirs.values()):
            _write(path / "cgroup.procs", pid)

    def stats(self) -> CgroupStats:
        stats = CgroupStats()
        if "memory" in self.dirs:
            version, path = self.dirs["memory"]
            if version == 1:
                stats.peak_memory = _read_int(path / "memory.max_usage_in_bytes")
                stats.oom_kills = _read_key(path / "memory.oom_control", "oom_kill")
            else:
                stats.peak_memory = _read_int(path / "memory.peak") or _read_int(path / "memory.current")
                stats.oom_kills = _read_key(path / "memory.events", "oom_kill")
        if "pids" in self.dirs:
            stats.pids_refused = _read_key(self.dirs["pids"][1] / "pids.events", "max")
        if "cpuacct" in self.dirs:
            version, path = self.dirs["cpuacct"]
            if version == 1:
                stats.cpu_s = _read_int(path / "cpuacct.usage") / 1e9
            else:
                stats.cpu_s = _read_key(path / "cpu.stat", "usage_usec") / 1e6
        return stats

    def pids(self) -> set[int]:
        found: set[int] = set()
        for _, path in set(self.dirs.values()):
            try:
                found.update(int(p) for p in (path / "cgroup.procs").read_text().split())
            except OSError:
                pass
        return found

    def kill(self) -> None:
        """SIGKILL every process in the job, however it forked or double-forked."""
        if "kill" in self.dirs and self.dirs["kill"][0] == 2:
            _write_if_present(self.dirs["kill"][1] / "cgroup.kill", 1)
        for _ in range(50):  # v1 has no cgroup.kill: sweep until empty (pids.max bounds the races)
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.002)

    def remove(self) -> None:
        for _, path in set(self.dirs.values()):
            for attempt in range(100):  # a killed task leaves the cgroup a moment after it dies
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if attempt == 20:
                        self.kill()
                    time.sleep(0.005)


def remove_stale(layout: CgroupLayout) -> int:
    """Remove job cgroups left by launchers that died (names start with the launcher's pid)."""
    removed = 0
    for resource in ("memory", "pids", "cpu", "cpuacct", "kill"):
        home = layout.home(resource)
        if not home or not home[1].is_dir():
            continue
        for child in home[1].iterdir():
            owner = child.name.split("-", 1)[0]
            if child.is_dir() and owner.isdigit() and not Path(f"/proc/{owner}").exists():
                group = RunCgroup(layout, child.name)
                group.kill()
                group.remove()
                removed += 1
    return removed


def _write(path: Path, value: object) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def _write_if_present(path: Path, value: object) -> None:
    try:
        _write(path, value)
    except (FileNotFoundError, PermissionError, OSError):
        pass


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _read_key(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0
