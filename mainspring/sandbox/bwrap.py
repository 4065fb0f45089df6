"""The bubblewrap command line for one job: an empty root with read-only /usr, a private /proc, /dev and /tmp,
the workspace, and nothing else of the host."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mainspring.sandbox.profiles import Profile

WORKSPACE = "/workspace"
SHIM = "/.mainspring/shim.py"
SANDBOX_UID = 1000
# host /etc files a job may see (all harmless); passwd, group, hosts and nsswitch.conf are our own
HOST_ETC = ("ld.so.cache", "alternatives", "localtime", "mime.types")
ETC_FILES = {
    "passwd": "root:x:0:0:root:/:/usr/sbin/nologin\n"
              f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:{WORKSPACE}:/bin/sh\n"
              "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "group": f"root:x:0:\nsandbox:x:{SANDBOX_UID}:\nnogroup:x:65534:\n",
    "hosts": "127.0.0.1 localhost\n::1 localhost\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
}


@dataclass
class Mounts:
    """Host-side paths the command line refers to."""
    etc_dir: Path  # our generated /etc files
    shim: Path
    runtime_binds: list[tuple[str, str]]
    path_prefix: list[str]


def write_etc(directory: Path) -> None:
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    for name, content in ETC_FILES.items():
        path = directory / name
        if not path.exists() or path.read_text() != content:
            path.write_text(content)
            os.chmod(path, 0o644)


def root_symlinks() -> list[str]:
    """Merged-/usr hosts link /bin, /lib, … into /usr; mirror those links (others are bound read-only)."""
    args = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    return args


def bwrap_argv(bwrap: str, version: tuple[int, ...], profile: Profile, workspace: Path, mounts: Mounts,
               seccomp_fd: int, shim_argv: list[str]) -> list[str]:
    path = ":".join([*mounts.path_prefix, "/usr/local/bin", "/usr/bin", "/bin"])
    env = {"PATH": path, "HOME": WORKSPACE, "TMPDIR": "/tmp", "LANG": "C.UTF-8", "USER": "sandbox",
           **profile.env}
    argv = [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox", "--clearenv"]
    if version >= (0, 8):
        argv.append("--disable-userns")
    for key, value in env.items():
        argv += ["--setenv", key, value]
    argv += ["--ro-bind", "/usr", "/usr", *root_symlinks(), "--dir", "/etc"]
    for name in ETC_FILES:
        argv += ["--ro-bind", str(mounts.etc_dir / name), f"/etc/{name}"]
    for name in HOST_ETC:
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    tmp_size = str(profile.tmp_mb << 20)
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", tmp_size, "--tmpfs", "/tmp",
             "--size", tmp_size, "--tmpfs", "/dev/shm"]
    if profile.egl:
        argv += ["--dev-bind-try", "/dev/dri", "/dev/dri"]
    if profile.runtime:
        for source, dest in mounts.runtime_binds:
            argv += ["--ro-bind", source, dest]
    argv += ["--ro-bind", str(mounts.shim), SHIM, "--bind", str(workspace), WORKSPACE, "--chdir", WORKSPACE,
             "--seccomp", str(seccomp_fd), "--remount-ro", "/", "--", *shim_argv]
    return argv


def shim_argv(profile: Profile, python: str, mounts: Mounts, command: list[str], limit_memory_by_rlimit: bool,
              landlock: bool = True, shim_path: str = SHIM, workspace: str = WORKSPACE) -> list[str]:
    """`python3 -I -S shim.py` with the profile's rlimits and Landlock allow-list, then the job's command."""
    argv = [python, "-I", "-S", shim_path, "--cpu", str(profile.cpu_s), "--fsize", str(profile.file_size_mb << 20),
            "--nofile", str(profile.open_files), "--nproc", str(profile.pids)]
    if limit_memory_by_rlimit:
        argv += ["--as", str(profile.memory_bytes)]
    if not landlock:
        return [*argv, "--landlock", "off", "--", *command]
    read_only = ["/usr", "/etc", "/proc", *(dest for _, dest in mounts.runtime_binds if profile.runtime)]
    read_write = [workspace, "/tmp", "/dev"]
    argv += ["--ls", "/"]  # the root holds only what bwrap mounted: listing it shows nothing of the host
    for path in read_only:
        argv += ["--ro", path]
    for path in read_write:
        argv += ["--rw", path]
    return [*argv, "--", *command]
