"""What the parent reads in a solution's source before anything runs: vendor GEMM, tampering, taking the answer.

:func:`scan_source` flags ``@``, matmul/dot/einsum/_scaled_mm/cublas, imports of torch/cupy (and the other modules
of :data:`FORBIDDEN_MODULES`), eval/exec and reaching into the grader; :func:`copy_findings` flags imports of the
stage's own code. Functions that are the stage's own code under other names are :mod:`lessons.grading.copies`'.
"""
from __future__ import annotations

import ast


# What a solution may not call or import (the vendor-GEMM and tampering defences; docs/course.md lists them).
FORBIDDEN_CALLS = frozenset({"matmul", "dot", "vdot", "einsum", "tensordot", "inner", "multi_dot", "_scaled_mm",
                             "mm", "bmm", "addmm", "baddbmm", "linear", "reference_gemm", "fp8_gemm_nt",
                             "fp8_gemm", "gemm_fp8_fp8_bf16_nt"})
FORBIDDEN_MODULES = frozenset({"torch", "cupy", "jax", "tensorflow", "ctypes", "cffi", "subprocess", "importlib",
                               "builtins", "gc", "lessons.grading", "scipy.linalg",
                               # code run from data the scans cannot read (a string, a file written at run time)
                               "runpy", "code", "codeop", "marshal", "pickle", "_pickle", "shelve", "copyreg",
                               "zipimport", "pkgutil", "imp"})
FORBIDDEN_BUILTINS = frozenset({"eval", "exec", "compile", "__import__", "globals", "vars"})
FORBIDDEN_INTROSPECTION = frozenset({"__wrapped__", "__closure__", "__globals__", "__code__", "__builtins__",
                                     "__subclasses__", "__self__", "_getframe", "f_back", "f_globals", "f_locals",
                                     "meta_path", "modules"})


def encoding_findings(data: bytes) -> list[str]:
    """A source file whose coding declaration names anything but UTF-8: the scans read the file as UTF-8 while
    Python would decode it as declared, so the two would read different programs (under ``# coding: utf-7`` a line
    that is a comment to the scans is code to the import)."""
    import io
    import tokenize
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as error:
        return [f"line 1: {error}"]
    if encoding not in ("utf-8", "utf-8-sig"):
        return [f"line 1: declares the encoding {encoding} (a solution is UTF-8: the grader's checks read UTF-8)"]
    return []


def scan_source(source: str, filename: str = "<solution>") -> list[str]:
    """Vendor-GEMM and tampering findings in a solution's source, one line each ("line 12: uses @")."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as error:
        return [f"line {error.lineno}: syntax error: {error.msg}"]
    found = set()

    def flag(node, what):
        found.add((getattr(node, "lineno", 0), what))

    def forbidden_module(name: str) -> bool:
        return any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN_MODULES) or "cublas" in name.lower()

    for node in ast.walk(tree):
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult):
            flag(node, "uses the @ operator (a vendor matmul)")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if forbidden_module(alias.name):
                    flag(node, f"imports {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if forbidden_module(module):
                flag(node, f"imports from {module}")
            for alias in node.names:
                if alias.name in FORBIDDEN_CALLS or forbidden_module(f"{module}.{alias.name}".strip(".")) \
                        or "cublas" in alias.name.lower():
                    flag(node, f"imports {alias.name} from {module or '.'}")
        elif isinstance(node, ast.Attribute) and (node.attr in FORBIDDEN_CALLS or "cublas" in node.attr.lower()):
            flag(node, f"uses .{node.attr}")
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_INTROSPECTION:
            flag(node, f"uses .{node.attr} (reaching into the grader)")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_BUILTINS:
            flag(node, f"uses {node.id} (code the scan cannot read)")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                node.value in FORBIDDEN_CALLS or "cublas" in node.value.lower() or node.value in FORBIDDEN_MODULES):
            flag(node, f"names {node.value!r} in a string")
    return [f"line {line}: {what}" for line, what in sorted(found)]
ANSWER_NAMES = frozenset({"reference", "reference_solution", "EXERCISE"})  # where an exercise keeps the answer
PACKAGE_NAMES = frozenset({"Exercise", "Candidate", "exercise", "exercises", "SKELETONS"})  # lessons.exercises API


def copy_findings(source: str, exercise) -> list[str]:
    """Ways a solution takes the answer instead of writing it, read from its source: importing a stage module (any
    ``lessons`` module but the ``lessons.exercises`` package's own names), an exercise module, an exercise's
    ``reference`` / ``EXERCISE``, or the functions the stage itself uses for the holes (their names, from
    ``exercise.reference()``, and the holes' names read off another module). What a source scan cannot see
    (``getattr(exercise(4), "refer" + "ence")``) the sandbox refuses at run time: the oracle's copy of the project
    has no stage modules and the answers' functions stripped (:func:`lessons.grading.sandbox.build_copy`)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # scan_source reports it
    answers = set()
    try:
        reference = exercise.reference()
        for hole in exercise.holes:
            function = getattr(reference, hole, None)
            name = getattr(function, "__name__", None)
            if name and name != hole:  # a hole may share its name with the stage's function: the import is the tell
                answers.add(name)
            if getattr(function, "__module__", None):
                answers.add(f"{function.__module__}:{name or hole}")
    except Exception:  # noqa: BLE001  (an exercise without a reference: only the module rule applies)
        pass
    holes = set(getattr(exercise, "holes", ()))
    found = set()
    from_lessons = False
    imported = {(alias.asname or alias.name).split(".")[0] for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    for node in ast.walk(tree):
        modules = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            modules = [module]
            if module == "lessons.exercises":  # `from lessons.exercises import ex04_...` imports a module
                modules += [f"{module}.{alias.name}" for alias in node.names if alias.name not in PACKAGE_NAMES]
            for alias in node.names:
                if f"{module}:{alias.name}" in answers or alias.name in answers:
                    found.add((node.lineno, f"imports the stage's own {alias.name} from {module}"))
                if module.startswith("lessons") and alias.name in ANSWER_NAMES:
                    found.add((node.lineno, f"imports {alias.name} from {module} (the stage's own answer)"))
        for module in modules:
            if module == "lessons" or module.startswith("lessons."):
                from_lessons = True
            if module.startswith("lessons.exercises."):
                found.add((node.lineno, f"imports {module} (an exercise module: it wires the stage's own answer)"))
            elif (module == "lessons" or module.startswith("lessons.")) and module != "lessons.exercises":
                found.add((node.lineno, f"imports {module} (the stages' own code)"))
        if isinstance(node, ast.Attribute) and (node.attr in answers or (node.attr in holes
                                                                         and _root_name(node) in imported)):
            # a hole's name read off something imported is the stage's; off the solution's own object, its own
            found.add((node.lineno, f"uses .{node.attr} (the stage's own function)"))
    if from_lessons:  # an exercise's answer, read off what the solution imported from lessons
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ANSWER_NAMES:
                found.add((node.lineno, f"uses .{node.attr} (the stage's own answer)"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def _root_name(node) -> str | None:
    """The name an attribute chain starts from (``a`` of ``a.b.c``), None when it starts from a call or a literal."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None

