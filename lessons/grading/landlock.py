"""The oracle's kernel-enforced sandbox: Linux Landlock (Linux 5.13+), set by the oracle on itself before the
student's code is read, for good: no Python code that runs afterwards can lift it.

Why a second layer under :func:`lessons.grading.oracle.lock_down`'s audit hook: an audit hook is not a security
boundary (PEP 578 says so). Its state is Python objects, and Python code can reach them: a red team rewrote the
hook's closure cells through ``gc``, swapped ``os.fsdecode`` for a function that shows the hook a harmless path,
and emptied the module's set of refused events to start a shell. Landlock is checked by the kernel at every open
and exec, on the file's real place in the hierarchy:

* read: only beneath the directories :func:`read_roots` names (the project copy, the working directory, the
  Python installation, the system's directories), each less the paths refused (the repository, its packages
  wherever they are installed, other runs' temporary files), plus a few device and ``/proc`` files;
* write: only beneath the working directory;
* execute: nothing (no ``execve``: no shell, whatever the audit hook's state);
* TCP: no bind, no connect (Landlock ABI 4+); signals and abstract sockets outside the sandbox: none (ABI 6+).

The rules are paths opened with ``O_PATH`` and given to three system calls through ctypes (before the audit hook,
which refuses ctypes). Where the kernel has no Landlock (an older kernel, another OS, a container that masks it)
:func:`restrict` says why and the audit hook is the only layer: the grade report says which (``sandbox``).
"""
from __future__ import annotations

import ctypes
import os
import sys

# <linux/landlock.h>
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH = 1
SYSCALLS = {"create_ruleset": 444, "add_rule": 445, "restrict_self": 446}  # the same on every architecture
PR_SET_NO_NEW_PRIVS = 38
FS = {"execute": 1 << 0, "write_file": 1 << 1, "read_file": 1 << 2, "read_dir": 1 << 3, "remove_dir": 1 << 4,
      "remove_file": 1 << 5, "make_char": 1 << 6, "make_dir": 1 << 7, "make_reg": 1 << 8, "make_sock": 1 << 9,
      "make_fifo": 1 << 10, "make_block": 1 << 11, "make_sym": 1 << 12, "refer": 1 << 13, "truncate": 1 << 14,
      "ioctl_dev": 1 << 15}
FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}  # ABI 4 adds only TCP
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
READ_DIR = FS["read_file"] | FS["read_dir"]
READ_FILE = FS["read_file"]
# files a solution may read outside the roots (the devices the audit hook allows; /proc: what Python and NumPy read)
READ_WRITE_FILES = ("/dev/null", "/dev/zero", "/dev/full")
READ_FILES = ("/dev/urandom", "/dev/random", "/proc/cpuinfo", "/proc/meminfo", "/proc/stat")


# /proc rules: procfs makes a new inode each time a name is looked up again after its dentry is evicted (memory
# pressure), and a Landlock rule belongs to the inode: the rule's O_PATH descriptor stays open, for the process's
# life, so the entry it names stays the one granted (closing it let /proc/self and /proc/cpuinfo fail at random)
_PINNED: list[int] = []


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)) in the kernel's header: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def read_roots(allowed: tuple[str, ...], refused: tuple[str, ...]) -> list[str]:
    """The directories and files beneath which reading is granted: each of ``allowed``, except that an allowed
    directory holding a refused path (a repository inside /usr, the project's packages in site-packages) is
    replaced by its entries, recursively, less the refused ones. Landlock only grants, so a refused path inside a
    granted one has to be cut out this way. A named root inside a refused path stays granted (the project copy
    inside the temporary root). All paths absolute and real."""
    roots: list[str] = []

    def grant(path: str, cut: tuple[str, ...]) -> None:
        # ``cut``: the refused paths that apply beneath this root. A named root inside a refused path is granted
        # with everything beneath it but what is refused inside it (the project copy in the temporary root, a
        # virtual environment in /tmp or inside the repository); an entry found by expanding a directory is not
        if any(_inside(path, gone) for gone in cut):
            return
        if not any(_inside(gone, path) and gone != path for gone in cut):
            roots.append(path)
            return
        try:
            entries = sorted(os.scandir(path), key=lambda entry: entry.name)
        except OSError:
            return
        for entry in entries:
            if not entry.is_symlink():  # a link is granted where it points, if anywhere
                grant(entry.path, cut)

    for path in dict.fromkeys(allowed):  # once each, in order
        if os.path.exists(path):
            grant(path, tuple(gone for gone in refused if not (_inside(path, gone) and gone != path)))
    return [root for root in roots if not any(root != other and _inside(root, other) for other in roots)]


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (not Linux, too old, disabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(ctypes.c_long(SYSCALLS["create_ruleset"]), None, ctypes.c_size_t(0),
                           ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(int(version), 0)


def restrict(read: list[str], write: tuple[str, ...]) -> str:
    """Confine this process (and any it could start) for good: reading beneath ``read`` (directories or files),
    writing beneath ``write``, executing nothing, no TCP, no signals out. Returns what was done, for the report
    ("landlock ABI 7"), or why nothing was ("no landlock: ...")."""
    version = abi_version()
    if version == 0:
        return "no landlock: the kernel does not offer it"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    handled = FS_BY_ABI[max(v for v in FS_BY_ABI if v <= version)]
    attr = RulesetAttr(handled_access_fs=handled,
                       handled_access_net=(NET_BIND_TCP | NET_CONNECT_TCP) if version >= 4 else 0,
                       scoped=(SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if version >= 6 else 0)
    size = 8 if version < 4 else 16 if version < 6 else 24
    ruleset = libc.syscall(ctypes.c_long(SYSCALLS["create_ruleset"]), ctypes.byref(attr), ctypes.c_size_t(size),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        return f"no landlock: creating the ruleset failed ({os.strerror(ctypes.get_errno())})"
    everything_but_execute = handled & ~FS["execute"]
    file_rights = FS["execute"] | FS["write_file"] | FS["read_file"] | FS["truncate"] | FS["ioctl_dev"]
    try:
        rules = [(path, READ_DIR if os.path.isdir(path) else READ_FILE) for path in read]
        rules += [(path, everything_but_execute) for path in write]
        rules += [(path, READ_FILE | FS["write_file"]) for path in READ_WRITE_FILES]
        rules += [(path, READ_FILE) for path in READ_FILES]
        rules.append((f"/proc/{os.getpid()}", READ_DIR))
        for path, access in rules:
            if not os.path.isdir(path):
                access &= file_rights  # a file takes file rights only (EINVAL otherwise)
            access &= handled
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # absent here (/dev/full in a container): nothing to grant
            try:
                rule = PathBeneathAttr(allowed_access=access, parent_fd=fd)
                if libc.syscall(ctypes.c_long(SYSCALLS["add_rule"]), ctypes.c_int(ruleset),
                                ctypes.c_int(RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                    return f"no landlock: a rule for {path} failed ({os.strerror(ctypes.get_errno())})"
            finally:
                if path == "/proc" or path.startswith("/proc/"):
                    _PINNED.append(fd)
                else:
                    os.close(fd)
        if libc.prctl(ctypes.c_int(PR_SET_NO_NEW_PRIVS), ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                      ctypes.c_ulong(0)) != 0:
            return f"no landlock: no_new_privs failed ({os.strerror(ctypes.get_errno())})"
        if libc.syscall(ctypes.c_long(SYSCALLS["restrict_self"]), ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            return f"no landlock: restricting failed ({os.strerror(ctypes.get_errno())})"
    finally:
        os.close(ruleset)
    return f"landlock ABI {version}"


__all__ = ["read_roots", "restrict", "abi_version"]
