"""`Sandbox.run(command, files, profile) -> Result`: untrusted code, isolated, limited, accounted.

Layers, outermost first: a per-slot unprivileged host uid (when we are root), a cgroup (memory, pids, CPU),
bubblewrap (every namespace, no network, read-only /usr, tmpfs workspace), a seccomp deny-list, and Landlock
applied inside by the shim together with the rlimits. See ../../shared/notes/sandbox.md for the why.
"""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import logging
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

from mainspring.config import Settings, get_settings
from mainspring.sandbox.bwrap import Mounts, bwrap_argv, shim_argv, write_etc
from mainspring.sandbox.cgroups import CgroupLayout, RunCgroup, remove_stale
from mainspring.sandbox.errors import SandboxError, SandboxUnavailable
from mainspring.sandbox.host import Host
from mainspring.sandbox.process import Exit, run_job
from mainspring.sandbox.profiles import MIB, Profile, load_profiles
from mainspring.sandbox.result import KilledBy, Result
from mainspring.sandbox.runtime import RuntimeMounts, RuntimeStage, remove_stage, runtime_mounts
from mainspring.sandbox.seccomp import bpf_fd
from mainspring.sandbox.workspace import FileData, Workspace

log = logging.getLogger("mainspring.sandbox")
Command = Union[str, Sequence[str]]
FATAL_SIGNALS = {signal.SIGKILL, signal.SIGXCPU, signal.SIGXFSZ, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS,
                 signal.SIGILL, signal.SIGFPE, signal.SIGTERM, signal.SIGPIPE}


class Sandbox:
    """Runs jobs isolated; thread-safe; up to `sandbox_slots` at once (more wait for a slot)."""

    def __init__(self, settings: Settings | None = None):
        self.settings = settings or get_settings()
        self.profiles: dict[str, Profile] = load_profiles(self.settings.sandbox_profiles_file)
        self.insecure = self.settings.sandbox_insecure_local
        self.root = Path(self.settings.sandbox_dir)
        self.slots = self.settings.sandbox_slots
        self._executor = ThreadPoolExecutor(max_workers=self.slots, thread_name_prefix="sandbox")
        self._ids = itertools.count()
        self._prepare_lock = threading.Lock()
        self._prepared = False
        self.host: Host | None = None
        self.runtime = RuntimeMounts()
        self.cgroups = CgroupLayout()

    # ---- setup -------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Check the host and lay out the shared files once; raises SandboxUnavailable with what is missing."""
        with self._prepare_lock:
            if self._prepared:
                return
            host = self.host = Host.detect(self.settings.sandbox_bwrap)
            problems = host.missing()
            if problems and not self.insecure:
                raise SandboxUnavailable(
                    "cannot isolate jobs on this host: " + "; ".join(problems)
                    + ". (For development only, MAINSPRING_SANDBOX_INSECURE_LOCAL=1 runs jobs without isolation.)")
            self._lay_out_root(host)
            self.runtime = runtime_mounts(unprivileged_uid=host.is_root)
            self.cgroups = self._usable_cgroups() if not self.insecure else CgroupLayout()
            self._prepared = True
        if not self.insecure:
            probe = self.run(["/bin/true"], profile="shell")
            if probe.exit_code != 0:
                with self._prepare_lock:
                    self._prepared = False
                raise SandboxUnavailable(f"bubblewrap cannot start a sandbox here (are user namespaces "
                                         f"disabled?): {probe.stderr.strip() or f'exit {probe.exit_code}'}")

    def _lay_out_root(self, host: Host) -> None:
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        if host.is_root:
            os.chown(self.root, 0, 0)
            os.chmod(self.root, 0o711)
            parent_ok = all(os.stat(p).st_mode & 0o001 for p in self.root.resolve().parents)
            if not parent_ok:
                raise SandboxUnavailable(f"sandbox uids cannot reach {self.root}: set MAINSPRING_SANDBOX_DIR "
                                         "to a directory whose parents are world-traversable (e.g. under /tmp)")
        for sub in ("ws", "slots", "rt"):
            (self.root / sub).mkdir(mode=0o711, exist_ok=True)
        write_etc(self.root / "etc")
        shim = self.root / "shim.py"
        source = Path(__file__).with_name("shim.py").read_bytes()
        if not shim.exists() or shim.read_bytes() != source:
            tmp = shim.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(source)
            os.chmod(tmp, 0o644)
            tmp.replace(shim)
        self._remove_stale_runs()

    def _remove_stale_runs(self) -> None:
        """Workspaces and runtime stages left by launcher processes that died mid-run."""
        def dead(run_dir: Path) -> bool:
            owner = run_dir.name.split("-", 1)[0]
            return owner.isdigit() and not Path(f"/proc/{owner}").exists()

        for ws in filter(dead, (self.root / "ws").iterdir()):
            Workspace(ws, 0, None, None, use_tmpfs=os.path.ismount(ws)).destroy()
        for stage in filter(dead, (self.root / "rt").iterdir()):
            remove_stage(stage)

    def _usable_cgroups(self) -> CgroupLayout:
        layout = CgroupLayout.detect()
        try:
            remove_stale(layout)
            probe = RunCgroup(layout, f"{os.getpid()}-probe")
            probe.create(64 * MIB, 16, 1.0)
            probe.remove()
            return layout
        except OSError as exc:
            log.warning("sandbox: cgroups not writable (%s); memory and pids fall back to rlimits", exc)
            return CgroupLayout()

    # ---- running -----------------------------------------------------------------------------------
    def profile(self, name: str | Profile) -> Profile:
        if isinstance(name, Profile):
            return name
        try:
            return self.profiles[name]
        except KeyError:
            raise SandboxError(f"unknown sandbox profile {name!r}; known: {', '.join(sorted(self.profiles))}") from None

    def run(self, command: Command, files: Mapping[str, FileData] | None = None, profile: str | Profile = "python", *,
            stdin: bytes | str | None = None, cancel: threading.Event | None = None) -> Result:
        """Run `command` (argv list, or a string for `sh -c`) in a fresh sandbox with `files` in its workspace."""
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else [str(c) for c in command]
        if not argv or not argv[0]:
            raise SandboxError("empty command")
        prof = self.profile(profile)
        if not self._prepared:
            self.prepare()
        if prof.runtime and self.runtime.problem and not self.insecure:
            raise SandboxUnavailable(f"profile {prof.name!r} needs the project's Python runtime: "
                                     f"{self.runtime.problem}")
        data = stdin.encode() if isinstance(stdin, str) else stdin
        slot, lock_fd = self._acquire_slot()
        try:
            return self._run_in_slot(slot, argv, dict(files or {}), prof, data, cancel)
        finally:
            os.close(lock_fd)  # releases the flock

    async def arun(self, command: Command, files: Mapping[str, FileData] | None = None,
                   profile: str | Profile = "python", *,
                   stdin: bytes | str | None = None) -> Result:
        """`run` for asyncio; cancelling the awaiting task kills the job."""
        cancel = threading.Event()
        future = asyncio.get_running_loop().run_in_executor(
            self._executor, partial(self.run, command, files, profile, stdin=stdin, cancel=cancel))
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            cancel.set()
            raise

    def _acquire_slot(self) -> tuple[int, int]:
        """A slot (and so a host uid) no other job on this host holds: flock works across threads and processes."""
        delay = 0.002
        while True:
            for slot in range(self.slots):
                fd = os.open(self.root / "slots" / f"{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return slot, fd
                except BlockingIOError:
                    os.close(fd)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def slot_uid(self, slot: int) -> int | None:
        return self.settings.sandbox_uid_base + slot if self.host and self.host.is_root and not self.insecure else None

    def _run_in_slot(self, slot: int, argv: list[str], files: dict[str, FileData], prof: Profile,
                     stdin: bytes | None, cancel: threading.Event | None) -> Result:
        host = self.host
        if host is None:  # run() prepares first; a caller that skipped it gets told, not an AttributeError
            raise SandboxError("the sandbox is not prepared: call prepare() before running in a slot")
        run_id = f"{os.getpid()}-{slot}-{next(self._ids)}"
        uid = self.slot_uid(slot)
        workspace = Workspace(self.root / "ws" / run_id, prof.workspace_mb, uid, uid,
                              use_tmpfs=host.is_root and not self.insecure)
        cgroup = RunCgroup(self.cgroups, run_id) if self.cgroups.home("memory") or self.cgroups.home("pids") else None
        # a slot uid may not traverse to the runtime (a checkout under a 0700 home): bridge it (runtime.py)
        bridged = prof.runtime and bool(self.runtime.binds)
        stage = RuntimeStage(self.root / "rt" / run_id, uid) if uid is not None and bridged else None
        workspace.create()
        seccomp = [-1]  # our copy closes once the job has started; the child holds its own

        def close_seccomp() -> None:
            if seccomp[0] >= 0:
                os.close(seccomp[0])
                seccomp[0] = -1

        try:
            inputs = workspace.write_inputs(files)
            if cgroup:
                cgroup.create(prof.memory_bytes, prof.pids, prof.cpus)
            by_rlimit = cgroup is None or not cgroup.limits_memory
            binds = stage.bind(self.runtime.binds) if stage else self.runtime.binds
            mounts = Mounts(self.root / "etc", self.root / "shim.py", binds, self.runtime.path_prefix)
            if self.insecure:
                log.warning("sandbox: INSECURE_LOCAL run, not isolated: %s", argv)
                job_argv = shim_argv(prof, host.system_python or "python3", mounts, argv, by_rlimit,
                                     landlock=False, shim_path=str(mounts.shim))
                env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(workspace.path), "LANG": "C.UTF-8",
                       "TMPDIR": str(workspace.path), **prof.env}
                pass_fds: tuple[int, ...] = ()
            else:
                if host.bwrap is None or host.system_python is None:  # prepare() refused such a host already
                    raise SandboxUnavailable("cannot isolate jobs on this host: " + "; ".join(host.missing()))
                seccomp[0] = bpf_fd()
                inner = shim_argv(prof, host.system_python, mounts, argv, by_rlimit)
                job_argv = bwrap_argv(host.bwrap, host.bwrap_version, prof, workspace.path, mounts, seccomp[0], inner)
                env = {"PATH": "/usr/bin:/bin"}  # bwrap's own init keeps this environment: nothing secret in it
                pass_fds = (seccomp[0],)
            exit = run_job(job_argv, env=env, cwd=str(workspace.path), pass_fds=pass_fds, uid=uid, cgroup=cgroup,
                           output_limit=prof.output_bytes, stdin=stdin, wall_s=prof.wall_s, cancel=cancel,
                           on_start=close_seccomp)
            return self._result(exit, prof, cgroup, workspace, inputs)
        finally:
            close_seccomp()
            if cgroup:
                cgroup.kill()
                cgroup.remove()
            if stage:
                stage.remove()
            workspace.destroy()

    def _result(self, exit: Exit, prof: Profile, cgroup: RunCgroup | None, workspace: Workspace,
                inputs: dict[str, bytes]) -> Result:
        code = exit.returncode
        if code > 128 and any(code - 128 == s for s in FATAL_SIGNALS):
            code = -(code - 128)  # bwrap reports a job killed by signal N as 128+N, like a shell
        stats = cgroup.stats() if cgroup else None
        cpu_s = stats.cpu_s if stats and stats.cpu_s else exit.cpu_s
        # only a memory cgroup measures the job alone: rusage's max RSS counts the launcher's forked copy
        peak = stats.peak_memory if stats and cgroup and cgroup.limits_memory else 0
        out = workspace.collect(inputs, prof.collect_mb * MIB)
        limits: list[str] = list(out.limits)
        if stats and stats.pids_refused:
            limits.append("pids")
        if code == -signal.SIGXFSZ or out.largest >= prof.file_size_mb * MIB:
            limits.append("file_size")
        killed_by: KilledBy | None = exit.reason
        if killed_by is None and stats and stats.oom_kills:
            killed_by = "memory"
        elif killed_by is None and (code == -signal.SIGXCPU or (code == -signal.SIGKILL and cpu_s >= prof.cpu_s)):
            killed_by = "cpu_time"
        elif killed_by is None and code == -signal.SIGXFSZ:
            killed_by = "file_size"
        if killed_by:
            limits.append(killed_by)
        return Result(
            exit_code=code, stdout=exit.stdout.data.decode(errors="replace"),
            stderr=exit.stderr.data.decode(errors="replace"), killed_by=killed_by, cpu_s=round(cpu_s, 4),
            wall_s=round(exit.wall_s, 4), peak_memory=peak, files=out.files, files_omitted=out.omitted,
            files_escaped=out.escaped, limits_hit=sorted(set(limits)), stdout_truncated=exit.stdout.truncated,
            stderr_truncated=exit.stderr.truncated, profile=prof.name, insecure=self.insecure,
        )

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


_shared: Optional[Sandbox] = None


def get_sandbox() -> Sandbox:
    """The process-wide sandbox for the configured settings."""
    global _shared
    if _shared is None:
        settings = get_settings()
        if "sandbox" in settings.ray_compute:  # jobs placed on the Ray cluster, each in its node's sandbox
            from mainspring.cluster.ray_cluster import connect
            from mainspring.sandbox.on_ray import RaySandbox

            connect(settings)
            _shared = RaySandbox(settings)
        else:
            _shared = Sandbox(settings)
    return _shared
