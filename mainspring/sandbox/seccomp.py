"""The seccomp deny-list handed to bubblewrap (`--seccomp FD`): syscalls a job has no business making.

Default allow, so ordinary programs (compilers, pytest, Mesa) work unchanged; what is denied is the kernel
surface used to escape or to reach the host: tracing, mounting, new namespaces, keyrings, BPF, io_uring,
and every socket family but AF_UNIX (the network namespace is empty anyway; this is a second wall).
"""

from __future__ import annotations

import errno
import os
import socket
from functools import lru_cache

EPERM_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount",
    "open_tree", "mount_setattr", "unshare", "setns",
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
    "swapon", "swapoff", "syslog", "acct", "quotactl", "quotactl_fd", "ioperm", "iopl",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "open_by_handle_at", "name_to_handle_at", "lookup_dcookie", "vhangup", "nfsservctl", "uselib",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
)
# one rule per flag: a single MASKED_EQ over the union only matches when *all* bits are set
CLONE_NEW_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x00000080)
TIOCSTI, TIOCLINUX = 0x5412, 0x541C


class SeccompUnavailable(RuntimeError):
    pass


@lru_cache(maxsize=1)
def deny_list_bpf() -> bytes:
    """The compiled BPF program (built once per process; ~1 KB)."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError) as exc:  # OSError: the libseccomp shared library is missing
        raise SeccompUnavailable(f"libseccomp is not usable ({exc}); install the Debian package libseccomp2") from exc

    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)

    def deny(err: int, name: str, *args) -> None:
        try:
            f.add_rule(seccomp.ERRNO(err), name, *args)
        except (ValueError, RuntimeError, OSError):
            pass  # a syscall this libseccomp does not know cannot be called by name on this arch either

    for name in EPERM_SYSCALLS:
        deny(errno.EPERM, name)
    for flag in CLONE_NEW_FLAGS:
        deny(errno.EPERM, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    deny(errno.ENOSYS, "clone3")  # its flags live in memory, out of seccomp's reach; glibc falls back to clone
    for request in (TIOCSTI, TIOCLINUX):
        deny(errno.EPERM, "ioctl", seccomp.Arg(1, seccomp.EQ, request))
    for name in ("socket", "socketpair"):
        deny(errno.EAFNOSUPPORT, name, seccomp.Arg(0, seccomp.NE, socket.AF_UNIX))

    with os.fdopen(os.memfd_create("mainspring-seccomp-build", os.MFD_CLOEXEC), "w+b") as buf:
        f.export_bpf(buf)
        buf.seek(0)
        return buf.read()


def bpf_fd() -> int:
    """A readable fd holding the program, for `bwrap --seccomp FD` (bwrap reads it to the end)."""
    program = deny_list_bpf()
    fd = os.memfd_create("mainspring-seccomp", os.MFD_CLOEXEC)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
