"""Stage 05 (wgmma): assembles for sm_90a without spills and with QGMMA (CPU), runs correctly in the CPU
emulator of ptx.emulate (CPU), and matches the float64 reference on an H100 (GPU): an exact
one-block debug case first, then all 18 DeepSeek shapes and ragged shapes with NaN-poisoned outputs."""
import sys
from pathlib import Path

import numpy as np
import pytest

import lessons
from gemm.fp8 import align, bf16_to_float, calc_diff
from gemm.testing.problems import random_problem, reference_gemm
from ptx.vocab import wgmma as w

sys.path.insert(0, str(Path(__file__).parent))  # tests/tc_checks.py
from tc_checks import (ASSEMBLY_SHAPES, BF16_NAN, RAGGED_SHAPES, RecordingKernel, on_fake_device,  # noqa: E402
                       assemble, assert_clean_resources, assert_exact, assert_no_unwritten, check_against_reference,
                       run_on_gpu, sa_storage, small_integer_problem)

stage = lessons.stage(5)


# ------------------------------------------------------------------------------ CPU: assembly and SASS
@pytest.mark.parametrize("m, n, k", ASSEMBLY_SHAPES)
def test_assembles_without_spills_and_uses_qgmma(m, n, k):
    cubin, sass = assemble(stage, m, n, k)
    assert_clean_resources(cubin, stage.KERNEL)
    qgmma = [i.text for i in sass if i.opcode == "QGMMA"]
    assert qgmma and all("QGMMA.64x128x32.F32.E4M3.E4M3" in text for text in qgmma), qgmma[:2]
    assert not [i for i in sass if i.opcode in ("HMMA", "LDSM")]  # no mma.sync/ldmatrix path left
    assert any(i.opcode == "LDGSTS" for i in sass)  # loads are still thread-issued cp.async


def test_k_must_be_a_multiple_of_128():
    with pytest.raises(ValueError, match="multiple of 128"):
        stage.generate(128, 128, 200)


def test_thread_copies_land_in_the_canonical_128b_swizzled_layout():
    # the PTX computes (tid//8)*128 + ((tid%8) ^ (tid//8 % 8))*16 + pass*4096 (load_setup / issue_loads)
    for tid in range(stage.THREADS):
        for p in range(stage.BLOCK_M // stage.LOAD_ROWS_PER_PASS):
            row, chunk = stage.load_slot(tid, p)
            ptx_offset = (tid // 8) * 128 + (((tid % 8) ^ ((tid // 8) % 8)) * 16) + p * 4096
            assert ptx_offset == w.sw128_offset(row, 16 * chunk)


def test_shared_memory_plan_keeps_tiles_aligned():
    assert stage.A_TILE % 1024 == 0 and stage.B_TILE % 1024 == 0 and stage.B_REGION % 1024 == 0
    assert stage.SA_REGION % 16 == 0 and stage.SHARED_BYTES <= 227 * 1024


def test_gemm_launches_with_the_kernel_signature(monkeypatch, rng):
    from ptx.runtime import kernel_params
    m, n, k = 100, 2112, 512
    a, sa, b, sb = random_problem(m, n, k, rng)  # sa: M-major view of (Kb, align(M, 4)) storage
    d = np.zeros((m, n), np.uint16)
    kernel = RecordingKernel()
    monkeypatch.setattr(stage, "_kernel", lambda *shape: kernel)
    stage.gemm(*map(on_fake_device, (a, sa, b, sb, d)), stream=7)
    (call,) = kernel.launches
    assert call["grid"] == stage.grid(m, n) == (17, 1, 1) and call["block"] == stage.THREADS
    assert call["shared_bytes"] == stage.SHARED_BYTES and call["stream"] == 7
    pointers = [x.__array_interface__["data"][0] for x in (a, sa, b, sb, d)]
    assert call["args"] == [*pointers, align(m, 4)]
    assert [t for t, _ in kernel_params(stage.generate(m, n, k), stage.KERNEL)] == ["u64"] * 5 + ["u32"]


# ------------------------------------------------------------------------------ CPU: the PTX, emulated
def emulate(module, a, sa, b, sb):
    from ptx.emulate import run_kernel
    m, k = a.shape
    n = b.shape[0]
    d = np.full((m, n), BF16_NAN, np.uint16)
    run_kernel(module.generate(m, n, k), module.KERNEL, module.grid(m, n), module.THREADS, module.SHARED_BYTES,
               dict(a=np.ascontiguousarray(a).view(np.uint8), sa=sa_storage(sa, m),
                    b=np.ascontiguousarray(b).view(np.uint8), sb=np.ascontiguousarray(sb, np.float32), d=d,
                    sa_stride=align(m, 4)))
    return bf16_to_float(d)


@pytest.mark.parametrize("m, n, k", [(128, 128, 384), (100, 136, 256), (1, 8, 128)])
def test_emulated_kernel_is_exact_on_small_integers(m, n, k, rng):
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(emulate(stage, *problem), problem)


@pytest.mark.parametrize("m, n, k", [(70, 257, 640), (130, 130, 128)])
def test_emulated_kernel_matches_reference(m, n, k, rng):
    a, sa, b, sb = random_problem(m, n, k, rng)
    got = emulate(stage, a, sa, b, sb)
    assert_no_unwritten(got)
    assert calc_diff(got, reference_gemm(a, sa, b, sb)) < 1e-5


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(128, 128, 128), (64, 64, 128), (128, 128, 640), (100, 136, 256)])
def test_debug_exact_small_integers(m, n, k, rng):
    """One block first: bit-exact against the BF16-rounded reference; a failure names rows/cols/warps."""
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(run_on_gpu(stage, *problem), problem)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", RAGGED_SHAPES)
def test_ragged_shapes_match_reference(m, n, k, rng):
    a, sa, b, sb = random_problem(m, n, k, rng)
    check_against_reference(run_on_gpu(stage, a, sa, b, sb), a, sa, b, sb, rng)
