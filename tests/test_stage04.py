"""Stage 04 (mma.sync).

CPU: fragment-layout math vs the PTX ISA tables; the generated PTX assembled for sm_90a (no spills, the
expected SASS opcodes); the generated PTX *run* by ptx.emulate.lockstep against the float64 reference.
GPU (H100): an exact small-integer debug case, all 18 DeepSeek shapes (M=4096 ones marked slow), ragged
shapes, and replay inside a CUDA graph."""
import sys
from pathlib import Path

import numpy as np
import pytest

import lessons
from gemm.fp8 import align, bf16_to_float, calc_diff
from gemm.testing.problems import random_problem, reference_gemm
from ptx.vocab import async_copies, mma_sync, shared_memory

stage = lessons.stage(4)
sys.path.insert(0, str(Path(__file__).parent))  # tests/tc_checks.py
from tc_checks import (BF16_NAN, RAGGED_SHAPES, assert_exact, assert_graph_replay,  # noqa: E402
                       assert_no_unwritten, check_against_reference, mma_sync_places, run_on_gpu, sa_storage,
                       small_integer_problem)


# ------------------------------------------------------------------------------ layouts vs the PTX ISA
# The ISA's own formulas for mma.m16n8k32 with 8-bit types, element index i = 4 * register + byte.
def isa_a(lane, i):
    group, tig = lane >> 2, lane % 4
    row = group if (0 <= i < 4 or 8 <= i < 12) else group + 8
    col = tig * 4 + (i & 0x3) if i < 8 else tig * 4 + (i & 0x3) + 16
    return row, col


def isa_b(lane, i):  # returns (row = k, col = n) as the ISA writes it
    group, tig = lane >> 2, lane % 4
    row = tig * 4 + (i & 0x3) if i < 4 else tig * 4 + (i & 0x3) + 16
    return row, group


def isa_c(lane, i):
    group, tig = lane >> 2, lane % 4
    return (group if i < 2 else group + 8), tig * 2 + (i & 0x1)


def test_fragment_layouts_match_the_isa_formulas():
    for lane in range(32):
        for i in range(16):
            assert mma_sync.a_fragment_coords(lane, i // 4, i % 4) == isa_a(lane, i)
        for i in range(8):
            k, n = isa_b(lane, i)
            assert mma_sync.b_fragment_coords(lane, i // 4, i % 4) == (n, k)
        for i in range(4):
            assert mma_sync.c_fragment_coords(lane, i) == isa_c(lane, i)


def test_fragment_layouts_spot_values_from_the_isa_figures():
    # lane 5: groupID 1, threadID_in_group 1
    assert [mma_sync.a_fragment_coords(5, r, 0) for r in range(4)] == [(1, 4), (9, 4), (1, 20), (9, 20)]
    assert [mma_sync.b_fragment_coords(5, r, 3) for r in range(2)] == [(1, 7), (1, 23)]
    assert [mma_sync.c_fragment_coords(31, i) for i in range(4)] == [(7, 6), (7, 7), (15, 6), (15, 7)]


@pytest.mark.parametrize("coords, shape", [(mma_sync.a_fragment_coords, (16, 32)), (mma_sync.b_fragment_coords, (8, 32))])
def test_every_element_is_held_exactly_once(coords, shape):
    registers = 4 if shape[0] == 16 else 2
    held = [coords(lane, r, byte) for lane in range(32) for r in range(registers) for byte in range(4)]
    assert sorted(held) == [(i, j) for i in range(shape[0]) for j in range(shape[1])]


def _through_ldmatrix(source, lane, register, byte):
    """Which (row, k) of the tile lands in byte `byte` of result `register` of `lane`, by the ldmatrix rules:
    result register j is matrix j; matrix j's row r is the 16 bytes at the address lane 8j + r supplied."""
    row_in_matrix, byte_in_row = mma_sync.ldmatrix_received(lane, byte)
    supplier = next(s for s in range(32) if mma_sync.ldmatrix_x4_address_role(s) == (register, row_in_matrix))
    row, k_byte = source(supplier)
    return row, k_byte + byte_in_row


def test_ldmatrix_addressing_yields_the_a_fragment():
    for lane in range(32):
        for reg in range(4):
            for byte in range(4):
                assert _through_ldmatrix(mma_sync.a_ldmatrix_source, lane, reg, byte) == mma_sync.a_fragment_coords(lane, reg, byte)


def test_ldmatrix_addressing_yields_two_b_fragments():
    for lane in range(32):
        for reg in range(4):  # registers 0, 1: first n8 tile; 2, 3: second (n + 8)
            for byte in range(4):
                n, k = mma_sync.b_fragment_coords(lane, reg % 2, byte)
                assert _through_ldmatrix(mma_sync.b_ldmatrix_source, lane, reg, byte) == (n + 8 * (reg // 2), k)


def test_swizzle_is_a_permutation_and_ldmatrix_phases_are_conflict_free():
    offsets = {shared_memory.swizzled_offset(row, chunk * 16) for row in range(128) for chunk in range(8)}
    assert offsets == set(range(0, 128 * 128, 16))
    for first_row in range(0, 128, 8):
        for chunk in range(8):  # one ldmatrix phase: 8 consecutive rows at the same logical chunk
            banks = {(shared_memory.swizzled_offset(first_row + r, chunk * 16) // 16) % 8 for r in range(8)}
            assert len(banks) == 8


def test_generator_address_math_matches_the_swizzled_layout():
    for tid in range(stage.THREADS):
        for p in range(stage.LOAD_PASSES):
            row, chunk = stage.load_slot(tid, p)
            assert stage.load_shared_offset(tid, p) == shared_memory.swizzled_offset(row, 16 * chunk)
    for lane in range(32):
        for ks in range(stage.K_STEPS):
            for warp_m in range(stage.WARPS_M):
                for mt in range(stage.M_TILES):
                    row, k_byte = mma_sync.a_ldmatrix_source(lane)
                    expected = shared_memory.swizzled_offset(warp_m * 64 + mt * 16 + row, 32 * ks + k_byte)
                    assert stage.a_fragment_offset(warp_m, lane, mt, ks) == expected
            for warp_n in range(stage.WARPS_N):
                for pair in range(stage.N_TILES // 2):
                    n, k_byte = mma_sync.b_ldmatrix_source(lane)
                    expected = shared_memory.swizzled_offset(warp_n * 32 + pair * 16 + n, 32 * ks + k_byte)
                    assert stage.b_fragment_offset(warp_n, lane, pair, ks) == expected


def test_emulated_block_delivers_the_right_fragments(rng):
    """Copy a random 128x128 tile into 'shared memory' as the cp.async pattern does, read it back as every
    warp's ldmatrix does, and check each fragment byte against the tile element the mma expects there."""
    tile = rng.integers(0, 256, (128, 128), dtype=np.uint8)
    smem = np.full(128 * 128, -1, dtype=np.int32)
    for tid in range(stage.THREADS):
        for p in range(stage.LOAD_PASSES):
            row, chunk = stage.load_slot(tid, p)
            offset = stage.load_shared_offset(tid, p)
            smem[offset:offset + 16] = tile[row, 16 * chunk:16 * chunk + 16]
    assert (smem >= 0).all(), "the cp.async pattern left holes in the tile"

    def ldmatrix(addresses):
        rows = [smem[a:a + 16] for a in addresses]
        return [[rows[8 * j + lane // 4][4 * (lane % 4):4 * (lane % 4) + 4] for j in range(4)] for lane in range(32)]

    for ks in range(stage.K_STEPS):
        for warp_m in range(stage.WARPS_M):
            for mt in range(stage.M_TILES):
                regs = ldmatrix([stage.a_fragment_offset(warp_m, lane, mt, ks) for lane in range(32)])
                for lane in range(32):
                    for reg in range(4):
                        for byte in range(4):
                            row, k = mma_sync.a_fragment_coords(lane, reg, byte)
                            assert regs[lane][reg][byte] == tile[warp_m * 64 + mt * 16 + row, 32 * ks + k]
        for warp_n in range(stage.WARPS_N):
            for pair in range(stage.N_TILES // 2):
                regs = ldmatrix([stage.b_fragment_offset(warp_n, lane, pair, ks) for lane in range(32)])
                for lane in range(32):
                    for reg in range(4):
                        for byte in range(4):
                            n, k = mma_sync.b_fragment_coords(lane, reg % 2, byte)
                            n_tile = 2 * pair + reg // 2
                            assert regs[lane][reg][byte] == tile[warp_n * 32 + n_tile * 8 + n, 32 * ks + k]


def test_idioms_text():
    assert async_copies.cp_async_16("%r1", "%rd2", 16, src_size="%r3", predicate="%p1") == \
        "@%p1 cp.async.cg.shared.global [%r1+16], [%rd2], 16, %r3;"
    assert async_copies.cp_async_wait(1) == "cp.async.wait_group 1;"
    assert mma_sync.ldmatrix_x4(["%a", "%b", "%c", "%d"], "%r", 2048) == \
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%a, %b, %c, %d}, [%r+2048];"
    assert mma_sync.mma_m16n8k32_e4m3(list("dddd"), list("aaaa"), list("bb"), list("cccc")).startswith(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {d, d, d, d}, {a, a, a, a}, {b, b}")


# ------------------------------------------------------------------------------ generated PTX -> SASS
@pytest.mark.parametrize("m, n, k", [(4096, 4096, 7168), (100, 2112, 512), (1, 2112, 512), (100, 2111, 256),
                                     (64, 7168, 16384), (128, 128, 128)])
def test_assembles_without_spills_and_uses_tensor_cores(m, n, k):
    from ptx.compile import compile_ptx
    from ptx.sass import disassemble, opcode_counts
    cubin = compile_ptx(stage.generate(m, n, k))
    res = cubin.resources[stage.KERNEL]
    assert res.spill_stores == res.spill_loads == 0, res
    assert res.stack_frame == 0 and res.local_bytes == 0, res
    assert res.registers <= 255
    instructions = disassemble(cubin, stage.KERNEL)
    ops = opcode_counts(instructions)
    texts = " ".join(i.text for i in instructions)
    per_block = stage.M_TILES * stage.N_TILES * stage.K_STEPS  # mma.sync per warp per K block
    # Hopper has no FP8 mma.sync datapath: each m16n8k32 e4m3 becomes e4m3->f16 unpacks and two HMMA.16816.
    assert ops["HMMA"] >= 2 * per_block and "HMMA.16816.F32" in texts
    assert ops["F2FP"] > 0 and "E4M3" in texts
    assert ops["LDSM"] >= stage.K_STEPS * (stage.M_TILES + stage.N_TILES // 2)  # ldmatrix
    assert ops["LDGSTS"] >= 2 * stage.LOAD_PASSES  # cp.async
    assert ops["FFMA"] >= stage.M_TILES * stage.N_TILES * 4  # the promotion
    assert ops["BAR"] >= 1


def test_generate_bakes_the_shape_and_is_cached():
    text = stage.generate(100, 2112, 512)
    assert text is stage.generate(100, 2112, 512)
    assert "min.u32" in text and "setp.lt.u32" in text  # ragged M: clamped rows, masked stores
    assert "min.u32" not in stage.generate(256, 256, 256)  # aligned shapes need no clamping
    with pytest.raises(ValueError, match="multiple of 128"):
        stage.generate(128, 128, 100)


def test_gemm_rejects_k_not_multiple_of_128(rng):
    from tc_checks import on_fake_device  # past the device check, which comes before shapes
    a, sa, b, sb = random_problem(8, 8, 256, rng)
    with pytest.raises(ValueError, match="multiple of 128"):
        stage.gemm(*map(on_fake_device, (np.ascontiguousarray(a[:, :200]), sa, np.ascontiguousarray(b[:, :200]),
                                         sb, np.zeros((8, 8), np.uint16))))


def test_stage_contract():
    assert stage.KIND == "ptx" and stage.IDEA and "Measured:" in stage.__doc__


# ------------------------------------------------------------------------------ the PTX text, run on the CPU
def _emulate(a, sa, b, sb):
    """Run the generated PTX in ptx.emulate.lockstep; returns D as float32 (NaN where never written)."""
    from ptx.emulate.lockstep import run_kernel
    m, k = a.shape
    n = b.shape[0]
    d = np.full((m, n), BF16_NAN, np.uint16)
    run_kernel(stage.generate(m, n, k), stage.KERNEL, stage.grid(m, n), stage.THREADS, stage.SHARED_BYTES,
               dict(a=np.ascontiguousarray(a).view(np.uint8), sa=sa_storage(sa, m),  # the real layout's bytes
                    b=np.ascontiguousarray(b).view(np.uint8), sb=np.ascontiguousarray(sb, np.float32), d=d,
                    sa_stride=align(m, 4)))
    return bf16_to_float(d)


@pytest.mark.parametrize("m, n, k", [(100, 136, 640), (1, 8, 128), (256, 128, 256), (70, 257, 256)])
def test_emulated_kernel_matches_reference(m, n, k, rng):
    a, sa, b, sb = random_problem(m, n, k, rng)
    got = _emulate(a, sa, b, sb)
    assert_no_unwritten(got)
    assert calc_diff(got, reference_gemm(a, sa, b, sb)) < 1e-5


@pytest.mark.parametrize("m, n, k", [(128, 128, 384), (100, 136, 256)])
def test_emulated_kernel_is_exact_on_small_integers(m, n, k, rng):
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(_emulate(*problem), problem, mma_sync_places)


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(128, 128, 128), (128, 128, 384), (100, 136, 256)])
def test_debug_exact_small_integers(m, n, k, rng):
    """One block first: D must equal the BF16-rounded float64 reference bit for bit; a failure names the
    fragment rows/columns (row % 16, col % 8) and warps that are off."""
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(run_on_gpu(stage, *problem), problem, mma_sync_places)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", RAGGED_SHAPES)  # the 18 DeepSeek shapes: tests/test_deepseek_shapes.py
def test_matches_reference(m, n, k, rng):
    a, sa, b, sb = random_problem(m, n, k, rng)
    check_against_reference(run_on_gpu(stage, a, sa, b, sb), a, sa, b, sb, rng)


@pytest.mark.gpu
def test_second_call_replays_in_a_cuda_graph(rng):
    assert_graph_replay(stage, rng)
