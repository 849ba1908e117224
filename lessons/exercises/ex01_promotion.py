"""Exercise 01 (stage 01, naive): the promotion, DeepGEMM's once-per-K-group FFMA.

The hole is ``promote(total, partial, sa_value, sb_value)``, plugged into the stage's own kernel by
``lessons/01_naive.py``'s ``make_kernel(promote=...)``. This module also holds what the three Numba exercises
(01-03) share: :class:`NumbaCandidate` (simulator on the CPU, the real kernel on a GPU, SASS through NVVM in a
child process without the simulator).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from lessons.exercises import Exercise

ROOT = Path(__file__).resolve().parents[2]
NUMBA_FORBIDDEN = ("HMMA", "HGMMA", "QGMMA", "IMMA", "IGMMA", "BMMA", "DMMA")  # no tensor-core op of any kind


def _stage(number: int):
    import lessons
    return lessons.stage(number)


def as_device_function(function):
    """A student's plain Python function as what the stage's kernels call: itself in the simulator, an inlined
    ``cuda.jit`` device function on a GPU (left alone if it already is one)."""
    from lessons.numba_fp8 import device_function
    if hasattr(function, "py_func"):  # already a Numba dispatcher
        return function
    return device_function(function)


_SASS_CHILD = """
import importlib, importlib.util, json, sys
import lessons
from lessons.numba_fp8 import kernel_ptx
module = importlib.import_module(sys.argv[1])
if sys.argv[2] == "data":  # a graded solution: its holes rebuilt from the data the grader's oracle answered
    from lessons.grading.sandbox import rebuild
    solution = rebuild(json.loads(sys.stdin.read()))
else:
    solution = module.EXERCISE.reference()
candidate = module.EXERCISE.build(solution)
print(json.dumps(kernel_ptx(candidate.kernel, lessons.stage(module.EXERCISE.stage).OPERAND_DTYPE)))
"""


class NumbaCandidate:
    """A Numba stage's kernel with a solution's holes plugged in (``factory(solution)`` -> kernel)."""

    def __init__(self, stage: int, module_name: str, factory, solution):
        self.stage, self.module_name, self.factory, self.solution = stage, module_name, factory, solution
        self._kernel = None
        self._cubin = None

    @property
    def kernel(self):
        if self._kernel is None:
            self._kernel = self.factory(self.solution)
        return self._kernel

    def run_cpu(self, a, sa, b, sb) -> np.ndarray:
        """D as float32 through Numba's CUDA simulator (needs NUMBA_ENABLE_CUDASIM=1 before numba.cuda is imported);
        NaN where the kernel wrote nothing."""
        from gemm.fp8 import bf16_to_float
        from gemm.testing.problems import BF16_NAN_BITS, device_problem
        problem = device_problem(a, sa, b, sb)
        problem.d.copy_to_device(np.full(problem.d.shape, BF16_NAN_BITS, np.uint16))
        self.run_gpu(problem.a, problem.sa, problem.b, problem.sb, problem.d)
        return bf16_to_float(problem.d.copy_to_host()).astype(np.float32)

    def run_gpu(self, a, sa, b, sb, d, stream=None) -> None:
        _stage(self.stage).gemm(a, sa, b, sb, d, stream=stream, kernel=self.kernel)

    def ptx(self) -> str:
        """PTX of the kernel for cc 9.0 (NVVM), compiled in a child process without the simulator (a graded solution's
        holes reach it as data: :meth:`lessons.grading.sandbox.Oracle.as_data`)."""
        as_data = getattr(self.solution, "as_data", None)
        if as_data is None and not getattr(self.solution, "is_reference", False):
            raise RuntimeError("the solution's holes are not data (lessons.grading.sandbox): cannot compile it in a "
                               "child process")
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        result = subprocess.run([sys.executable, "-c", _SASS_CHILD, self.module_name, "data" if as_data else ""],
                                cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                                input=json.dumps(as_data()) if as_data else "")
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"numba.cuda.compile_ptx failed: {last}")
        return json.loads(result.stdout.strip().splitlines()[-1])

    def cubin(self):
        """The kernel's cubin (numba.cuda.compile_ptx for cc 9.0, assembled by ptx.compile), or None without NVVM;
        built once (sass and resources share it)."""
        from ptx.compile import compile_ptx
        if self._cubin is None:
            try:
                ptx = self.ptx()
            except RuntimeError as error:
                if "nvvm" in str(error).lower():
                    return None
                raise
            self._cubin = compile_ptx(ptx, assembler="nvjitlink")  # Numba's PTX: no setmaxnreg
        return self._cubin

    def sass(self):
        from ptx.sass import disassemble
        cubin = self.cubin()
        return None if cubin is None else disassemble(cubin)

    def resources(self):
        cubin = self.cubin()
        if cubin is None:
            return None
        return next(iter(cubin.resources.values()))


# ------------------------------------------------------------------------------------------- exercise 01
HOLES = ("promote",)


def reference():
    stage = _stage(1)
    return SimpleNamespace(promote=stage.promote.py_func if hasattr(stage.promote, "py_func") else stage.promote,
                           is_reference=True)


def _factory(solution):
    return _stage(1).make_kernel(promote=as_device_function(solution.promote))


def build(solution) -> NumbaCandidate:
    # Run the hole once in Python first: an unfilled skeleton fails here, with its own message.
    solution.promote(np.float32(1.0), np.float32(2.0), np.float32(3.0), np.float32(4.0))
    return NumbaCandidate(1, __name__, _factory, solution)


PROMPT = """\
Stage 01 computes D = (A*sA)(B*sB)^T with one thread per output. Inside a 128-wide K group the thread sums the
decoded e4m3 products in an FP32 `partial`; at the end of the group it must *promote* that partial into the running
FP32 `total`, applying the group's two scales once (not once per product). Write
`promote(total, partial, sa_value, sb_value)`: return the new total, where sa_value = sa[m, g] (the activation's
per-token scale of this row and group) and sb_value = sb[n // 128, g] (the weight's 128x128-block scale). It runs
inside the stage's own kernel (lessons/01_naive.py, make_kernel) in the CUDA simulator and on the GPU: plain float
arithmetic only. Read the module docstring of lessons/01_naive.py and gemm/fp8.py's reference_gemm."""

EXERCISE = Exercise(
    stage=1,
    name="promotion",
    objective="Apply DeepGEMM's fine-grained scales the way the kernel does: one FFMA per K group that promotes an "
              "FP32 partial sum, scaled by sa*sb, into the running total.",
    prompt=PROMPT,
    holes=HOLES,
    questions=(
        ("Predict: how many FFMA does the promotion cost per output element at K=7168, and how many the products?",
         "Check with `python -m lessons inspect 1`: the SASS FFMA count of the loop (56 groups: 56 promotion FFMAs "
         "against 7168 product FFMAs per output)."),
        ("Predict: if the scales were applied to every product instead, how many more FMULs per output?",
         "Check with `python -m lessons inspect 1` after editing a copy of the kernel; the promotion's FMUL "
         "(sa*sb) appears once per group in the SASS."),
        ("Predict: is (partial * sa) * sb bit-identical to partial * (sa * sb)? Does the grader care?",
         "Check by running both in the simulator: `Exercise.build(...).run_cpu` on a random problem and "
         "gemm.fp8.calc_diff against the reference (both pass; BF16 rounding hides the difference)."),
    ),
    reference=reference,
    build=build,
    required_sass=("FFMA",),
    forbidden_sass=NUMBA_FORBIDDEN,
    # K >= 512: four K groups or more, so a promotion applied once (or per product) cannot pass
    shapes_cpu=((5, 40, 512), (17, 9, 640)),
    shapes_gpu=((1000, 2112, 512), (4096, 4096, 7168)),
    perf_threshold=None,
    hole_kinds={"promote": ("expression", ("total", "partial", "sa_value", "sb_value"))},
)
