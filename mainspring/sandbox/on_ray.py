"""Sandbox jobs placed on a Ray cluster (`MAINSPRING_RAY_COMPUTE` includes "sandbox").

`RaySandbox.run` has `Sandbox.run`'s contract; the job itself runs in a Ray task, inside that node's own
sandbox (the same layers: bubblewrap, cgroups, seccomp, Landlock, as that host has them), with the profile
resolved here and the workspace files sent along. Each job asks Ray for its profile's CPUs and memory, so Ray
places it where they are free. The result says where it ran (`Result.placement`). Cancelling kills the Ray
worker, and with it the job (bubblewrap dies with its parent).
"""

from __future__ import annotations

import threading
from typing import Any, Mapping

from mainspring.cluster import remote_tasks
from mainspring.config import Settings
from mainspring.sandbox.profiles import MIB, Profile
from mainspring.sandbox.result import Result
from mainspring.sandbox.sandbox import Command, Sandbox
from mainspring.sandbox.workspace import FileData

_node_sandboxes: dict[str, Sandbox] = {}  # in a Ray worker: one sandbox per settings, kept between jobs
_lock = threading.Lock()


def _node_sandbox(settings: dict[str, Any]) -> Sandbox:
    key = repr(sorted(settings.items()))
    with _lock:
        if key not in _node_sandboxes:
            _node_sandboxes[key] = Sandbox(Settings(**settings))
        return _node_sandboxes[key]


def run_on_node(settings: dict[str, Any], command: Command, files: dict[str, FileData], profile: Profile,
                stdin: bytes | None) -> Result:
    """The Ray task: one job in this node's sandbox."""
    result = _node_sandbox(settings).run(command, files, profile, stdin=stdin)
    result.placement = remote_tasks.placement()
    return result


class RaySandbox(Sandbox):
    """A `Sandbox` whose jobs run on the Ray cluster; everything else (profiles, slots as admission reads them)
    is this process's."""

    def prepare(self) -> None:
        """Nothing to check here: each node checks its own host before its first job."""
        self._prepared = True

    def run(self, command: Command, files: Mapping[str, FileData] | None = None, profile: str | Profile = "python",
            *, stdin: bytes | str | None = None, cancel: threading.Event | None = None) -> Result:
        prof = self.profile(profile)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        ref = remote_tasks.submit(run_on_node, self.settings.model_dump(mode="json"), command, dict(files or {}),
                                  prof, data, num_cpus=prof.cpus,
                                  memory_mb=max(1, prof.memory_bytes // MIB))
        try:
            return remote_tasks.wait(ref, cancel)
        except remote_tasks.TaskCancelled:
            return Result(exit_code=-9, stdout="", stderr="", killed_by="cancelled", profile=prof.name)
