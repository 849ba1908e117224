"""Swap AB (KernelConfig.swap_ab): B's rows as wgmma's 64-row side, A's few rows as its N, D written back
transposed with stmatrix .trans. The emulator's stmatrix .trans against the ISA's definition; exact answers on the
emulator (ragged M, N and K, split K, a persistent walk, random schedules); clean assembly; misuse named (CPU);
ragged shapes with poisoned outputs and bit-identity with stage 06 (GPU)."""
import sys
from pathlib import Path

import numpy as np
import pytest

import lessons
from gemm.heuristics import H100
from gemm.kernel import KERNEL, KernelConfig, generate
from gemm.testing.problems import random_problem

sys.path.insert(0, str(Path(__file__).parent))
from tc_checks import (RAGGED_SHAPES, assert_clean_resources, assert_exact, check_against_reference,  # noqa: E402
                       run_on_gpu, small_integer_problem)

SWAP_CASES = [  # (M, N, K, config fields): tokens 1-70, ragged N and K, one and two math warpgroups
    (1, 136, 640, dict(block_m=8, block_n=64, stages=2)),
    (20, 200, 384, dict(block_m=16, block_n=128, stages=3)),
    (5, 72, 272, dict(block_m=32, block_n=64, stages=2)),  # K = 272: a zero-filled last K block
    (40, 136, 512, dict(block_m=64, block_n=64, stages=2, split_k=2)),
    (3, 200, 1152, dict(block_m=8, block_n=128, stages=2, split_k=4)),
    (37, 328, 640, dict(block_m=16, block_n=64, stages=3, persistent=True, raster_group=8)),  # several tiles a CTA
    (64, 64, 16, dict(block_m=64, block_n=64, stages=2)),  # one tile, K = 16: one zero-filled K block
    (100, 1600, 384, dict(block_m=8, block_n=64, stages=2, persistent=True, raster_group=8)),  # 325 tiles, 3 CTAs
    (9, 136, 1152, dict(block_m=16, block_n=64, stages=2, split_k=8)),  # nine K blocks over eight CTAs
    (16, 200, 1152, dict(block_m=16, block_n=64, stages=2, split_k=3)),  # clusters of three, ragged N
    (20, 136, 1152, dict(block_m=32, block_n=64, stages=2, split_k=3)),  # 32 token rows, 20 of them, over three
    (30, 200, 640, dict(block_m=32, block_n=128, stages=2, early_poll=False, uniform_offsets=False, pdl=True)),
]


def swap_config(**fields) -> KernelConfig:
    fields.setdefault("persistent", False)
    fields.setdefault("raster_group", 0)
    return KernelConfig(swap_ab=True, **fields)


def test_stmatrix_trans_stores_each_matrix_transposed_on_the_emulator():
    """PTX ISA "stmatrix" with .trans: the element a lane holds at (row r, column c) of matrix j lands at row c's
    address (given by lane 8j + c) + 2 r. One warp stores four distinct matrices into distinct rows."""
    from ptx.builder import KernelBuilder, module
    from ptx.emulate import run_kernel
    from ptx.vocab import shared_memory
    from ptx.vocab import wgmma as w
    kb = KernelBuilder("trans", params=[("u64", "out")], max_threads=32)
    e, r = kb.emit, kb.reg
    lane, base, address, low, column, out = r("u32"), r("u32"), r("u32"), r("u32"), r("u32"), r("u64")
    regs = kb.regs("b32", 4)
    e(f"mov.u32 {lane}, %tid.x;", shared_memory.shared_address_of(base, "smem"),
      f"mad.lo.u32 {address}, {lane}, 16, {base};",  # lane l names row l % 8 of matrix l / 8: 16-byte rows
      f"shr.u32 {low}, {lane}, 2;", f"mul.lo.u32 {low}, {low}, 10;",  # 10 (row l / 4)
      f"and.b32 {column}, {lane}, 3;", f"mad.lo.u32 {low}, {column}, 2, {low};")  # + column 2 (l % 4)
    for j, reg in enumerate(regs):  # matrix j's element (row, column) is 1000 j + 10 row + column
        high = r("u32")
        e(f"add.u32 {reg}, {low}, {1000 * j};", f"add.u32 {high}, {reg}, 1;", f"shl.b32 {high}, {high}, 16;",
          f"or.b32 {reg}, {reg}, {high};")
    e(w.stmatrix(regs, address, transpose=True), "bar.sync 0;")
    out_address, word = r("u64"), r("u32")
    e(f"ld.param.u64 {out}, [{kb.param('out')}];")
    for i in range(4):  # copy the 512 bytes out, 4 bytes a lane at a time
        e(f"mad.lo.u32 {address}, {lane}, 4, {base};", f"ld.shared.u32 {word}, [{address}+{128 * i}];",
          f"mul.wide.u32 {out_address}, {lane}, 4;", f"add.u64 {out_address}, {out_address}, {out};",
          f"st.global.u32 [{out_address}+{128 * i}], {word};")
    ptx = module([kb], extra_globals=shared_memory.dynamic_shared_declaration("smem", align=1024))
    out = np.zeros(256, np.uint16)
    run_kernel(ptx, "trans", (1,), 32, 1024, dict(out=out))
    stored = out.reshape(4, 8, 8)  # matrix j, shared row, element
    rows, columns = np.meshgrid(np.arange(8), np.arange(8), indexing="ij")
    for j in range(4):  # shared row c holds column c of matrix j: element r of it is (row r, column c)
        assert np.array_equal(stored[j], 1000 * j + 10 * columns + rows), stored[j]


@pytest.mark.parametrize("seed", [None, 1, 2])
@pytest.mark.parametrize("m, n, k, fields", SWAP_CASES)
def test_swap_ab_on_the_emulator(m, n, k, fields, seed, rng):
    """Exact against the BF16-rounded reference, every element written (NaN-poisoned D), under round-robin and
    random schedules: a column scale read from the wrong token, a weight block scale from the wrong K block, or a
    transposed store landing in the wrong row is a wrong answer here."""
    from gemm.testing.emulated import run_gemm
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(run_gemm(swap_config(**fields), *problem, sm_count=3, seed=seed), problem)


@pytest.mark.parametrize("m, n, k, block_m, block_n, split_k", [
    (1, 7168, 2048, 8, 64, 1), (16, 2112, 7168, 16, 64, 2), (64, 7168, 16384, 64, 128, 1), (32, 4096, 7168, 32, 64, 1)])
def test_swap_ab_kernels_assemble_clean(m, n, k, block_m, block_n, split_k):
    """No spills, no warning; the wgmma's N is the token tile, and the epilogue's stmatrix is the transposing one
    (SASS STSM.16.MT88, where the plain one is STSM.16.M88)."""
    from ptx.compile import compile_ptx
    from ptx.sass import disassemble, opcode_counts
    config = swap_config(block_m=block_m, block_n=block_n, stages=8, split_k=split_k)
    ptx = generate(config, n, k)
    assert f"m64n{block_m}k32" in ptx and ".trans.shared.b16" in ptx
    cubin = compile_ptx(ptx)
    assert_clean_resources(cubin, KERNEL)
    assert not cubin.warnings, cubin.warnings
    sass = [i.text for i in disassemble(cubin)]
    stores = [t.split()[0] for t in sass if t.startswith("STSM")]
    assert stores and all(".MT88" in opcode for opcode in stores), stores
    assert opcode_counts(disassemble(cubin))["QGMMA"] >= 4


@pytest.mark.parametrize("fields, words", [
    (dict(block_m=24, block_n=64), "one of \\(8, 16, 32, 64\\)"),
    (dict(block_m=128, block_n=64), "one of \\(8, 16, 32, 64\\)"),
    (dict(block_m=16, block_n=56), "64 or 128"),
    (dict(block_m=16, block_n=64, multicast=2, persistent=True), "multicast=1"),
    (dict(block_m=16, block_n=64, epilogue="staged"), "epilogue='tma'"),
    (dict(block_m=16, block_n=64, out_dtype="f32"), "out_dtype='bf16'"),
    (dict(block_m=16, block_n=64, accumulators=2), "accumulators=1"),
    (dict(block_m=16, block_n=64, gemm_type="contiguous"), "gemm_type='normal' or 'masked', got 'contiguous'"),
    (dict(block_m=16, block_n=64, b_scales="1x128"), "b_scales='128x128'"),
    (dict(block_m=16, block_n=64, l2_prefetch=4), "l2_prefetch=0"),
    (dict(block_m=16, block_n=64, d_buffer=(16, 64)), "d_buffer=None"),
    (dict(block_m=16, block_n=64, producer="inline", registers=None), "producer='warpgroup'"),
])
def test_swap_ab_misuse_is_named(fields, words):
    """Each field the swapped kernel does not take is named in the error, with what it needs."""
    with pytest.raises(ValueError, match=words):
        swap_config(**fields)


def test_swap_ab_refuses_the_wave_offset_seam():
    """The seam places 64-row waves of A; a swapped tile has one wave of B rows, so it is refused, not ignored."""
    from gemm.kernel.seams import Seams
    with pytest.raises(ValueError, match="wave_offset"):
        generate(swap_config(block_m=16, block_n=64, stages=2), 136, 256, Seams(wave_offset=lambda wave, groups: 0))


def test_swap_ab_shared_plan_pads_the_scale_tiles_for_tma():
    """8 tokens' scales are 32 bytes a stage: each stage's tile still starts 128-byte aligned (a TMA destination)."""
    from gemm.kernel import SharedPlan
    plan = SharedPlan(swap_config(block_m=8, block_n=64, stages=12), 7168, 2048)
    assert plan.sa_tile == 32 and plan.sa_tile_pitch == 128 and plan.stage_bytes == 8 * 128 + 64 * 128 + 32
    assert plan.sa_region % 128 == 0 and plan.shared_bytes <= H100.shared_limit


# ------------------------------------------------------------------------------ GPU
def _configured(config):
    from types import SimpleNamespace
    from gemm.api import gemm
    return SimpleNamespace(gemm=lambda a, sa, b, sb, d, stream=None: gemm(a, sa, b, sb, d, stream, config=config))


GPU_SWAP_CONFIGS = {
    "8x64": dict(block_m=8, block_n=64, stages=10),
    "16x128": dict(block_m=16, block_n=128, stages=8),
    "32x64 split 2": dict(block_m=32, block_n=64, stages=6, split_k=2),
    "64x64 persistent": dict(block_m=64, block_n=64, stages=6, persistent=True, raster_group=8),
}


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(m, n, k) for m, n, k in RAGGED_SHAPES if n % 8 == 0]
                         + [(1, 7168, 2048), (16, 2112, 7168), (5, 24576, 1536), (64, 4096, 7168)])
@pytest.mark.parametrize("name", list(GPU_SWAP_CONFIGS))
def test_swap_ab_on_ragged_shapes(name, m, n, k, rng):
    """Random inputs, D poisoned with NaN: every element written, diff < 1e-3 against the float64 reference."""
    config = swap_config(**GPU_SWAP_CONFIGS[name])
    a, sa, b, sb = random_problem(m, n, k, rng)
    check_against_reference(run_on_gpu(_configured(config), a, sa, b, sb), a, sa, b, sb, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(1, 136, 640), (20, 256, 1152), (64, 200, 384)])
def test_swap_ab_is_exact_against_stage06_on_small_integers(m, n, k, rng):
    problem = small_integer_problem(m, n, k, rng)
    for name, fields in GPU_SWAP_CONFIGS.items():
        got = run_on_gpu(_configured(swap_config(**fields)), *problem)
        assert_exact(got, problem)
    assert_exact(run_on_gpu(lessons.stage(6), *problem), problem)
