"""The oracle's system-call filter (seccomp, Linux x86-64): what Landlock does not cover, refused by the kernel.

A second red team, having disarmed the audit hook from Python, still got through Landlock (ABI 7) with system
calls it does not mediate: UDP and multipath-TCP sockets, raw and packet sockets (the oracle may run as root), a
``connect`` to a pathname unix socket outside the sandbox, a program written to a ``memfd`` and ``execve``'d, a
``fork``ed grandchild in a session of its own that outlived grading, and ``bpf``. A solution needs none of them:
the oracle answers over the pipes it was started with. So, set after Landlock and before the solution loads:

* no sockets at all (``socket``, ``socketpair``): every network and unix-socket route at once;
* no new processes: ``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD`` (threads stay allowed: Numba's) and
  ``clone3`` (answered ENOSYS, so the C library falls back to ``clone``, whose flags the filter can read);
* no ``execve``/``execveat``, ``memfd_create``, ``bpf``, ``perf_event_open``, ``ptrace``, reading or writing
  another process (``process_vm_*``, ``pidfd_getfd``), ``fanotify_init``, ``open_by_handle_at``, namespaces and
  mounts (``unshare``, ``setns``, ``mount``), ``io_uring_setup``, ``userfaultfd``, the keyring, kernel modules;
* the x32 system-call numbers, and any other architecture's calls, refused outright.

Each refused call fails with EPERM (ENOSYS for ``clone3``), so Python raises ``PermissionError`` the report shows.
"""
from __future__ import annotations

import ctypes
import errno
import platform
import struct
import sys

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
CLONE_THREAD = 0x00010000
# x86-64 system-call numbers (arch/x86/entry/syscalls/syscall_64.tbl)
REFUSED = {"socket": 41, "socketpair": 53, "fork": 57, "vfork": 58, "execve": 59, "ptrace": 101, "mount": 165,
           "init_module": 175, "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272,
           "perf_event_open": 298, "fanotify_init": 300, "open_by_handle_at": 304, "setns": 308,
           "process_vm_readv": 310, "process_vm_writev": 311, "finit_module": 313, "memfd_create": 319,
           "bpf": 321, "execveat": 322, "userfaultfd": 323, "io_uring_setup": 425, "pidfd_getfd": 438}
CLONE, CLONE3 = 56, 435
# <linux/seccomp.h>, <linux/filter.h>
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
RET_ALLOW, RET_ERRNO, RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
LD_ABS_W, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
NR_OFFSET, ARCH_OFFSET, ARG0_OFFSET = 0, 4, 16  # struct seccomp_data: nr, arch, instruction_pointer, args[6]


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]


def program() -> list[tuple[int, int, int, int]]:
    """The classic-BPF filter as (code, jt, jf, k) instructions: the architecture, then each refused number."""
    deny, enosys = RET_ERRNO | errno.EPERM, RET_ERRNO | errno.ENOSYS
    code = [(LD_ABS_W, 0, 0, ARCH_OFFSET), (JEQ_K, 1, 0, AUDIT_ARCH_X86_64), (RET_K, 0, 0, RET_KILL_PROCESS),
            (LD_ABS_W, 0, 0, NR_OFFSET), (JGE_K, 0, 1, X32_SYSCALL_BIT), (RET_K, 0, 0, deny)]
    for number in sorted(REFUSED.values()):
        code += [(JEQ_K, 0, 1, number), (RET_K, 0, 0, deny)]
    code += [(JEQ_K, 0, 1, CLONE3), (RET_K, 0, 0, enosys),
             (JEQ_K, 0, 3, CLONE), (LD_ABS_W, 0, 0, ARG0_OFFSET),  # clone's flags (their low 32 bits)
             (JSET_K, 1, 0, CLONE_THREAD), (RET_K, 0, 0, deny),  # a new process: refused; a thread: on
             (RET_K, 0, 0, RET_ALLOW)]
    return code


def restrict() -> str:
    """Install the filter on this process (and its threads to come), for good. Returns what was done, for the
    report, or why nothing was."""
    # the interpreter's calls, not the kernel's (uname): a 32-bit Python on an x86-64 kernel makes i386 calls, which
    # the filter's architecture test would kill
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64") or sys.maxsize <= 2**32:
        return (f"no seccomp: the filter is written for 64-bit Linux x86-64, not {platform.system()} "
                f"{platform.machine()} ({8 * struct.calcsize('P')}-bit Python)")
    libc = ctypes.CDLL(None, use_errno=True)
    instructions = program()
    filters = (SockFilter * len(instructions))(*(SockFilter(*op) for op in instructions))
    fprog = SockFprog(len(instructions), filters)
    if libc.prctl(ctypes.c_int(PR_SET_NO_NEW_PRIVS), ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                  ctypes.c_ulong(0)) != 0:
        return f"no seccomp: no_new_privs failed ({errno.errorcode.get(ctypes.get_errno(), '?')})"
    if libc.prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog),
                  ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        return f"no seccomp: installing the filter failed ({errno.errorcode.get(ctypes.get_errno(), '?')})"
    return "seccomp"


__all__ = ["program", "restrict", "REFUSED"]
