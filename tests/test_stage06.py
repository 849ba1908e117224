"""Stage 06 (TMA + mbarrier pipeline): assembles for sm_90a with QGMMA, UTMALDG and SYNCS and without spills,
plans its shared memory within budget (CPU); runs correctly in the CPU emulator (TMA boxes, swizzle,
transaction counts, barrier parities: a wrong parity deadlocks there); matches the reference on an H100 (GPU)."""
import sys
from pathlib import Path

import numpy as np
import pytest

import lessons
from gemm.fp8 import align, bf16_to_float, calc_diff
from gemm.testing.problems import random_problem, reference_gemm

sys.path.insert(0, str(Path(__file__).parent))  # tests/tc_checks.py
from tc_checks import (ASSEMBLY_SHAPES, BF16_NAN, RAGGED_SHAPES, RecordingKernel, on_fake_device,  # noqa: E402
                       assemble, assert_clean_resources, assert_exact, assert_graph_replay, assert_no_unwritten,
                       check_against_reference, run_on_gpu, sa_storage, small_integer_problem)

stage = lessons.stage(6)


# ------------------------------------------------------------------------------ CPU: assembly and SASS
@pytest.mark.parametrize("m, n, k", ASSEMBLY_SHAPES + [(1, 2112, 512), (257, 2112, 512)])
def test_assembles_without_spills_with_qgmma_tma_and_mbarriers(m, n, k):
    cubin, sass = assemble(stage, m, n, k)
    assert_clean_resources(cubin, stage.KERNEL)
    plan = stage.Plan(m, n, k)
    qgmma = [i.text for i in sass if i.opcode == "QGMMA"]
    assert qgmma and all(f"QGMMA.64x{plan.block_n}x32.F32.E4M3.E4M3" in text for text in qgmma), qgmma[:2]
    opcodes = {i.opcode for i in sass}
    assert "UTMALDG" in opcodes and "SYNCS" in opcodes
    assert "LDGSTS" not in opcodes  # no thread-issued operand copies left


@pytest.mark.parametrize("m, n", [(4096, 7168), (64, 7168), (128, 2112), (1, 2112), (4096, 2112)])
def test_plan_fits_the_budget_and_aligns_tiles(m, n):
    plan = stage.Plan(m, n, 16384)
    assert plan.shared_bytes <= 227 * 1024 and 3 <= plan.stages <= stage.MAX_STAGES
    assert plan.a_tile % 1024 == 0 and plan.b_tile % 1024 == 0 and plan.b_region % 1024 == 0
    assert plan.sa_region % 128 == 0 and plan.sa_tile % 128 == 0 and plan.full_region % 8 == 0
    assert plan.stage_bytes == plan.block_m * 128 + plan.block_n * 128 + plan.block_m * 4  # expect_tx bytes
    assert plan.threads == 2 * plan.block_m


def test_block_heuristic():
    assert stage.choose_blocks(64, 7168) == (64, 64)  # 56 blocks of 128 would leave SMs idle
    assert stage.choose_blocks(4096, 7168) == (128, 128)
    assert stage.choose_blocks(128, 24576) == (128, 128)
    assert stage.choose_blocks(128, 7168) == (128, 64)  # 112 blocks
    assert stage.choose_blocks(128, 2112) == (64, 64)  # 128 x 64 would be 33 blocks, 64 x 64 gives 66
    assert stage.choose_blocks(1, 2112) == (64, 64)


def test_k_must_be_a_multiple_of_128():
    with pytest.raises(ValueError, match="multiple of 128"):
        stage.generate(128, 128, 100)


def test_gemm_launches_with_the_kernel_signature(monkeypatch, rng):
    import ptx.tensor_maps
    from ptx.runtime import kernel_params
    m, n, k = 100, 2112, 512
    a, sa, b, sb = random_problem(m, n, k, rng)  # sa: M-major view of (Kb, align(M, 4)) storage
    d = np.zeros((m, n), np.uint16)
    plan, kernel, encoded = stage.Plan(m, n, k), RecordingKernel(), []

    def fake_tensor_map_2d(ptr, dtype, shape, row_stride_bytes, box, swizzle=128):
        encoded.append((ptr, np.dtype(dtype), shape, row_stride_bytes, box, swizzle))
        return ptx.tensor_maps.TensorMap(bytes(128), np.dtype(dtype), shape, box, swizzle)

    monkeypatch.setattr(stage, "_kernel", lambda *shape: (kernel, plan))
    monkeypatch.setattr(ptx.tensor_maps, "tensor_map_2d", fake_tensor_map_2d)
    stage._tensor_maps.cache_clear()
    stage.gemm(*map(on_fake_device, (a, sa, b, sb, d)))
    stage._tensor_maps.cache_clear()
    (call,) = kernel.launches
    pointer = lambda x: x.__array_interface__["data"][0]  # noqa: E731
    assert encoded == [
        (pointer(a), np.dtype(np.uint8), (m, k), k, (plan.block_m, 128), 128),
        (pointer(b), np.dtype(np.uint8), (n, k), k, (plan.block_n, 128), 128),
        (pointer(sa), np.dtype(np.float32), (k // 128, m), 4 * align(m, 4), (1, plan.block_m), 0),
    ]
    assert call["grid"] == plan.grid and call["block"] == plan.threads and call["shared_bytes"] == plan.shared_bytes
    assert call["args"][3:] == [pointer(sb), pointer(d)]
    assert all(isinstance(x, ptx.tensor_maps.TensorMap) for x in call["args"][:3])
    assert kernel_params(stage.generate(m, n, k), stage.KERNEL) == [("b8", 128)] * 3 + [("u64", 0)] * 2


# ------------------------------------------------------------------------------ CPU: the PTX, emulated
def emulate(a, sa, b, sb, blocks=None):
    from ptx.emulate import FakeTensorMap, run_kernel
    m, k = a.shape
    n = b.shape[0]
    plan = stage.Plan(m, n, k, blocks)
    sa_bytes = sa_storage(sa, m)
    arrays = {"tmap_a": np.ascontiguousarray(a).view(np.uint8), "tmap_b": np.ascontiguousarray(b).view(np.uint8),
              "tmap_sa": sa_bytes}
    maps = {name: FakeTensorMap(arrays[name], np.dtype(spec["dtype"]), spec["shape"], spec["row_stride_bytes"],
                                spec["box"], spec["swizzle"])
            for name, spec in stage.tensor_map_specs(plan, align(m, 4)).items()}
    d = np.full((m, n), BF16_NAN, np.uint16)
    run_kernel(stage.generate_for(plan), stage.KERNEL, plan.grid, plan.threads, plan.shared_bytes,
               dict(**maps, sb=np.ascontiguousarray(sb, np.float32), d=d))
    return bf16_to_float(d)


@pytest.mark.parametrize("m, n, k, blocks", [
    (128, 128, 1152, (128, 128)),  # more K blocks than stages: the ring wraps, parities flip
    (100, 136, 256, None),         # ragged M and N, one warpgroup's rows partly out of range
    (64, 64, 128, None),           # one K block: prologue only
    (70, 200, 1280, (64, 128)),    # one warpgroup, 128-wide N, many wraps
    (150, 100, 384, (128, 64)),    # two warpgroups, 64-wide N, second M block mostly out of range
])
def test_emulated_kernel_is_exact_on_small_integers(m, n, k, blocks, rng):
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(emulate(*problem, blocks=blocks), problem)


@pytest.mark.parametrize("m, n, k", [(130, 257, 640), (1, 2111, 256)])
def test_emulated_kernel_matches_reference(m, n, k, rng):
    a, sa, b, sb = random_problem(m, n, k, rng)
    got = emulate(a, sa, b, sb)
    assert_no_unwritten(got)
    assert calc_diff(got, reference_gemm(a, sa, b, sb)) < 1e-5


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(128, 128, 128), (64, 64, 128), (128, 128, 1152), (100, 136, 256)])
def test_debug_exact_small_integers(m, n, k, rng):
    """One block first: bit-exact against the BF16-rounded reference; a failure names rows/cols/warps."""
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(run_on_gpu(stage, *problem), problem)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", RAGGED_SHAPES)
def test_ragged_shapes_match_reference(m, n, k, rng):
    a, sa, b, sb = random_problem(m, n, k, rng)
    check_against_reference(run_on_gpu(stage, a, sa, b, sb), a, sa, b, sb, rng)


@pytest.mark.gpu
def test_second_call_compiles_nothing_and_replays_in_a_cuda_graph(rng):
    assert_graph_replay(stage, rng, check_no_compile=True)
