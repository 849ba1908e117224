"""The judge's side of the trust boundary: start the oracle in its sandbox and turn its answers into hole functions.

:class:`Oracle` prepares a run (a private temporary directory holding a copy of the solution file, a working
directory and a stripped, read-only copy of the project), starts ``lessons.grading.oracle`` there in its own
process session with a scrubbed environment, and talks to it over pipes with a time limit per question. Closing it
kills the whole process group: nothing the solution started outlives grading.

:meth:`Oracle.solution` returns what the exercises' ``build`` functions take, a namespace with one function per
hole, rebuilt from data on the judge's side:

* value holes: each call is a question to the oracle (memoised; the answer must be plain data);
* expression holes: traced once into an arithmetic tree, then :func:`lessons.grading.traced.function_from_tree`;
* emitter holes: each call records the PTX the student's code emits, replayed into the judge's builder.

The copy holds ``ptx/``, ``gemm/`` and the grading package only (no stage module, no exercise module, no results,
no tests), with the exercise's ``answer_sites`` (functions and constants holding its answer) replaced by stubs that
raise: every import, ``getattr``, ``runpy`` or ``exec`` of the project from the solution leads to a hole, and the
oracle's audit hook refuses reading the real repository.
"""
from __future__ import annotations

import ast
import json
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from lessons.grading import traced
from lessons.grading.rubric import printable

ROOT = Path(__file__).resolve().parents[2]
COPIED_PACKAGES = ("ptx", "gemm")
GRADING_FILES = ("__init__.py", "traced.py", "oracle.py", "landlock.py", "seccomp.py")
QUESTION_TIMEOUT_S = 60.0
MAX_ANSWER_CHARS = 16 << 20  # one answer's JSON; a traced tree past MAX_NODES is refused long before this
BOOTSTRAP = """
import sys
_python = tuple(p for p in {{sys.prefix, sys.base_prefix, sys.exec_prefix}})
sys.path[:] = [p for p in sys.path if p and (not p.startswith({repo!r}) or p.startswith(_python))]
sys.path.insert(0, {copy!r})
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__ + getattr(f, "__name__", "")]
from lessons.grading.oracle import main
sys.exit(main(sys.argv[1:]))
"""


class HoleError(Exception):
    """The student's function raised, or answered with data the judge cannot use; the message says which."""

    def __init__(self, hole: str, kind: str, message: str, trace: str = ""):
        super().__init__(f"{hole}: {kind}: {message}")
        self.hole, self.kind, self.message, self.trace = hole, kind, message, trace


class OracleDied(HoleError):
    """The oracle process ended or stopped answering (a crash, a limit, a timeout)."""


# -- the stripped copy -------------------------------------------------------------------------------------------
def strip_source(source: str, names) -> str:
    """``source`` with every function, method or class called one of ``names`` made to raise, and every module-level
    assignment to one of them (or class-level one, named ``Class.attribute``) set to None."""
    names = set(names)
    tree = ast.parse(source)
    message = "removed for grading: write your own"

    class Stripper(ast.NodeTransformer):
        def visit_FunctionDef(self, node):
            self.generic_visit(node)
            if node.name in names:
                node.body = [ast.Raise(exc=ast.Call(func=ast.Name("NotImplementedError", ast.Load()),
                                                    args=[ast.Constant(message)], keywords=[]), cause=None)]
                node.decorator_list = []
            return node

        visit_AsyncFunctionDef = visit_FunctionDef

        def visit_ClassDef(self, node):
            self.generic_visit(node)
            if node.name in names:
                node.body = [ast.Pass()]
            for statement in node.body:  # "Class.attribute": a class-level default holding the answer
                targets = (statement.targets if isinstance(statement, ast.Assign) else
                           [statement.target] if isinstance(statement, ast.AnnAssign) else [])
                if any(isinstance(t, ast.Name) and f"{node.name}.{t.id}" in names for t in targets):
                    statement.value = ast.Constant(None)
            return node

    tree = Stripper().visit(tree)
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id in names for t in targets):
                node.value = ast.Constant(None)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def build_copy(folder: Path, answer_sites: dict[str, tuple[str, ...] | None]) -> Path:
    """The project copy the oracle imports from (read-only). ``answer_sites``: repository-relative file -> names to
    strip in it (None: the whole module raises ImportError)."""
    copy = folder / "project"
    for package in COPIED_PACKAGES:
        for source in sorted((ROOT / package).rglob("*.py")):
            relative = source.relative_to(ROOT)
            target = copy / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            text = source.read_text()
            if str(relative) in answer_sites:
                names = answer_sites[str(relative)]
                text = (f"raise ImportError('{relative} is removed for grading: write your own')\n" if names is None
                        else strip_source(text, names))
            target.write_text(text)
    lessons = copy / "lessons"
    (lessons / "grading").mkdir(parents=True)
    (lessons / "__init__.py").write_text('"""The stages are not part of a grading sandbox."""\n')
    for name in GRADING_FILES:
        shutil.copyfile(ROOT / "lessons" / "grading" / name, lessons / "grading" / name)
    for path in copy.rglob("*"):
        path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH | (stat.S_IXUSR if path.is_dir() else 0))
    copy.chmod(stat.S_IRUSR | stat.S_IXUSR)
    return copy


def _scrubbed_environment(home: str) -> dict[str, str]:
    """What the oracle sees of the environment: nothing of the judge's (no secret, no paths to the repository)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
           "PYTHONDONTWRITEBYTECODE": "1", "NUMBA_ENABLE_CUDASIM": "1", "NUMBA_CACHE_DIR": home}
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[name] = "1"
    return env


def remove_tree(folder) -> None:
    """Remove a grading folder, its read-only project copy included."""
    for path in [Path(folder), *Path(folder).rglob("*")]:
        try:
            path.chmod(0o700)
        except OSError:
            pass
    shutil.rmtree(folder, ignore_errors=True)


# -- the process ---------------------------------------------------------------------------------------------------
class Oracle:
    """One sandboxed oracle for one solution file. Use as a context manager."""

    def __init__(self, solution_file: str | os.PathLike, exercise, *, timeout: float = QUESTION_TIMEOUT_S,
                 deadline: float | None = None, temp_root: str | None = None):
        self.exercise, self.timeout, self.deadline = exercise, timeout, deadline
        self.temp = Path(tempfile.mkdtemp(prefix="fp8grade-", dir=temp_root))
        self.temp.chmod(0o700)
        self.workdir = self.temp / "work"
        self.workdir.mkdir()
        solution = self.workdir / "solution.py"
        shutil.copyfile(solution_file, solution)
        self.copy = build_copy(self.temp, dict(getattr(exercise, "answer_sites", {}) or {}))
        bootstrap = BOOTSTRAP.format(repo=str(ROOT), copy=str(self.copy))
        # the system's temporary folder, where every run's folder is (a grader's fp8grade-run-* holds this one's):
        # the others' are refused
        temp_root = os.path.realpath(tempfile.gettempdir())
        self._stderr_path = self.temp / "stderr.txt"  # a file, not a pipe: the solution's prints can never block it
        with open(self._stderr_path, "w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-c", bootstrap, str(self.workdir), str(self.copy), str(ROOT), temp_root,
                 str(solution)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                cwd=self.workdir, env=_scrubbed_environment(str(self.workdir)), start_new_session=True, text=True,
                bufsize=1)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.process.stdout, selectors.EVENT_READ)
        self._next_id = 0
        self._memo: dict = {}
        self.questions = 0
        self.sandbox: str | None = None  # the layers the oracle says it runs in (defined_holes)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def ask(self, op: str, hole: str = "", **fields):
        """One question; the oracle's data, or HoleError / OracleDied."""
        self._next_id += 1
        self.questions += 1
        request = {"id": self._next_id, "op": op, "hole": hole, **fields}
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):  # ValueError: the pipe was closed here, after a timeout
            raise OracleDied(hole, "the solution's process ended", self._stderr_tail()) from None
        limit = self.timeout if self.deadline is None else min(self.timeout, max(0.0, self.deadline - time.time()))
        while True:
            if not self._selector.select(timeout=limit):
                self.close()
                raise OracleDied(hole, "timeout", f"no answer in {limit:.0f} s (the solution's process was stopped)")
            line = self.process.stdout.readline(MAX_ANSWER_CHARS + 1)
            if not line:
                raise OracleDied(hole, "the solution's process ended", self._stderr_tail())
            if len(line) > MAX_ANSWER_CHARS and not line.endswith("\n"):
                self.close()
                raise OracleDied(hole, "answer too large", f"more than {MAX_ANSWER_CHARS} characters for one answer "
                                 "(the solution's process was stopped)")
            try:
                reply = json.loads(line)
            except (ValueError, RecursionError):
                raise HoleError(hole, "protocol", f"unreadable answer {line[:120]!r}") from None
            if isinstance(reply, dict) and reply.get("id") == self._next_id:
                break
        layers = reply.get("sandbox") if op == "hello" else None  # the oracle's word: reported, trusted for nothing
        if isinstance(layers, str):
            self.sandbox = printable(layers[:200])
        if "error" in reply:
            error = reply["error"] if isinstance(reply["error"], dict) else {}
            kind, message = str(error.get("type", "Error")), str(error.get("message", ""))
            if kind == "NotImplementedError":
                raise NotImplementedError(message if message.startswith(hole) else f"{hole}: {message}")
            raise HoleError(hole, kind, message, str(error.get("traceback", "")))
        return reply.get("ok")

    def _stderr_tail(self) -> str:
        try:
            with open(self._stderr_path, "rb") as handle:
                handle.seek(max(0, self._stderr_path.stat().st_size - 3000))
                return handle.read().decode(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        """Say goodbye, then kill the process group (whatever the solution started in it) and remove the files."""
        if self.process.poll() is None:
            try:
                self.process.stdin.write(json.dumps({"op": "bye"}) + "\n")
                self.process.stdin.flush()
                self.process.wait(timeout=2)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        remove_tree(self.temp)

    # -- hole functions rebuilt on the judge's side -----------------------------------------------------------------
    def defined_holes(self) -> dict[str, bool]:
        answer = self.ask("hello", holes=list(self.exercise.holes))
        if not isinstance(answer, dict):
            raise HoleError("", "protocol", "the oracle did not list the holes")
        return {hole: answer.get(hole) is True for hole in self.exercise.holes}

    def _value_hole(self, hole: str, kind: str | None):
        def call(*args):
            data = encode_args(kind, args)
            key = (hole, json.dumps(data))
            if key not in self._memo:
                self._memo[key] = self.ask("call", hole, args=data, kind=kind)
            return decode_result(kind, self._memo[key], args)
        call.__name__ = hole
        return call

    def _expression_hole(self, hole: str, names: tuple[str, ...]):
        tree = self.ask("trace", hole, arity=len(names))
        try:
            function = traced.function_from_tree(tree, list(names), hole)
        except (ValueError, RecursionError, MemoryError, SyntaxError) as error:
            raise HoleError(hole, "traced expression", f"{type(error).__name__}: {error}"[:500]) from None
        function.traced_tree = tree
        return function

    def _emitter_hole(self, hole: str):
        def emit(kb, *registers):
            transcript = self.ask("emit", hole, args=[str(r) for r in registers])
            try:
                return traced.replay_emitter(transcript, kb, [str(r) for r in registers])
            except ValueError as error:
                raise HoleError(hole, "emitted PTX", str(error)) from None
        emit.__name__ = hole
        return emit

    def solution(self) -> SimpleNamespace:
        """The namespace ``exercise.build`` takes, every hole answered by the oracle (see the module docstring). An
        expression hole is traced here; if that fails, calling it raises the failure (so "a hole is not filled" is
        reported where the build first needs it)."""
        kinds = getattr(self.exercise, "hole_kinds", {}) or {}
        holes = {}
        for hole in self.exercise.holes:
            kind = kinds.get(hole, "value")
            if isinstance(kind, tuple) and kind[0] == "expression":
                try:
                    holes[hole] = self._expression_hole(hole, kind[1])
                except (NotImplementedError, HoleError) as error:
                    holes[hole] = _raiser(hole, error)
            elif kind == "emitter":
                holes[hole] = self._emitter_hole(hole)
            else:
                holes[hole] = self._value_hole(hole, None if kind == "value" else kind)
        solution = SimpleNamespace(**holes)
        solution.as_data = lambda: self.as_data(solution)
        return solution

    def as_data(self, solution) -> dict:
        """Everything the oracle answered, as data another (trusted) process can rebuild the holes from: the traced
        trees and the memoised value calls (NumbaCandidate compiles the kernel's PTX in a child that reads this)."""
        trees = {hole: getattr(solution, hole).traced_tree for hole in self.exercise.holes
                 if hasattr(getattr(solution, hole), "traced_tree")}
        values = {}
        for (hole, args), result in self._memo.items():
            values.setdefault(hole, []).append([json.loads(args), result])
        kinds = {hole: list(kind) if isinstance(kind, tuple) else kind
                 for hole, kind in (getattr(self.exercise, "hole_kinds", {}) or {}).items()}
        return {"trees": trees, "values": values, "kinds": kinds}


def _raiser(hole: str, error: BaseException):
    def fail(*args):
        raise error
    fail.__name__ = hole
    return fail


def rebuild(data: dict) -> SimpleNamespace:
    """The holes of :meth:`Oracle.as_data` as functions, in a process with no oracle (values not asked before raise)."""
    holes = {}
    for hole, kind in data.get("kinds", {}).items():
        if isinstance(kind, list) and kind and kind[0] == "expression":
            holes[hole] = traced.function_from_tree(data["trees"][hole], list(kind[1]), hole)
    for hole, calls in data.get("values", {}).items():
        table = {json.dumps(args): result for args, result in calls}

        def call(*args, hole=hole, table=table):
            key = json.dumps(encode_args(None, args))
            if key not in table:
                raise HoleError(hole, "replay", f"{hole}{args} was not asked of the solution before")
            return decode_result(None, table[key], args)
        holes[hole] = call
    return SimpleNamespace(**holes)


# -- argument and result encodings -------------------------------------------------------------------------------
def encode_args(kind: str | None, args) -> list:
    if kind == "sass_run":
        return [[{"function": i.function, "offset": int(i.offset), "text": i.text, "opcode": i.opcode,
                  "encoding": f"{int(i.encoding):032x}"} for i in args[0]]]
    return [_plain_arg(a) for a in args]


def _plain_arg(value):
    if isinstance(value, bool) or value is None or isinstance(value, (int, float, str)):
        return value
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain_arg(v) for v in value]
    raise TypeError(f"a value hole was called with a {type(value).__name__}: only numbers can be sent to the solution")


def decode_result(kind: str | None, value, args):
    """The oracle's answer as the generator expects it: tuples for lists (pairs), the run's own instructions for a
    ``sass_run`` choice. Anything but numbers, strings and lists of them is refused."""
    if kind == "sass_run":
        run = {(i.function, i.offset): i for i in args[0]}
        if not isinstance(value, list) or not all(isinstance(v, list) and len(v) == 2 for v in value):
            raise HoleError("select_flips", "result", "select_flips must return instructions of the run")
        chosen = []
        for function, offset in value:
            if (function, offset) not in run:
                raise HoleError("select_flips", "result", f"chose an instruction outside the run (offset {offset})")
            chosen.append(run[function, offset])
        return chosen
    return _tuples(value)


def _tuples(value, depth: int = 0):
    if depth > 8:
        raise HoleError("", "result", "the answer is nested more than 8 deep")
    if isinstance(value, list):
        return tuple(_tuples(v, depth + 1) for v in value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise HoleError("", "result", f"unusable answer of type {type(value).__name__}")


__all__ = ["Oracle", "HoleError", "OracleDied", "strip_source", "build_copy", "rebuild", "remove_tree", "encode_args",
           "decode_result"]
