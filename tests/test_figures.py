"""The figures' layout functions (lessons/figures/ and what it draws from), checked for the properties the
figures claim, and against the emulator running the kernels' own PTX: the addresses, descriptors and barrier
parities the figures show are the ones the generated code computes. Plus: every figure function draws, the
committed PNGs match their manifest, and rendering is deterministic. CPU only; ~10 s (the slow mark: ~10 s more)."""
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")

import lessons  # noqa: E402
from lessons import figures  # noqa: E402
from lessons.figures import committed  # noqa: E402
from lessons.figures.drawing import python_function  # noqa: E402
from ptx.vocab import barriers, mma_sync, shared_memory  # noqa: E402
from ptx.vocab import wgmma as w  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------ stages 01-03 (Numba)
@pytest.mark.parametrize("number, m, n", [(1, 16, 64), (1, 13, 70), (2, 64, 64), (2, 33, 95)])
def test_thread_maps_cover_d_exactly_once(number, m, n):
    data = figures.thread_output_map(number, m, n)
    assert (data["count"] == 1).all()
    stage = lessons.stage(number)
    width = stage.BLOCK_N if number == 1 else stage.TILE
    # a warp (fixed ty, 32 consecutive tx) is 32 consecutive columns of one row, and tx is the column offset
    cols = np.arange(n)
    assert (data["tx"] == cols % width).all()
    assert (data["block"] % -(-n // width) == cols // width).all()


def test_staging_covers_each_k_byte_once_with_consecutive_lanes():
    lanes = figures.staging_lanes()
    stage = lessons.stage(2)
    assert ((lanes >= 0).sum(0) == 1).all()  # every k byte of a tile row is decoded in exactly one step
    for step, row in enumerate(lanes):
        ks = np.flatnonzero(row >= 0)
        assert (ks == np.arange(step * stage.TILE, (step + 1) * stage.TILE)).all()  # 32 consecutive bytes
        assert (row[ks] == np.arange(stage.TILE)).all()  # by lanes 0..31 in order: coalesced


def test_shared_word_is_numbas_c_order_and_the_padding_removes_conflicts():
    stage = lessons.stage(2)
    for pitch in (stage.BLOCK_K, stage.B_PITCH):
        for row, k in [(0, 0), (5, 17), (31, pitch - 1)]:
            assert stage.shared_word(row, k, pitch) == np.ravel_multi_index((row, k), (stage.TILE, pitch))
    padded = figures.smem_banks(stage.B_PITCH, stage.TILE, stage.BLOCK_K)
    unpadded = figures.smem_banks(stage.BLOCK_K, stage.TILE, stage.BLOCK_K)
    assert all(len(set(padded[:, k])) == stage.BANKS for k in range(stage.BLOCK_K))  # b_tile[tx, k]: 32 banks
    assert all(len(set(unpadded[:, k])) == 1 for k in range(stage.BLOCK_K))  # unpadded: a 32-way conflict


def test_micro_tiles_partition_the_block_tile():
    stage = lessons.stage(3)
    data = figures.micro_tile_map()
    assert (data["count"] == 1).all()
    owners = data["ty"] * stage.THREADS_N + data["tx"]
    assert (np.bincount(owners.ravel()) == stage.THREAD_M * stage.THREAD_N).all()  # 64 elements per thread
    offset = python_function(stage.micro_offset)
    for t in range(stage.THREADS_N):  # two runs of 4 consecutive columns, HALF_N apart
        cols = [int(offset(j, t)) for j in range(stage.THREAD_N)]
        assert cols == [4 * t + j for j in range(4)] + [stage.HALF_N + 4 * t + j for j in range(4)]
    # one 128-bit load of the half-warp (j = 0..3 of tx = 0..15): 64 contiguous words
    assert sorted(int(offset(j, t)) for t in range(16) for j in range(4)) == list(range(64))


# ------------------------------------------------------------------------------ stage 04: fragments, swizzle
@pytest.mark.parametrize("name", ["A", "B", "C"])
def test_mma_fragment_maps_cover_their_tiles_exactly_once(name):
    owner = figures.mma_fragment_maps()[name]
    assert (owner["count"] == 1).all() and (owner["lane"] >= 0).all()


def test_mma_fragment_maps_agree_with_the_emulated_mma():
    """Pack A and B into registers by a/b_fragment_coords, run one mma.sync (ptx.vocab's text) in the lockstep
    emulator, whose mma is written from the ISA independently, and read D back by c_fragment_coords."""
    from ml_dtypes import float8_e4m3fn

    from ptx.emulate.lockstep import run_kernel
    rng = np.random.default_rng(1)
    a = rng.integers(-3, 4, (16, 32)).astype(float8_e4m3fn)
    b = rng.integers(-3, 4, (8, 32)).astype(float8_e4m3fn)  # "col": N rows of K
    a_regs = np.zeros((32, 4, 4), np.uint8)
    b_regs = np.zeros((32, 2, 4), np.uint8)
    for lane in range(32):
        for e in range(4):
            for reg in range(4):
                a_regs[lane, reg, e] = a.view(np.uint8)[mma_sync.a_fragment_coords(lane, reg, e)]
            for reg in range(2):
                b_regs[lane, reg, e] = b.view(np.uint8)[mma_sync.b_fragment_coords(lane, reg, e)]
    d = np.zeros((32, 4), np.float32)
    instruction = mma_sync.mma_m16n8k32_e4m3(["%f0", "%f1", "%f2", "%f3"], ["%r1", "%r2", "%r3", "%r4"],
                                        ["%r5", "%r6"], ["%f4"] * 4)
    ptx = f""".version 8.5
.target sm_90a
.address_size 64
.visible .entry probe(.param .u64 probe_param_a, .param .u64 probe_param_b, .param .u64 probe_param_d)
.maxntid 32, 1, 1
{{
.reg .b32 %r<8>;
.reg .b64 %rd<12>;
.reg .f32 %f<8>;
mov.u32 %r0, %tid.x;
ld.param.u64 %rd0, [probe_param_a];
cvta.to.global.u64 %rd0, %rd0;
ld.param.u64 %rd1, [probe_param_b];
cvta.to.global.u64 %rd1, %rd1;
ld.param.u64 %rd2, [probe_param_d];
cvta.to.global.u64 %rd2, %rd2;
mul.wide.u32 %rd3, %r0, 16;
add.s64 %rd4, %rd0, %rd3;
ld.global.v4.b32 {{%r1, %r2, %r3, %r4}}, [%rd4];
mul.wide.u32 %rd5, %r0, 8;
add.s64 %rd6, %rd1, %rd5;
ld.global.b32 %r5, [%rd6];
ld.global.b32 %r6, [%rd6+4];
mov.f32 %f4, 0f00000000;
{instruction}
add.s64 %rd7, %rd2, %rd3;
st.global.v4.f32 [%rd7], {{%f0, %f1, %f2, %f3}};
ret;
}}
"""
    run_kernel(ptx, "probe", (1,), 32, 0, dict(a=a_regs, b=b_regs, d=d))
    want = a.astype(np.float32) @ b.astype(np.float32).T
    got = np.full((16, 8), np.nan, np.float32)
    for lane in range(32):
        for i in range(4):
            got[mma_sync.c_fragment_coords(lane, i)] = d[lane, i]
    np.testing.assert_array_equal(got, want)


def test_ldmatrix_roles_give_each_row_one_lane():
    for name, lanes in figures.ldmatrix_roles().items():
        assert sorted(lanes.ravel().tolist()) == list(range(32)), name


def test_swizzle_is_a_bijection_and_ldmatrix_phases_are_conflict_free():
    stage = lessons.stage(4)
    swz = figures.stage04_swizzle()
    # every (row, physical chunk) of the 16-row slice holds exactly one (k step, half): nothing lost or doubled
    pairs = {(int(s), int(h)) for s, h in zip(swz["k_step"].ravel(), swz["half"].ravel())}
    assert (swz["k_step"] >= 0).all() and len(pairs) == 2 * stage.K_STEPS
    for row in range(16):
        assert sorted(2 * swz["k_step"][row] + swz["half"][row]) == list(range(8))
    # within a 1024-byte atom swizzled_offset permutes the bytes
    assert sorted(shared_memory.swizzled_offset(r, k) for r in range(8) for k in range(128)) == list(range(1024))
    # each 8-lane phase of every ldmatrix the kernel issues hits 8 different 16-byte bank groups
    for ks in range(stage.K_STEPS):
        for warp_m in range(stage.WARPS_M):
            for mt in range(stage.M_TILES):
                offsets = [stage.a_fragment_offset(warp_m, lane, mt, ks) for lane in range(32)]
                assert all(len({o // 16 % 8 for o in offsets[8 * j:8 * j + 8]}) == 8 for j in range(4))
        for warp_n in range(stage.WARPS_N):
            for pair in range(stage.N_TILES // 2):
                offsets = [stage.b_fragment_offset(warp_n, lane, pair, ks) for lane in range(32)]
                assert all(len({o // 16 % 8 for o in offsets[8 * j:8 * j + 8]}) == 8 for j in range(4))


def test_stage04_ptx_computes_the_drawn_ldmatrix_addresses(monkeypatch):
    """Run stage 04's generated PTX in the lockstep emulator and record every ldmatrix's 256 lane addresses: they
    are a_fragment_offset / b_fragment_offset (the figure's source) plus the ring stage's offset."""
    import ptx.emulate.matrix as matrix
    from ptx.emulate.lockstep import run_kernel
    stage = lessons.stage(4)
    seen = []
    original = matrix.ldmatrix

    def recording(cta, ops, mask):
        seen.append(cta.address(ops[1]).copy())
        return original(cta, ops, mask)

    monkeypatch.setattr(matrix, "ldmatrix", recording)
    m = n = 128
    k = 2 * 128
    d = np.zeros((m, n), np.uint16)
    run_kernel(stage.generate(m, n, k), stage.KERNEL, stage.grid(m, n), stage.THREADS, stage.SHARED_BYTES,
               dict(a=np.zeros((m, k), np.uint8), sa=np.ones((k // 128, m), np.float32), b=np.zeros((n, k), np.uint8),
                    sb=np.ones((1, k // 128), np.float32), d=d, sa_stride=m))
    tid = np.arange(stage.THREADS)
    lane, warp = tid % 32, tid // 32
    expected = []
    for kb in range(k // 128):
        base = (kb % stage.STAGES) * stage.STAGE_BYTES
        for ks in range(stage.K_STEPS):
            expected += [[base + stage.a_fragment_offset(warp[t] // stage.WARPS_N, lane[t], mt, ks) for t in tid]
                         for mt in range(stage.M_TILES)]
            expected += [[base + stage.B_OFFSET + stage.b_fragment_offset(warp[t] % stage.WARPS_N, lane[t], pair, ks)
                          for t in tid] for pair in range(stage.N_TILES // 2)]
    assert len(seen) == len(expected)
    for got, want in zip(seen, expected):
        assert got.tolist() == want


# ------------------------------------------------------------------------------ stage 05: wgmma
def test_descriptor_fields_round_trip():
    rng = np.random.default_rng(2)
    for _ in range(200):
        fields = dict(start_address=16 * int(rng.integers(0, 2**14)),
                      leading_byte_offset=16 * int(rng.integers(0, 2**14)),
                      stride_byte_offset=16 * int(rng.integers(0, 2**14)), swizzle=int(rng.choice([0, 32, 64, 128])),
                      base_offset=int(rng.integers(0, 8)))
        value = w.descriptor_bits(**fields)
        assert w.descriptor_fields(value) == fields
        assert w.descriptor_bits(**w.descriptor_fields(value)) == value
    covered = sorted(b for first, width in w.DESCRIPTOR_FIELDS.values() for b in range(first, first + width))
    assert len(covered) == len(set(covered))  # the fields do not overlap
    assert w.descriptor_fields(w.descriptor_constant_part()) == dict(
        start_address=0, leading_byte_offset=w.LEADING_BYTE_OFFSET, stride_byte_offset=w.SW128_ATOM_BYTES,
        base_offset=0, swizzle=128)


def test_descriptor_example_advances_32_bytes_per_k_step():
    examples = figures.descriptor_example()
    starts = [fields["start_address"] for _, _, fields in examples]
    assert starts == [starts[0] + w.K32_STEP_BYTES * i for i in range(len(examples))]
    assert all(value == w.descriptor_value(fields["start_address"]) for _, value, fields in examples)


def test_stage05_ptx_builds_the_drawn_descriptors(monkeypatch):
    """Stage 05's PTX in the emulator: every wgmma reads descriptors equal to descriptor_value(tile + 32 step),
    with the fields the descriptor figure shows."""
    from ptx.emulate import run_kernel
    from ptx.emulate.warpgroup import Warpgroup
    stage = lessons.stage(5)
    seen = []
    original = Warpgroup._multiply

    def recording(self, acc, a_desc, b_desc, *args):
        seen.append((self.index, a_desc, b_desc))
        return original(self, acc, a_desc, b_desc, *args)

    monkeypatch.setattr(Warpgroup, "_multiply", recording)
    m = n = 128
    k = 5 * 128  # more K blocks than ring stages
    run_kernel(stage.generate(m, n, k), stage.KERNEL, stage.grid(m, n), stage.THREADS, stage.SHARED_BYTES,
               dict(a=np.zeros((m, k), np.uint8), sa=np.ones((k // 128, m), np.float32), b=np.zeros((n, k), np.uint8),
                    sb=np.ones((1, k // 128), np.float32), d=np.zeros((m, n), np.uint16), sa_stride=m))
    steps = stage.BLOCK_K // w.K32_STEP_BYTES
    assert len(seen) == 2 * (k // 128) * steps
    for warpgroup in (0, 1):
        mine = [(a, b) for wg, a, b in seen if wg == warpgroup]
        for index, (a_desc, b_desc) in enumerate(mine):
            kb, step = divmod(index, steps)
            ring = kb % stage.STAGES
            a_start = ring * stage.A_TILE + warpgroup * 64 * stage.BLOCK_K + w.K32_STEP_BYTES * step
            b_start = stage.B_REGION + ring * stage.B_TILE + w.K32_STEP_BYTES * step
            assert (a_desc, b_desc) == (w.descriptor_value(a_start), w.descriptor_value(b_start))
            assert w.descriptor_fields(a_desc)["stride_byte_offset"] == w.SW128_ATOM_BYTES


def test_sw128_atom_is_a_permutation_matching_the_address_xor():
    from ptx.emulate import bulk_copies as emulated_tma
    layout = figures.sw128_layout()
    assert all(sorted(row) == list(range(8)) for row in layout)
    assert all(sorted(col) == list(range(8)) for col in layout.T)  # a chunk's 8 rows: 8 different bank groups
    offsets = [w.sw128_offset(r, k) for r in range(8) for k in range(128)]
    assert sorted(offsets) == list(range(w.SW128_ATOM_BYTES))
    linear = np.array([128 * r + k for r in range(8) for k in range(128)])
    assert offsets == emulated_tma._swizzle_128(linear).tolist()  # what the emulator's TMA and wgmma apply
    assert offsets == [shared_memory.swizzled_offset(r, k) for r in range(8) for k in range(128)]  # = stage 04's XOR


@pytest.mark.parametrize("n", [8, 64, 128, 256])
def test_accumulator_map_covers_the_tile_and_matches_the_emulator(n):
    from ptx.emulate.async_proxy import _accumulator_layout
    data = figures.accumulator_map(n)
    assert (data["count"] == 1).all()
    rows, cols = _accumulator_layout(n)  # the emulator's own (ISA) formula, per thread and register
    tid = 32 * data["warp"] + data["lane"]
    assert (rows[tid, data["index"]] == np.arange(64)[:, None]).all()
    assert (cols[tid, data["index"]] == np.arange(n)[None, :]).all()


# ------------------------------------------------------------------------------ stages 06-07: the traced rings
@pytest.fixture(scope="module", params=["stage06", "stage07"])
def ring(request):
    trace = figures.stage06_trace() if request.param == "stage06" else figures.stage07_trace()
    return request.param, trace


def test_traced_ring_follows_the_vocab_bookkeeping(ring):
    """The parities the emulated PTX waits on are pipeline_slot / producer_wait_parity of ptx.vocab.barriers: the
    full parity flips every `stages` K blocks, each stage is used round-robin."""
    name, trace = ring
    schedule = figures.ring_schedule(trace)
    loads, uses, s = schedule["loads"], schedule["uses"], trace.stages
    assert [x["j"] for x in loads] == list(range(trace.k_blocks))
    assert trace.k_blocks > s  # the ring wraps, so both parities occur
    for load in loads:
        assert (load["stage"], load["full_parity"]) == barriers.pipeline_slot(load["j"], s)
        assert load["released"] is not None  # every stage use was released again
        if load["producer_parity"] is not None:
            assert load["producer_parity"] == barriers.producer_wait_parity(load["j"], s)
    ahead = lessons.stage(6).Plan(*figures.LADDER_SHAPE).ahead if name == "stage06" else 0
    assert sum(x["producer_parity"] is None for x in loads) == ahead  # only stage 06's prologue loads unwaited
    for warpgroup in trace.math:
        mine = [u for u in uses if u["warpgroup"] == warpgroup]
        assert [u["i"] for u in mine] == list(range(trace.k_blocks))
        assert [(u["stage"], u["parity"]) for u in mine] == [barriers.pipeline_slot(i, s) for i in range(trace.k_blocks)]
        assert all(u["release"] is not None and u["wgmma_done"] is not None for u in mine)
        flips = [i for i in range(1, trace.k_blocks) if mine[i]["parity"] != mine[i - 1]["parity"]]
        assert flips == list(range(s, trace.k_blocks, s))


def test_replay_keeps_every_dependency(ring):
    name, trace = ring
    timing = figures.Timing()
    schedule = figures.ring_schedule(trace, figures.replay(trace.events, timing))
    loads, uses = schedule["loads"], schedule["uses"]
    by_j = {x["j"]: x for x in loads}
    for use in uses:  # a math warpgroup starts only once its bytes landed, releases after its wgmmas
        assert use["start"] >= by_j[use["i"]]["issue"] + timing.tma
        assert use["reached"] <= use["start"] <= use["wgmma_done"] <= use["release"]
    for load in loads:  # the producer refills a stage only once every warp released its previous use
        if load["j"] >= trace.stages:
            assert load["issue"] >= by_j[load["j"] - trace.stages]["released"]
    release = {(u["warpgroup"], u["i"]): u["release"] for u in uses}
    for load in loads:
        assert load["released"] == max(release[(wg, load["j"])] for wg in trace.math)
    if name == "stage07":  # the release comes before the promotion: the wgmma is the last thing before it
        assert all(u["release"] - u["wgmma_done"] < 50 for u in uses)


def test_trace_restores_the_emulator():
    from ptx.emulate.warpgroup import Warpgroup
    before = {n: getattr(Warpgroup, n) for n in ("advance", "mbarrier", "bulk", "wgmma")}
    own = set(Warpgroup.__dict__)
    with figures.trace_barriers():
        pass
    assert {n: getattr(Warpgroup, n) for n in before} == before
    assert set(Warpgroup.__dict__) == own  # bulk, inherited from AsyncProxy, is not left set on Warpgroup itself


# ------------------------------------------------------------------------------ stages 08-09: schedules
@pytest.mark.parametrize("m_blocks, n_blocks, grid, group", [(12, 20, 13, 0), (12, 20, 13, 4), (5, 9, 8, 4),
                                                              (7, 3, 132, 16), (32, 56, 132, 16)])
def test_raster_visits_every_tile_once(m_blocks, n_blocks, grid, group):
    from gemm.kernel.tile_scheduler import tile_coords
    data = figures.raster_map(m_blocks, n_blocks, grid, group)
    assert (data["count"] == 1).all()
    for t in range(m_blocks * n_blocks):  # tile t runs on CTA t % grid at step t // grid
        mb, nb = tile_coords(t, m_blocks, n_blocks, group)
        assert (data["owner"][mb, nb], data["step"][mb, nb]) == (t % grid, t // grid)
    assert figures.wave_footprint(m_blocks, n_blocks, grid, group) <= m_blocks + n_blocks


def test_grouped_raster_reads_fewer_blocks_per_wave():
    assert figures.wave_footprint(12, 20, 13, 4) < figures.wave_footprint(12, 20, 13, 0)
    assert figures.wave_footprint(32, 32, 132, 16) < figures.wave_footprint(32, 32, 132, 0)


@pytest.mark.parametrize("along_m", [False, True])
@pytest.mark.parametrize("grid, m_blocks, n_blocks, group", [(8, 6, 10, 4), (8, 5, 9, 4), (132, 32, 32, 16)])
def test_cluster_steps_pair_tiles_2i_and_2i_plus_1(grid, m_blocks, n_blocks, group, along_m):
    from gemm.kernel.tile_scheduler import tile_coords
    steps = figures.cluster_steps(grid, m_blocks, n_blocks, group, along_m)
    tiles = [t for s in steps for t in (s[2], s[3]) if t is not None]
    assert sorted(tiles) == [(mb, nb) for mb in range(m_blocks) for nb in range(n_blocks)]
    shared_coordinate = 1 if along_m else 0  # B pairs share the n block, A pairs the m block
    for cluster, step, first, second, shared in steps:
        t = 2 * cluster + step * grid  # rank 0's tile number: even, the pair's first
        assert first == tile_coords(t, m_blocks, n_blocks, group, along_m)
        assert shared == (second is not None and first[shared_coordinate] == second[shared_coordinate])
    assert sum(figures.census(steps)) == len(steps)


def test_cluster_census_matches_the_emulated_multicasts():
    """Stage 09's config on the emulator (4 CTAs, 2 clusters): rank 0 issues multicast TMA loads exactly in the
    steps cluster_steps marks as sharing A."""
    from gemm.testing.emulated import run_gemm
    from gemm.kernel.launch import grid as launch_grid
    from ptx.emulate.warpgroup import Warpgroup
    m, n, k = 130, 192, 256
    config = lessons.stage(9).config(m, n, k)
    assert config.multicast == 2
    ctas = launch_grid(config, m, n, 4)
    m_blocks, n_blocks, kb = -(-m // config.block_m), -(-n // config.block_n), k // 128
    loads = {}  # (cta x, multicast) -> count of TMA loads into shared memory
    original = Warpgroup.bulk

    def recording(self, parts, ops, mask, *args, **kwargs):
        if mask.any() and parts[3:5] == ["tensor", "2d"] and parts[5].startswith("shared"):
            key = (self.cta.ctaid[0], "multicast::cluster" in parts)
            loads[key] = loads.get(key, 0) + int(mask.sum())
        return original(self, parts, ops, mask, *args, **kwargs)

    Warpgroup.bulk = recording
    try:
        run_gemm(config, *figures.ring_input(m, n, k), sm_count=4)
    finally:
        Warpgroup.bulk = original
    steps = figures.cluster_steps(ctas, m_blocks, n_blocks, config.raster_group)
    shared = {c: sum(s[4] for s in steps if s[0] == c) for c in range(ctas // 2)}
    for cluster in range(ctas // 2):
        # per shared step and K block, rank 0 multicasts A and A's scales; rank 1 never multicasts
        assert loads.get((2 * cluster, True), 0) == 2 * kb * shared[cluster]
        assert loads.get((2 * cluster + 1, True), 0) == 0
    assert any(shared.values()) and figures.census(steps)[1] + figures.census(steps)[2] > 0


# ------------------------------------------------------------------------------ stage 10: bits
def _synthetic_listings():
    from ptx.passes import FLIP_MASK
    from ptx.sass import Instruction
    yield_off, reuse = 1 << 45 << 64, 1 << 59 << 64
    before = [Instruction("k", 16 * i, f"FFMA R{i}, R1, R{100 + i % 3}.reuse, R{i}", "FFMA",
                          yield_off | (reuse if i % 2 else 0)) for i in range(10)]
    after = [Instruction(i.function, i.offset, i.text, i.opcode, i.encoding & ~(FLIP_MASK << 64) if n in (1, 5)
                         else i.encoding) for n, i in enumerate(before)]
    return {(256, 256, 256): (before, after, 256)}


def test_ffma_bits_read_the_pass_flags():
    (before, after, _), = _synthetic_listings().values()
    bits = figures.ffma_bits(before, after)
    assert bits["changed"].tolist() == [n in (1, 5) for n in range(10)]
    assert not bits["yield_before"].any() and bits["yield_after"].tolist() == bits["changed"].tolist()
    assert (bits["reuse_after"] == (bits["reuse_before"] & ~bits["changed"])).all()


# ------------------------------------------------------------------------------ stage 11: tall tiles
@pytest.mark.parametrize("block_m", [64, 128, 256])
def test_tall_tile_slices_cover_the_tile_once_as_the_kernel_offsets_them(block_m):
    """Every row of the tile in exactly one (warpgroup, wave) slice; wave w of all warpgroups one contiguous slab;
    and the slices start where MathWarpgroups.wave_row (the emitted offsets) puts them."""
    from gemm.kernel.math_warpgroups import MathWarpgroups, tile_rows
    from ptx.builder import KernelBuilder
    data = figures.tall_tile_map(block_m)
    assert (data["count"] == 1).all()
    for wave in set(data["wave"].tolist()):
        rows = np.flatnonzero(data["wave"] == wave)
        assert (np.diff(rows) == 1).all() and len(rows) == 64 * len(set(data["warpgroup"].tolist()))
    kb = KernelBuilder("k", [("u64", "out")])
    math = MathWarpgroups(kb, block_m, 128, kb.reg("u32", "tid"))
    assert all(first == 64 * group + math.wave_row(wave) for group, wave, first in tile_rows(block_m))


# ------------------------------------------------------------------------------ stage 12: split-K over a cluster
@pytest.mark.parametrize("k_blocks, split_k", [(kb, s) for kb in (1, 2, 3, 7, 8, 56, 57) for s in (1, 2, 4, 8)
                                               if kb >= s])  # widest_split never asks for more ranks than blocks
def test_split_k_shares_cover_the_tile_once_in_rank_order(k_blocks, split_k):
    """Every K block owned by exactly one rank; each rank's share one contiguous run, in rank order; shares differ
    by at most one block, and none is empty while Kb >= S."""
    rank = figures.split_k_map(k_blocks, split_k)["rank"]
    assert (figures.split_k_map(k_blocks, split_k)["count"] == 1).all()
    assert rank[0] == 0 and rank[-1] == split_k - 1 and set(np.diff(rank).tolist()) <= {0, 1}
    sizes = np.bincount(rank, minlength=split_k)
    assert sizes.min() >= 1 and sizes.max() - sizes.min() <= 1


def test_split_k_occupancy_at_the_stage_shape():
    """At stage 12's SHAPE the split keeps stage 11's tiles and launches split_k CTAs per tile, each with an SM of
    its own; stage 11 leaves SMs idle (the case the stage is for)."""
    use = figures.split_k_occupancy(*lessons.stage(12).SHAPE)
    eleven, twelve = use[11], use[12]
    assert twelve["tiles"] == eleven["tiles"] and twelve["split_k"] > 1
    assert twelve["ctas"] == twelve["split_k"] * twelve["tiles"] <= use["sm_count"]
    assert eleven["ctas"] <= eleven["tiles"] < use["sm_count"]


# ------------------------------------------------------------------------------ the figures themselves
def _build(name):
    if name == "10_ffma_yield_bits":
        return figures.ffma_yield_bits(_synthetic_listings())  # the real one assembles two cubins (~10 s)
    return figures.FIGURES[name]()


@pytest.mark.parametrize("name", list(figures.FIGURES))
def test_every_figure_function_builds(name):
    from matplotlib.figure import Figure
    assert isinstance(_build(name), Figure)


@pytest.mark.slow
def test_every_figure_renders():
    import io
    for name in figures.FIGURES:
        buffer = io.BytesIO()
        _build(name).savefig(buffer, format="png", dpi=40)
        assert buffer.getvalue().startswith(b"\x89PNG")


def test_committed_figures_match_the_registry_and_the_manifest():
    manifest = json.loads(committed.MANIFEST.read_text())
    names = {f"{name}.png" for name in figures.FIGURES}
    assert set(manifest["figures"]) == names
    assert {p.name for p in committed.FIGURE_DIR.glob("*.png")} == names
    for name, digest in manifest["figures"].items():
        data = (committed.FIGURE_DIR / name).read_bytes()
        assert data.startswith(committed.PNG_SIGNATURE) and hashlib.sha256(data).hexdigest() == digest, name
    assert all(name[:2].isdigit() and int(name[:2]) in lessons.STAGES or name.startswith(tuple(lessons.TOPICS))
               for name in figures.FIGURES)  # named after its stage, or its topic lesson
    documented = (ROOT / "docs" / "figures.md").read_text()
    assert all(f"figures/{name}" in documented for name in names)


def test_rendering_is_deterministic():
    first = committed.render("05_sw128_atom")
    assert first == committed.render("05_sw128_atom")
    if json.loads(committed.MANIFEST.read_text())["versions"] == committed.versions():
        assert first == (committed.FIGURE_DIR / "05_sw128_atom.png").read_bytes()  # and the committed file is current


def test_uniform_datapath_classes_come_from_the_cubins():
    """Stage 13's K block: the same tensor-core and promotion work as stage 12's, no R2UR and no vector integer
    work, fewer instructions (the figure's rows)."""
    from collections import Counter

    from lessons.figures import LADDER_SHAPE, k_block_classes
    from lessons.figures.uniform_datapath import CLASSES
    names = [name.split(" (")[0] for name, _, _ in CLASSES]
    before, after = (Counter(names[c] for c in k_block_classes(n, *LADDER_SHAPE)) for n in (12, 13))
    assert before["tensor core"] == after["tensor core"] and before["promotion"] == after["promotion"]
    assert before["vector to uniform move"] > 0 and after["vector to uniform move"] == 0
    assert after["vector integer"] == 0 and sum(after.values()) < sum(before.values())


def test_early_poll_rows_come_from_the_cubins():
    """Stage 14 tests the next full barrier among the promotion FFMAs, with most of them still to come; stage 13 has
    no full-barrier instruction between its last wgmma and the loop's back edge (it polls at the loop's top)."""
    from lessons.figures import LADDER_SHAPE, after_last_wgmma
    before, after = (after_last_wgmma(n, *LADDER_SHAPE) for n in (13, 14))
    assert not any(cls == 3 for cls, _ in before)
    (tested,) = [i for i, (cls, _) in enumerate(after) if cls == 3]
    assert "TRYWAIT" not in after[tested][1]
    later = sum(text.startswith("FFMA") for _, text in after[tested:])
    assert later > sum(text.startswith("FFMA") for _, text in after[:tested]) and later >= 32


def test_swap_ab_ring_comes_from_the_shared_plan():
    """At stage 15's shape stage 14's ring is mostly zero-filled A rows; stage 15's holds none, and more weight."""
    from gemm.kernel.config import SharedPlan
    from lessons.figures import ring_bytes
    from lessons.figures.swap_ab import SWAP_SHAPE
    rings = ring_bytes(*SWAP_SHAPE)
    (tokens14, zeros14, weight14), (tokens15, zeros15, weight15) = (rings[s]["parts"] for s in ("stage 14", "stage 15"))
    assert zeros14 > 10 * tokens14 and zeros15 == 0 and weight15 > 2 * weight14
    config = rings["stage 15"]["config"]
    assert tokens15 + weight15 == config.stages * (SharedPlan(config, *SWAP_SHAPE[1:]).a_tile
                                                   + SharedPlan(config, *SWAP_SHAPE[1:]).b_tile)


def test_evict_first_grid_comes_from_the_stage_and_the_count():
    """At stage 16's shape one row of tiles loads B (evict_first); at the ladder's, 16 rows do (normal priority)."""
    import lessons
    from lessons.figures import LADDER_SHAPE, b_read_map
    from lessons.figures.evict_first import EVICT_SHAPE
    assert EVICT_SHAPE == lessons.stage(16).SHAPE
    decode, prefill = b_read_map(*EVICT_SHAPE), b_read_map(*LADDER_SHAPE)
    assert (decode["rows"], decode["b_reads"], decode["priority"]) == (1, 1, "first")
    assert decode["columns"] == 4096 // decode["config"].block_n
    assert (prefill["rows"], prefill["b_reads"], prefill["priority"]) == (16, 16, "normal")


def test_split_k_push_inbox_comes_from_the_shared_plan():
    """Stage 18's rank 0 holds one slot of partials per peer after its barriers, inside the plan's bytes; stage 17's
    has none. At 64 x 2112 x 7168 the 256 x 64 tile's 64 KiB inbox costs stage 17's ring a stage."""
    from gemm.kernel.config import SharedPlan
    from lessons.figures import shared_map
    from lessons.figures.split_k_push import PUSH_SHAPE, RING_SHAPE
    assert PUSH_SHAPE == lessons.stage(18).SHAPE
    for shape in (PUSH_SHAPE, RING_SHAPE):
        gathered, pushed = shared_map(17, *shape), shared_map(18, *shape)
        assert not gathered["slots"] and "inbox" not in [name for name, _, _ in gathered["regions"]]
        config, plan = pushed["config"], SharedPlan(pushed["config"], *shape[1:])
        assert config.split_k_push and len(pushed["slots"]) == config.split_k - 1
        assert [first for _, first, _ in pushed["slots"]][0] == plan.inbox_region
        assert sum(end - first for _, first, end in pushed["slots"]) == plan.inbox_bytes
        ends = [end for _, _, end in pushed["regions"]]
        assert all(b[1] >= a[2] for a, b in zip(pushed["regions"], pushed["regions"][1:]))  # in address order
        assert max(ends) <= pushed["shared_bytes"] == plan.shared_bytes
    assert shared_map(18, *RING_SHAPE)["config"].stages == shared_map(17, *RING_SHAPE)["config"].stages - 1
