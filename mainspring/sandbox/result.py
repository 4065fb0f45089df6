"""What a sandboxed job produced and which limit, if any, stopped it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

KilledBy = Literal["wall_time", "cpu_time", "memory", "output", "file_size", "cancelled"]


@dataclass
class Result:
    exit_code: int  # negative: killed by that signal
    stdout: str
    stderr: str
    killed_by: Optional[KilledBy] = None
    cpu_s: float = 0.0
    wall_s: float = 0.0
    peak_memory: int = 0  # bytes, from the memory cgroup; 0 (unknown) on hosts without one
    files: dict[str, bytes] = field(default_factory=dict)  # new or changed workspace files
    files_omitted: list[str] = field(default_factory=list)  # over the profile's collect_mb cap
    files_escaped: list[str] = field(default_factory=list)  # names that were not UTF-8, returned with \xNN escapes
    # limits that refused something: "pids", "file_size", …; "tree_depth" / "tree_entries": files deeper than
    # sandbox.tree.MAX_DEPTH levels or past its MAX_ENTRIES entries were not read back
    limits_hit: list[str] = field(default_factory=list)
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    profile: str = ""
    insecure: bool = False  # ran under MAINSPRING_SANDBOX_INSECURE_LOCAL, without isolation
    placement: str = ""  # where it ran: "" here, "ray:<node>:<pid>" on a Ray worker (sandbox/on_ray.py)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.killed_by is None
