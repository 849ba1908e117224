"""Technique checks, on the SASS the judge assembled itself: the exercise's required opcode prefixes and none of its
forbidden ones, no spills (``Candidate.resources()``: a ``ptx.compile.Resources`` or ``{"registers",
"spill_stores", "spill_loads"}``), and the exercise's own checks.

An instruction the stub build (:func:`stub_candidate`: the holes filled with the simplest answers) has just as often
is the scaffold's, not the student's: it is shown, not graded.
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from lessons.grading.rubric import check_result, error_text
from lessons.grading.traced import function_from_tree


def _opcodes(instructions) -> list[str]:
    """Each instruction's opcode with its modifiers ("LDS.128", "HMMA.16816.F32"), so a required prefix may name
    a width or a variant as well as a family."""
    out = []
    for instruction in instructions:
        text = getattr(instruction, "text", None) or str(instruction)
        words = text.replace(";", " ").split()
        words = words[1:] if words and words[0].startswith("@") else words
        out.append(words[0] if words else (getattr(instruction, "opcode", None) or ""))
    return out


def _missing_toolchain(error: BaseException) -> bool:
    return isinstance(error, FileNotFoundError) and any(tool in str(error) for tool in ("ptxas", "nvdisasm", "nvvm",
                                                                                       "NVVM"))


def stub_solution(exercise):
    """The holes filled with the simplest answers of the right type (the first argument for an expression, zeros
    shaped like the stage's own answer, no flips): the kernel a student gets for writing nothing that matters.
    None where no such stub exists (an emitter hole)."""
    reference = exercise.reference()
    kinds = getattr(exercise, "hole_kinds", {}) or {}
    holes, trees = {}, {}
    for hole in exercise.holes:
        kind = kinds.get(hole, "value")
        if isinstance(kind, tuple):
            trees[hole] = ["arg", 0]
            holes[hole] = function_from_tree(trees[hole], list(kind[1]), hole)
        elif kind == "sass_run":
            holes[hole] = lambda run: []
        elif kind == "emitter":
            return None
        else:
            own = getattr(reference, hole)
            holes[hole] = lambda *args, own=own: _zero_like(own(*args))
    stub = SimpleNamespace(**holes)
    stub.as_data = lambda: {"trees": trees, "values": {}, "kinds": {h: list(k) if isinstance(k, tuple) else k
                                                                   for h, k in kinds.items()}}
    return stub


def _zero_like(value):
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return type(value)()  # a choice of names: choosing none
    if isinstance(value, (list, tuple)):
        return type(value)(_zero_like(v) for v in value)
    return type(value)(0) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def stub_candidate(exercise):
    """The stub solution's candidate (None where there is none, or it does not build); the exercise's own
    ``scaffold`` (the kernel a student starts from) where its build refuses the stub's answers."""
    try:
        if getattr(exercise, "scaffold", None) is not None:  # duck-typed exercises (tests) may have no field
            return exercise.scaffold()
        stub = stub_solution(exercise)
        return None if stub is None else exercise.build(stub)
    except Exception:  # noqa: BLE001 - a stub the generator refuses: every technique check counts
        return None


def _opcode_counts(candidate) -> dict[str, int] | None:
    try:
        instructions = candidate.sass() if candidate is not None else None
    except Exception:  # noqa: BLE001
        return None
    if instructions is None:
        return None
    counts: dict[str, int] = {}
    for opcode in _opcodes(instructions):
        counts[opcode] = counts.get(opcode, 0) + 1
    return counts


def _count(counts: dict[str, int], prefix: str) -> int:
    return sum(n for op, n in counts.items() if op.startswith(prefix))


def technique_checks(exercise, candidate, stub=None) -> list[dict]:
    """Required / forbidden SASS opcode prefixes and spills, on the machine code the judge assembled itself. With a
    ``stub`` candidate (:func:`stub_candidate`), an instruction the stub's kernel has just as often is the
    scaffold's, not the student's: it is shown, not graded. A missing assembler or disassembler: not graded."""
    checks = []
    required, forbidden = tuple(exercise.required_sass), tuple(exercise.forbidden_sass)
    sass_fn = getattr(candidate, "sass", None)
    try:
        instructions = sass_fn() if sass_fn is not None else None
    except NotImplementedError as error:
        checks.append(check_result("sass", "technique", False, f"a hole is not filled: {error_text(error)}"))
        instructions = None
    except Exception as error:  # noqa: BLE001
        if _missing_toolchain(error):
            checks.append(check_result("sass", "technique", None, f"not graded: the toolchain is missing here "
                                       f"({error_text(error)})", graded=False))
        else:
            checks.append(check_result("sass", "technique", False, f"building the SASS failed: {error_text(error)}"))
        instructions = None
    else:
        if instructions is None and (required or forbidden):
            checks.append(check_result("sass", "technique", None, "not graded: no SASS on this machine", graded=False))
    if instructions is not None:
        opcodes = set(_opcodes(instructions))
        mine = {}
        for opcode in _opcodes(instructions):
            mine[opcode] = mine.get(opcode, 0) + 1
        scaffold = _opcode_counts(stub) if stub is not None and (required or forbidden) else None
        for prefix in required:
            hits = sorted(op for op in opcodes if op.startswith(prefix))
            found = f"found {', '.join(hits)}" if hits else f"no {prefix}* instruction in the SASS"
            if scaffold is not None and hits and _count(scaffold, prefix) == _count(mine, prefix):
                checks.append(check_result(f"uses {prefix}", "technique", True,
                                           f"{found} (the scaffold's: the stub build, or the exercise's scaffold, has as many; "
                                           "not graded)",
                                           graded=False))
            else:
                checks.append(check_result(f"uses {prefix}", "technique", bool(hits), found))
        for prefix in forbidden:
            hits = sorted(op for op in opcodes if op.startswith(prefix))
            if scaffold is not None and _count(mine, prefix) <= _count(scaffold, prefix):
                checks.append(check_result(f"avoids {prefix}", "technique", None, (f"found {', '.join(hits)}, as the "
                                           "scaffold has" if hits else f"no {prefix}*, nor in the scaffold") +
                                           " (not the student's doing: not graded)", graded=False))
            else:
                checks.append(check_result(f"avoids {prefix}", "technique", not hits,
                                           f"found {', '.join(hits)}" if hits else f"no {prefix}*"))
        for check in (getattr(exercise, "extra", None) or {}).get("sass_checks", ()):
            name = getattr(check, "__name__", "sass check").replace("_", " ")
            try:
                failures = list(check(instructions))
            except Exception as error:  # noqa: BLE001
                failures = [error_text(error)]
            checks.append(check_result(name, "technique", not failures, "; ".join(map(str, failures)) or "ok"))
        local = sorted({op.split(".")[0] for op in opcodes} & {"LDL", "STL"})
        if local:
            checks.append(check_result("local memory", "technique", None, f"SASS has {', '.join(local)} (local memory: "
                                       "spills or a local array)", graded=False))
    resources_fn = getattr(candidate, "resources", None)
    if resources_fn is not None:
        try:
            resources = resources_fn() or {}
            if dataclasses.is_dataclass(resources):  # ptx.compile.Resources, ptxas's report of the kernel
                resources = dataclasses.asdict(resources)
        except Exception as error:  # noqa: BLE001
            if _missing_toolchain(error):
                checks.append(check_result("no spills", "technique", None, f"not graded: the toolchain is missing here "
                                           f"({error_text(error)})", graded=False))
            else:
                checks.append(check_result("no spills", "technique", False, f"resources() failed: {error_text(error)}"))
        else:
            if resources:
                spills = resources.get("spills")
                if spills is None:
                    spills = (resources.get("spill_stores") or 0) + (resources.get("spill_loads") or 0)
                checks.append(check_result("no spills", "technique", spills == 0, f"{spills} bytes spilled, "
                                           f"{resources.get('registers', '?')} registers", resources=resources))
    return checks


def exercise_checks(exercise, solution) -> list[dict]:
    """The exercise's own technique checks (``extra["checks"]``: solution -> list of failures, empty when right)."""
    checks = []
    for check in (getattr(exercise, "extra", None) or {}).get("checks", ()):
        name = getattr(check, "__name__", "exercise check").replace("_", " ")
        what = ((check.__doc__ or "").strip().splitlines() or [""])[0]
        try:
            failures = list(check(solution))
        except NotImplementedError as error:
            failures = [f"a hole is not filled: {error_text(error)}"]
        except Exception as error:  # noqa: BLE001
            failures = [error_text(error)]
        checks.append(check_result(name, "technique", not failures, "; ".join(map(str, failures)) or what))
    return checks
