"""Programmatic dependent launch (KernelConfig.pdl): the kernel waits for the previous grid before it touches global
memory, lets the next one launch early, and launches with the programmatic-serialization attribute."""
from __future__ import annotations

import re

import numpy as np
import pytest

from gemm.fp8 import calc_diff
from gemm.heuristics import choose_config
from gemm.kernel import generate
from gemm.testing.problems import random_problem, reference_gemm

SHAPES = [(130, 264, 512), (64, 2112, 1024), (300, 384, 1024)]  # one CTA per tile, ragged; persistent below


@pytest.mark.parametrize("m, n, k", SHAPES)
def test_the_wait_comes_before_any_global_access(m, n, k):
    config = choose_config(m, n, k).replace(pdl=True)
    ptx = generate(config, n, k)
    lines = [line.strip() for line in ptx.splitlines()]
    wait = lines.index("griddepcontrol.wait;")
    assert lines[wait + 1] == "griddepcontrol.launch_dependents;"
    global_access = [i for i, line in enumerate(lines)
                     if re.match(r"(@\S+ )?(ld|st|atom|red)\.global|(@\S+ )?cp\.(async\.bulk|reduce)", line)]
    assert global_access and min(global_access) > wait, "global memory touched before griddepcontrol.wait"
    assert "griddepcontrol" not in generate(config.replace(pdl=False), n, k)  # production PTX untouched


@pytest.mark.parametrize("m, n, k", SHAPES + [(520, 2112, 512)])
def test_a_pdl_kernel_is_right_on_the_emulator(m, n, k, rng):
    from gemm.testing.emulated import run_gemm
    config = choose_config(m, n, k).replace(pdl=True)
    a, sa, b, sb = random_problem(m, n, k, rng)
    d = run_gemm(config, a, sa, b, sb)
    assert not np.isnan(d).any() and calc_diff(d, reference_gemm(a, sa, b, sb)) < 1e-3


def test_it_assembles_to_the_wait_and_the_trigger():
    from gemm.kernel.launch import cubin
    from ptx.sass import disassemble
    config = choose_config(4096, 4096, 7168).replace(pdl=True)
    opcodes = {i.text.split()[0] for i in disassemble(cubin(config, 4096, 7168))}
    assert {"ACQBULK", "PREEXIT"} <= opcodes, sorted(opcodes)  # griddepcontrol.wait, .launch_dependents
    assert "programmatic dependent launch" in config.describe()


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(64, 2112, 1024), (1000, 2112, 512)])
def test_back_to_back_dependent_calls_see_each_other(m, n, k, rng):
    """20 calls each adding A*B into the same FP32 D (D = D + A*B), launched back to back with the attribute: each
    reads what the previous one wrote, so a missing or misplaced wait shows as a wrong total."""
    from numba import cuda
    from gemm import dispatch
    from gemm.testing.problems import device_problem
    a, sa, b, sb = random_problem(m, n, k, rng)
    problem = device_problem(a, sa, b, sb)
    config = choose_config(m, n, k, out_dtype="f32", accumulate=True).replace(pdl=True)
    d = cuda.to_device(np.zeros((m, n), np.float32))
    calls = 20
    for _ in range(calls):
        dispatch.run_dense(problem.a, problem.sa, problem.b, problem.sb, d, d, None, config=config)
    cuda.synchronize()
    got = d.copy_to_host()
    assert calc_diff(got, calls * reference_gemm(a, sa, b, sb)) < 1e-5
