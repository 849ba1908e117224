"""The sandboxed child of a grading run: it loads the student's file and answers the judge's questions about its
holes with plain data, nothing else (:mod:`lessons.grading.sandbox` starts it, :mod:`lessons.grading.judge` is the judge).

It runs in a temporary working directory, against a read-only copy of the project from which the exercise's own
implementation is stripped, with a scrubbed environment, resource limits and an audit hook installed *before* the
student's code is read (:func:`lock_down`). The hook refuses, for everything that runs after it:

* reading the real repository (any path under it but the Python installation) or another run's temporary files;
* writing anywhere but this run's temporary directory;
* starting processes (fork, exec, spawn, subprocess, os.system) and opening sockets;
* running anything of ctypes (loading a library, calling a function pointer, raw memory), importing cffi.

The protocol: one JSON object a line on stdin, one answer a line on the original stdout (the student's prints go to
stderr). Requests: ``{"id", "op": "hello" | "call" | "trace" | "emit" | "bye", "hole", "args", "arity", "kind"}``;
answers ``{"id", "ok": data}`` or ``{"id", "error": {"type", "message", "traceback"}}``. Nothing the answers say is
trusted: the judge validates every value and builds, runs and checks the kernel itself.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

PROCESS_EVENTS = frozenset({"os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
                            "subprocess.Popen", "pty.spawn", "os.startfile", "socket.__new__", "socket.connect",
                            "socket.bind", "os.kill", "os.killpg", "signal.pthread_kill", "sys.remote_exec"})
# files Python can import or run (a .py written to the working directory and imported, or run with runpy)
IMPORTABLE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyw", ".pth", ".so", ".pyd", ".zip", ".pyz", ".egg", ".whl")
BLOCKED_IMPORTS = frozenset({"cffi", "_cffi_backend", "_posixsubprocess", "socket", "_socket", "multiprocessing",
                             "_multiprocessing"})
# ctypes itself may be imported (NumPy does), but nothing of it may run: every ctypes audit event is refused
# (loading a library, looking up a symbol, calling a function pointer, reading raw memory).
READING_EVENTS = frozenset({"os.listdir", "os.scandir", "os.chdir", "glob.glob", "glob.glob/2"})
# every path argument of these must lie in the working directory (a rename's destination, a copy's target too)
CHANGING_EVENTS = frozenset({"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.truncate",
                             "os.utime", "os.chown", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr",
                             "os.mkfifo", "os.mknod", "shutil.rmtree", "shutil.copytree", "shutil.move",
                             "shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.chown",
                             "shutil.make_archive", "shutil.unpack_archive", "dbm.open", "sqlite3.connect/handle"})
# the trailing arguments of these events that are directory descriptors (-1: none given)
DIR_FD_ARGUMENTS = {"os.rename": 2, "os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.chmod": 1, "os.utime": 1,
                    "os.chown": 1, "os.mkfifo": 1, "os.mknod": 1}
PROTECTED_PACKAGES = ("ptx", "gemm", "lessons", "results", "tests", "tools")
# outside the working directory, the project's sandbox copy and the Python installation: what a solution may read
SYSTEM_DIRS = ("/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc", "/proc", "/sys")
SAFE_DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/full", "/dev/tty"})
LIMITS = {"RLIMIT_CPU": 300, "RLIMIT_AS": 8 << 30, "RLIMIT_FSIZE": 64 << 20, "RLIMIT_NOFILE": 256, "RLIMIT_CORE": 0}


class SandboxViolation(PermissionError):
    """Something the grading sandbox refuses (the message says what)."""


def _refuse_spawn(*args, **kwargs):
    raise SandboxViolation("the grading sandbox refuses starting processes")


def lock_down(workdir: str, copy: str, repository: str, temp_root: str, preload_numba: bool = False) -> str:
    """Resource limits, then Landlock (:mod:`lessons.grading.landlock`: kernel-enforced, where the kernel offers
    it), then the audit hook (irreversible: CPython has no way to remove one). ``subprocess`` is imported first
    (project modules import it) and its unaudited fork primitive disarmed; Popen is audited. ``preload_numba``:
    import Numba and set up its CPU target first (a solution that uses ``@njit``). Returns the sandbox's layers, as
    the grade report states them."""
    import resource
    import subprocess  # noqa: F401 - loaded before the hook, so importing it later is no import event
    import _posixsubprocess
    _posixsubprocess.fork_exec = _refuse_spawn
    try:  # NumPy loads shared libraries through ctypes at import: before the hook refuses ctypes
        import numpy  # noqa: F401
    except ImportError:
        pass
    if preload_numba:  # llvmlite loads its library, and @njit sets up the CPU target, through ctypes too
        try:
            import numba
            from numba import cuda  # noqa: F401
            from numba.core.registry import cpu_target
            cpu_target.target_context  # noqa: B018 - the target's setup, done here, not under the hook
        except Exception:  # noqa: BLE001 - without Numba the solution's own import reports it
            pass
    for name, value in LIMITS.items():
        which = getattr(resource, name, None)
        if which is not None:
            try:
                soft, hard = resource.getrlimit(which)
                value = value if hard == resource.RLIM_INFINITY else min(value, hard)
                resource.setrlimit(which, (value, value))
            except (ValueError, OSError):
                pass
    real = os.path.realpath
    workdir, copy, repository, temp_root = (real(p) for p in (workdir, copy, repository, temp_root))
    python_dirs = tuple(sorted({real(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}))

    own_proc = f"/proc/{os.getpid()}"
    # where this interpreter imports from (a user site or a conda layout outside the prefixes), the repository aside
    import_dirs = tuple(sorted({real(p) for p in sys.path if p and os.path.isdir(p)}))
    allowed_dirs = (workdir, copy) + python_dirs + tuple(d for d in import_dirs
                                                         if d != os.sep and not d.startswith(repository))

    def inside(path: str, folder: str) -> bool:
        return path == folder or path.startswith(folder + os.sep)

    # the project's own packages, wherever they are installed: in a wheel install they sit in site-packages,
    # inside the Python prefix that is otherwise readable
    protected = tuple(os.path.join(repository, package) for package in PROTECTED_PACKAGES)

    def readable(path: str) -> bool:
        if any(inside(path, folder) for folder in protected):
            return False
        if any(inside(path, d) for d in allowed_dirs) or inside(path, own_proc) or path in SAFE_DEVICES:
            return True
        if inside(path, "/dev"):
            return False  # a raw disk (as root) holds the repository's bytes under no path the hook knows
        if inside(path, "/proc") and path.split(os.sep)[2:3] and path.split(os.sep)[2].isdigit():
            return False  # another process: its memory, its file descriptors, its environment (secrets)
        # the system's files, nothing else: any other copy of the project (a second checkout, a clone in /tmp, a
        # docs build) holds the answer under a path the grader cannot know, so what is not named here is refused
        return (any(inside(path, folder) for folder in SYSTEM_DIRS) and not inside(path, repository)
                and not inside(path, temp_root))

    def resolve(raw) -> str:
        """The path an event names, refusing what the check cannot follow: a relative path that climbs (it may
        be relative to a directory descriptor the event does not show)."""
        text = os.fsdecode(raw)
        if not os.path.isabs(text) and ".." in text.replace("\\", "/").split("/"):
            raise SandboxViolation(f"the grading sandbox refuses the relative path {text!r} (no '..')")
        path = real(text)
        return path

    def hook(event: str, args) -> None:
        if event in PROCESS_EVENTS:
            raise SandboxViolation(f"the grading sandbox refuses {event} (no processes, no network)")
        if event.startswith("ctypes."):
            raise SandboxViolation(f"the grading sandbox refuses {event} (no foreign code, no raw memory)")
        if event == "import" and args and str(args[0]).split(".")[0] in BLOCKED_IMPORTS:
            raise SandboxViolation(f"the grading sandbox refuses importing {args[0]}")
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            path = resolve(args[0])
            mode, flags = (args[1] if len(args) > 1 else "r") or "r", args[2] if len(args) > 2 else 0
            writing = any(c in str(mode) for c in "wax+") or bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            if writing and not inside(path, workdir):
                raise SandboxViolation(f"the grading sandbox refuses writing {path} (only the working directory)")
            if writing and path.lower().endswith(IMPORTABLE_SUFFIXES):
                raise SandboxViolation(f"the grading sandbox refuses writing {path} (code written at run time is code "
                                       "the grader's scans never read)")
            if not readable(path):
                raise SandboxViolation(f"the grading sandbox refuses reading {path}")
            if os.path.isdir(path) and not inside(path, workdir):
                # the open event does not show dir_fd: a descriptor of any other directory would let relative
                # paths read or write there (site-packages included), so only the working directory's are given
                raise SandboxViolation(f"the grading sandbox refuses opening the directory {path}")
        if event == "resource.prlimit" and args and args[0] not in (0, os.getpid()):
            raise SandboxViolation("the grading sandbox refuses changing another process's limits")
        if event == "resource.setrlimit":
            raise SandboxViolation("the grading sandbox refuses changing its limits")
        if event == "sqlite3.connect" and args:
            target = os.fsdecode(args[0]) if isinstance(args[0], (str, bytes, os.PathLike)) else ""
            if target not in ("", ":memory:") and not inside(resolve(target), workdir):
                raise SandboxViolation("the grading sandbox refuses databases outside the working directory")
        if event in ("os.symlink", "os.link"):  # no grading needs a link; a link is a path the checks do not see
            raise SandboxViolation(f"the grading sandbox refuses {event}")
        if event in READING_EVENTS and args and isinstance(args[0], (str, bytes, os.PathLike)):
            path = resolve(args[0])
            if not readable(path) or path == "/proc":
                raise SandboxViolation(f"the grading sandbox refuses {event} on {path}")
        if event in CHANGING_EVENTS:
            # every path the event names (a rename's destination too) inside the working directory, and no
            # directory descriptor (a path relative to one is not the path the check sees)
            for value in args:
                if isinstance(value, (str, bytes, os.PathLike)):
                    path = resolve(value)
                    if not inside(path, workdir):
                        raise SandboxViolation(f"the grading sandbox refuses {event} on {path} (only the working "
                                               "directory)")
                    if event != "os.remove" and path.lower().endswith(IMPORTABLE_SUFFIXES):
                        raise SandboxViolation(f"the grading sandbox refuses {event} on {path} (a file Python can "
                                               "import or run, made at run time)")
            tail = DIR_FD_ARGUMENTS.get(event, 0)
            if tail and any(value not in (None, -1) for value in args[-tail:]):
                raise SandboxViolation(f"the grading sandbox refuses {event} relative to a directory descriptor")

    # the kernel's layer: what the hook refuses, enforced where Python code cannot reach (the hook's own state can
    # be rewritten by the code it watches: docs/course.md, "Grading untrusted code")
    from lessons.grading import landlock
    inside_python = any(inside(repository, d) for d in python_dirs)  # a wheel install: its packages only
    refused = protected + (() if inside_python else (repository,)) + (temp_root,)
    system = tuple(d for d in SYSTEM_DIRS if d != "/proc")  # /proc: this process's own entry only (restrict)
    layers = landlock.restrict(landlock.read_roots((copy, workdir) + python_dirs + tuple(
        d for d in import_dirs if d != os.sep and not d.startswith(repository)) + system, refused), (workdir,))
    # and the system calls Landlock does not mediate (sockets of every kind, new processes, exec from memory)
    from lessons.grading import seccomp
    calls = seccomp.restrict()
    sys.addaudithook(hook)
    return f"{layers} + {calls} + audit hook"


def plain(value, depth: int = 0):
    """``value`` as JSON data (tuples become lists; numpy scalars become numbers), or a TypeError naming it."""
    if depth > 8:
        raise TypeError("the hole returned data nested more than 8 deep")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        return value.item()
    if isinstance(value, (list, tuple)):
        if len(value) > 100000:
            raise TypeError("the hole returned more than 100000 items")
        return [plain(v, depth + 1) for v in value]
    raise TypeError(f"the hole returned a {type(value).__name__}; holes return numbers, or tuples/lists of them")


def _decode_args(kind: str | None, args):
    """Arguments the judge sent as data, as the hole expects them (``sass_run``: ptx.sass.Instruction objects)."""
    if kind == "sass_run":
        from types import SimpleNamespace
        try:
            from ptx.sass import Instruction
        except Exception:  # noqa: BLE001 - a namespace with the same fields serves as well
            Instruction = lambda **fields: SimpleNamespace(**fields)  # noqa: E731
        run = [Instruction(function=i["function"], offset=i["offset"], text=i["text"], opcode=i["opcode"],
                           encoding=int(i["encoding"], 16)) for i in args[0]]
        return [run]
    return _as_tuples(args)


def _as_tuples(value):
    """The judge's lists back into the tuples it was called with (JSON has only lists): a hole sees locally and when
    graded the same types."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, list) else value


def _encode_result(kind: str | None, value):
    if kind == "sass_run":
        return [[getattr(i, "function", None), getattr(i, "offset", None)] for i in value]
    return plain(value)


def answer(solution, request: dict):
    from lessons.grading import traced
    op = request.get("op")
    if op == "hello":
        return {name: callable(getattr(solution, name, None)) for name in request.get("holes", [])}
    function = getattr(solution, str(request.get("hole")), None)
    if not callable(function):
        raise AttributeError(f"the solution defines no function {request.get('hole')!r}")
    function = getattr(function, "py_func", function)  # a Numba dispatcher: the Python function it wraps
    if op == "call":
        kind = request.get("kind")
        return _encode_result(kind, function(*_decode_args(kind, request.get("args", []))))
    if op == "trace":
        return traced.trace(function, int(request["arity"]))
    if op == "emit":
        return traced.record_emitter(function, *request.get("args", []))
    raise ValueError(f"unknown request {op!r}")


def main(argv) -> int:
    workdir, copy, repository, temp_root, solution_file = argv
    answers = os.fdopen(os.dup(1), "w")  # the protocol's channel; fd 1 becomes stderr for the student's prints
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    requests = sys.stdin
    _exit_with_parent()
    with open(solution_file, "rb") as source:
        preload_numba = b"numba" in source.read()
    sandbox = lock_down(workdir, copy, repository, temp_root, preload_numba)
    try:
        import importlib.util
        spec = importlib.util.spec_from_file_location("solution", solution_file)
        solution = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(solution)
        load_error = None
    except BaseException as error:  # noqa: BLE001 - SystemExit included: reported, not obeyed
        solution, load_error = None, error
        load_trace = traceback.format_exc()
    for line in requests:
        try:
            request = json.loads(line)
        except ValueError:
            continue
        if request.get("op") == "bye":
            break
        reply = {"id": request.get("id")}
        try:
            if load_error is not None:
                reply["error"] = {"type": "LoadError", "message": f"{type(load_error).__name__}: {load_error}",
                                  "traceback": load_trace[-3000:]}
            else:
                reply["ok"] = answer(solution, request)
        except BaseException as error:  # noqa: BLE001 - the student's code: every failure is an answer
            reply = {"id": request.get("id"), "error": {"type": type(error).__name__, "message": str(error)[:4000],
                                                        "traceback": traceback.format_exc()[-3000:]}}
        if request.get("op") == "hello":
            reply["sandbox"] = sandbox  # the layers it runs in, for the report (a file that fails to load too)
        try:
            text = json.dumps(reply, allow_nan=False)
        except (TypeError, ValueError) as error:
            text = json.dumps({"id": request.get("id"), "error": {"type": "TypeError", "message": str(error),
                                                                   "traceback": ""}})
        answers.write(text + "\n")
        answers.flush()
    answers.flush()
    os._exit(0)  # not a return: the interpreter would wait for threads the solution started


def _exit_with_parent() -> None:
    """End this process when the judge that started it is gone (killed past its deadline, it never says "bye"),
    whatever threads the solution left running: the oracle runs in a session of its own, which no signal to the
    judge reaches."""
    import threading
    import time
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)
    threading.Thread(target=watch, daemon=True, name="oracle-parent-watch").start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
