"""In-sandbox launcher: resource limits, then Landlock, then exec the job.

Runs as `python3 -I -S shim.py [options] -- COMMAND...` inside bubblewrap, after bwrap has built the mount
tree (a Landlock-restricted process can no longer mount, so this has to come last). Standard library only:
it is copied next to the sandbox's /etc files and runs under the host's /usr/bin/python3, not the project venv.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import signal
import sys
from collections.abc import Sequence

# x86_64 / aarch64 share these numbers (generic syscall table)
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

# filesystem rights by the ABI that introduced them
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_ABI1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FILE_ONLY = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1

READ_ONLY = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is absent or disabled."""
    abi = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(abi, 0)


def _handled_fs(abi: int) -> int:
    rights = FS_ABI1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def apply_landlock(read_only: Sequence[str], read_write: Sequence[str], list_only: Sequence[str] = ()) -> int:
    """Allow-list the filesystem, deny TCP and scope signals/abstract sockets; returns the ABI used (0 = none)."""
    abi = landlock_abi()
    if abi == 0:
        return 0
    handled = _handled_fs(abi)
    attr = _RulesetAttr(handled_access_fs=handled)
    size = 8
    if abi >= 4:  # no TCP port is allowed, so bind and connect are denied outright
        attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP
        size = 16
    if abi >= 6:  # cannot signal or reach abstract sockets of processes outside the sandbox's domain
        attr.scoped = SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL
        size = 24
    ruleset = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for paths, access in ((list_only, FS_READ_DIR), (read_only, READ_ONLY), (read_write, handled)):
            for path in paths:
                _add_path(ruleset, path, access & handled)
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return abi


def _add_path(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # optional mounts (e.g. /dev/dri) may be absent
    try:
        if not os.path.isdir(path):
            access &= FILE_ONLY
        rule = _PathBeneath(allowed_access=access, parent_fd=fd)
        if _libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}) failed")
    finally:
        os.close(fd)


def set_limits(cpu_s: int, address_space: int, file_size: int, open_files: int, processes: int) -> None:
    """Lower this process's rlimits (inherited by the job); 0 leaves one unchanged."""
    def lower(which: int, value: int, hard: int | None = None) -> None:
        soft_now, hard_now = resource.getrlimit(which)
        hard = value if hard is None else hard
        if hard_now != resource.RLIM_INFINITY:
            hard = min(hard, hard_now)
        resource.setrlimit(which, (min(value, hard), hard))

    if cpu_s:  # SIGXCPU at the soft limit, SIGKILL one second later
        lower(resource.RLIMIT_CPU, cpu_s, cpu_s + 1)
    if address_space:
        lower(resource.RLIMIT_AS, address_space)
    if file_size:
        lower(resource.RLIMIT_FSIZE, file_size)
    if open_files:
        lower(resource.RLIMIT_NOFILE, open_files)
    if processes:
        lower(resource.RLIMIT_NPROC, processes)
    lower(resource.RLIMIT_CORE, 0)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sandbox-shim")
    parser.add_argument("--cpu", type=int, default=0)
    parser.add_argument("--as", dest="address_space", type=int, default=0)
    parser.add_argument("--fsize", type=int, default=0)
    parser.add_argument("--nofile", type=int, default=0)
    parser.add_argument("--nproc", type=int, default=0)
    parser.add_argument("--ro", action="append", default=[])
    parser.add_argument("--rw", action="append", default=[])
    parser.add_argument("--ls", action="append", default=[], help="directories that may be listed, not read")
    parser.add_argument("--landlock", choices=["off", "try"], default="try")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("sandbox: no command given", file=sys.stderr)
        return 2
    set_limits(args.cpu, args.address_space, args.fsize, args.nofile, args.nproc)
    if args.landlock == "try":
        apply_landlock(args.ro, args.rw, args.ls)
    # Python ignores SIGPIPE and SIGXFSZ, and ignored signals survive exec: give the job the defaults back
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvp(command[0], command)
    except FileNotFoundError:
        print(f"sandbox: command not found: {command[0]}", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"sandbox: permission denied: {command[0]}", file=sys.stderr)
        return 126
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
