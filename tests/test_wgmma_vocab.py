"""ptx.vocab.wgmma, ptx.vocab.barriers and ptx.vocab.bulk_copies against values worked out by hand from the PTX ISA (8.5) tables, and the
pipeline bookkeeping against a model of mbarrier phases."""
import pytest

from gemm.kernel.math_warpgroups import store_slots
from ptx.vocab import barriers, bulk_copies
from ptx.vocab import wgmma as w


# ------------------------------------------------------------------------------ matrix descriptor
def test_descriptor_bits_by_hand():
    # ISA "Matrix Descriptor Format": start 0x400 -> 0x40 in bits 0-13; LBO 16 -> 1 in bits 16-29;
    # SBO 1024 -> 0x40 in bits 32-45; 128B swizzle -> 1 in bits 62-63
    assert w.descriptor_bits(0x400, 16, 1024, 128) == 0x4000_0040_0001_0040
    # the largest start address (2**18 - 16) fills bits 0-13; no swizzle leaves bits 62-63 clear
    assert w.descriptor_bits(0x3FFF0, 0, 1024, 0) == 0x0000_0040_0000_3FFF
    # 64B swizzle = 2, 32B = 3, base offset 5 in bits 49-51
    assert w.descriptor_bits(0, 0, 0, 64) == 2 << 62
    assert w.descriptor_bits(0, 0, 0, 32) == 0xC000_0000_0000_0000
    assert w.descriptor_bits(0, 0, 0, 0, base_offset=5) == 0x000A_0000_0000_0000


def test_descriptor_rejects_unencodable_values():
    for bad in (dict(start_address=8), dict(start_address=1 << 18), dict(stride_byte_offset=1000)):
        args = dict(start_address=0, leading_byte_offset=16, stride_byte_offset=1024) | bad
        with pytest.raises(ValueError):
            w.descriptor_bits(**args)


def test_constant_part_plus_address_is_the_full_descriptor():
    for address in (0, 1024, 0x1_2400, 0x3_7C00):
        assert w.descriptor_constant_part() | (address >> 4) == w.descriptor_bits(address, 16, 1024, 128)


def test_descriptor_ptx_text():
    text = w.wgmma_descriptor("%rd1", "%r1", "%r2", 0x4000_0040_0001_0000)
    assert text.splitlines() == ["shr.u32 %r2, %r1, 4;", "and.b32 %r2, %r2, 16383;", "cvt.u64.u32 %rd1, %r2;",
                                 f"or.b64 %rd1, %rd1, {0x4000_0040_0001_0000};"]


# ------------------------------------------------------------------------------ 128B swizzle
def test_sw128_is_the_address_bit_xor():
    # 128B swizzle = XOR of address bits 4-6 with bits 7-9 (a 1024-byte-aligned tile of 128-byte rows)
    for row in range(64):
        for k_byte in range(128):
            linear = row * 128 + k_byte
            assert w.sw128_offset(row, k_byte) == linear ^ (((linear >> 7) & 7) << 4)


def test_sw128_spot_values():
    assert w.sw128_offset(0, 0) == 0 and w.sw128_offset(0, 17) == 17
    assert w.sw128_offset(1, 0) == 128 + 16  # row 1: chunk 0 stored at chunk 1
    assert w.sw128_offset(7, 112) == 7 * 128 + 0  # chunk 7 ^ 7 = 0
    assert w.sw128_offset(9, 35) == 9 * 128 + (2 ^ 1) * 16 + 3  # row 9 is row 1 of the second atom


# ------------------------------------------------------------------------------ accumulator fragment
def test_accumulator_spot_values_from_the_isa_figure():
    assert [w.accumulator_coords(0, 0, i) for i in range(6)] == [(0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9)]
    assert w.accumulator_coords(0, 5, 0) == (1, 2)  # lane 5: row 5 // 4, column 2 * (5 % 4)
    assert w.accumulator_coords(2, 31, 63) == (32 + 7 + 8, 120 + 6 + 1)


@pytest.mark.parametrize("n", [64, 128, 256])
def test_accumulators_cover_the_tile_once(n):
    held = [w.accumulator_coords(warp, lane, i) for warp in range(4) for lane in range(32) for i in range(n // 2)]
    assert sorted(held) == [(r, c) for r in range(64) for c in range(n)]


def test_wgmma_text():
    acc = [f"%f{i}" for i in range(64)]
    text = w.wgmma_e4m3(acc, "%rd1", "%rd2", "%p1")
    assert text.startswith("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%f0, %f1,")
    assert text.endswith("%f63}, %rd1, %rd2, %p1, 1, 1;")
    with pytest.raises(ValueError):
        w.wgmma_e4m3(acc[:3], "%rd1", "%rd2", "%p1")


@pytest.mark.parametrize("block_n", [64, 128])
@pytest.mark.parametrize("vec", [8, 2, 1])
def test_epilogue_copies_each_staged_element_once(block_n, vec):
    per_row = block_n // vec
    seen = []
    for it in range(16 * per_row // 32):
        for lane in range(32):
            row, col = store_slots(block_n, vec, lane, it)
            seen += [(row, col + e) for e in range(vec)]
            # the PTX splits the slot into a lane part (registers) and an iteration part (immediates)
            lane_row, lane_col = (lane // per_row, lane % per_row) if per_row < 32 else (0, lane)
            assert (row, col) == (it * 32 // per_row + lane_row, ((it * 32) % per_row + lane_col) * vec)
    assert sorted(seen) == [(r, c) for r in range(16) for c in range(block_n)]


# ------------------------------------------------------------------------------ pipeline bookkeeping
def test_pipeline_slots_by_hand():
    assert [barriers.pipeline_slot(i, 3) for i in range(8)] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (0, 0), (1, 0)]
    assert [barriers.producer_wait_parity(j, 3) for j in range(9)] == [1, 1, 1, 0, 0, 0, 1, 1, 1]


class PhaseModel:
    """An mbarrier as the ISA describes it: phases complete one after another; try_wait.parity(P) succeeds
    iff the phase with parity P has completed, i.e. the current (incomplete) phase has the other parity."""

    def __init__(self):
        self.completed = 0

    def try_wait_parity(self, parity):
        return self.completed % 2 != parity


@pytest.mark.parametrize("stages", [2, 3, 4, 6, 8])
def test_waits_pass_exactly_when_the_awaited_phase_completed(stages):
    for i in range(5 * stages):
        stage, parity = barriers.pipeline_slot(i, stages)
        full = PhaseModel()
        full.completed = i // stages + 1  # the loads of i are the (i // S)-th filling of its stage
        assert full.try_wait_parity(parity)
        full.completed = i // stages  # one short: must wait
        assert not full.try_wait_parity(parity)
        empty = PhaseModel()
        empty.completed = i // stages  # releases of i - S, i - 2S, ... have happened
        assert empty.try_wait_parity(barriers.producer_wait_parity(i, stages))
        if i >= stages:
            empty.completed = i // stages - 1  # the release of i - S is missing: must wait
            assert not empty.try_wait_parity(barriers.producer_wait_parity(i, stages))


@pytest.mark.parametrize("stages, start", [(3, 0), (6, 4), (8, 6), (2, 1)])
def test_loop_counters_follow_the_formulas(stages, start):
    """The PTX keeps (stage, parity) registers and advances them; they must equal the closed forms."""
    c_stage, c_parity = 0, 0
    p_stage, p_parity = start % stages, barriers.producer_wait_parity(start, stages)
    for i in range(4 * stages):
        assert (c_stage, c_parity) == barriers.pipeline_slot(i, stages)
        j = i + start
        assert (p_stage, p_parity) == (j % stages, barriers.producer_wait_parity(j, stages))
        c_stage, c_parity = barriers.advance(c_stage, c_parity, stages)
        p_stage, p_parity = barriers.advance(p_stage, p_parity, stages)


def test_tma_and_mbarrier_text():
    assert bulk_copies.tma_load_2d("%r1", "%rd1", "%r2", "%r3", "%r4") == (
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd1, {%r2, %r3}], [%r4];")
    assert barriers.mbarrier_arrive_expect_tx("%r1", 1024) == "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r1], 1024;"
    assert bulk_copies.tensormap_address("%rd1", "k_param_tmap").splitlines() == [
        "mov.b64 %rd1, k_param_tmap;", "cvta.param.u64 %rd1, %rd1;"]
    loop = barriers.mbarrier_wait_parity("%r1", "%r2", "%p1", "$w_1").splitlines()
    assert loop == ["$w_1:", "mbarrier.try_wait.parity.shared::cta.b64 %p1, [%r1], %r2;", "@!%p1 bra $w_1;"]
