"""One job's process tree: started behind a gate, captured with a byte cap, waited on with a deadline, killed whole.

The gate is a tiny `sh` that blocks reading a line from its stdin until the launcher has moved it into the job's
cgroup, so no instruction of the job ever runs outside its limits (`preexec_fn` would do this too, but is unsafe
in a threaded server). `read` takes a pipe byte by byte, so whatever follows the line is the job's own stdin.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Callable, Literal, Optional

from mainspring.sandbox.cgroups import RunCgroup

GATE = 'IFS= read -r _ || exit 125; exec "$@"'
READ_CHUNK = 1 << 16
# the limits the launcher itself enforces by killing the job; each is also a result.KilledBy
LauncherKill = Literal["wall_time", "output", "cancelled"]


@dataclass
class Capture:
    limit: int
    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False


@dataclass
class Exit:
    returncode: int
    wall_s: float
    cpu_s: float  # from the kernel's rusage of the tree (waited descendants)
    max_rss: int  # bytes, largest single process
    reason: Optional[LauncherKill]  # why the launcher killed it, None if it did not
    stdout: Capture
    stderr: Capture


class JobProcess:
    def __init__(self, argv: list[str], *, env: dict[str, str], cwd: str, pass_fds: tuple[int, ...],
                 uid: int | None, cgroup: RunCgroup | None, output_limit: int, stdin: bytes | None):
        self.cgroup = cgroup
        self._reason: Optional[LauncherKill] = None
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(  # user/group/extra_groups None: keep the launcher's own ids
            ["/bin/sh", "-c", GATE, "gate", *argv], env=env, cwd=cwd, pass_fds=pass_fds,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            user=uid, group=uid, extra_groups=[] if uid is not None else None,
        )
        assert self.proc.stdin is not None, "Popen(stdin=PIPE) always opens the pipe"
        self._stdin_pipe: IO[bytes] = self.proc.stdin  # the gate's "go" line, then the job's stdin
        self._stdin = stdin or b""
        self.stdout, self.stderr = Capture(output_limit), Capture(output_limit)

    def start(self) -> None:
        """Move the gate into the cgroup, then let it exec the job."""
        try:
            if self.cgroup:
                self.cgroup.attach(self.proc.pid)
            os.write(self._stdin_pipe.fileno(), b"go\n")
        except BaseException:
            self.kill("cancelled")
            raise
        self._started = time.monotonic()

    def wait(self, wall_s: float, cancel: threading.Event | None = None) -> Exit:
        threads = [threading.Thread(target=self._drain, args=(self.proc.stdout, self.stdout), daemon=True),
                   threading.Thread(target=self._drain, args=(self.proc.stderr, self.stderr), daemon=True)]
        threads.append(threading.Thread(target=self._feed, daemon=True))
        for t in threads:
            t.start()
        waited: dict = {}
        waiter = threading.Thread(target=self._wait4, args=(waited,), daemon=True)
        waiter.start()
        deadline = self._started + wall_s
        while waiter.is_alive():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill("wall_time")
                break
            if cancel is not None and cancel.is_set():
                self.kill("cancelled")
                break
            waiter.join(min(remaining, 0.05 if cancel is not None else remaining))
        waiter.join()
        wall = time.monotonic() - self._started
        if self.cgroup:  # anything the job left behind (the pid namespace normally took it down already)
            self.cgroup.kill()
        for t in threads:
            t.join(timeout=5)
        usage = waited.get("rusage")
        return Exit(
            returncode=waited["code"], wall_s=wall,
            cpu_s=(usage.ru_utime + usage.ru_stime) if usage else 0.0,
            max_rss=(usage.ru_maxrss * 1024) if usage else 0,
            reason=self._reason, stdout=self.stdout, stderr=self.stderr,
        )

    def _wait4(self, out: dict) -> None:
        _, status, usage = os.wait4(self.proc.pid, 0)
        out["code"], out["rusage"] = os.waitstatus_to_exitcode(status), usage
        self.proc.returncode = out["code"]  # we reaped it; keep Popen from trying again

    def _drain(self, stream, capture: Capture) -> None:
        fd = stream.fileno()
        while True:
            chunk = os.read(fd, READ_CHUNK)
            if not chunk:
                break
            room = capture.limit - len(capture.data)
            if len(chunk) > room:
                capture.data += chunk[:max(room, 0)]
                capture.truncated = True
                self.kill("output")  # a job printing forever would otherwise run to its wall clock
                break
            capture.data += chunk
        stream.close()

    def _feed(self) -> None:
        try:
            if self._stdin:
                self._stdin_pipe.write(self._stdin)
        except (BrokenPipeError, OSError):
            pass
        finally:
            try:
                self._stdin_pipe.close()
            except OSError:
                pass

    def kill(self, reason: LauncherKill) -> None:
        with self._lock:
            if self._reason is None:
                self._reason = reason
        if self.cgroup:
            self.cgroup.kill()
        try:  # bwrap's init dies with it (--die-with-parent), and the pid namespace with the init
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def run_job(argv: list[str], *, env: dict[str, str], cwd: str, pass_fds: tuple[int, ...], uid: int | None,
            cgroup: RunCgroup | None, output_limit: int, stdin: bytes | None, wall_s: float,
            cancel: threading.Event | None = None, on_start: Callable[[], None] | None = None) -> Exit:
    job = JobProcess(argv, env=env, cwd=cwd, pass_fds=pass_fds, uid=uid, cgroup=cgroup,
                     output_limit=output_limit, stdin=stdin)
    job.start()
    if on_start:
        on_start()
    return job.wait(wall_s, cancel)
