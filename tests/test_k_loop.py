"""The math warpgroups' K loop shapes (CPU: the PTX emulator, assembled SASS): the tile's first K block assigning the
totals (KernelConfig.first_block_assigns) and ring slots at compile-time offsets (KernelConfig.constant_stages), on
every path that runs the K loop of one K block in flight: dense, two B scales a K block, two waves, a multicast pair,
swap AB, split-K, 1x128 wgrad scales, the grouped layouts; every tile walk with several tiles per CTA, so the ring
wraps inside a tile, at a tile's end and across tiles."""
import sys
from pathlib import Path

import numpy as np
import pytest

from gemm.kernel import KERNEL, KernelConfig, generate

sys.path.insert(0, str(Path(__file__).parent))
from tc_checks import assert_clean_resources, assert_exact, small_integer_problem  # noqa: E402
from test_grouped import check_masked, masked_problem  # noqa: E402
from test_wgrad import integer_wgrad_problem, reference_wgrad  # noqa: E402

# (M, N, K, fields): K blocks against stages, each case named by how the ring meets the tile
CONSTANT_STAGE_CASES = {
    "K blocks = stages (every tile one round)": (300, 416, 512, dict(stages=4)),
    "K blocks = 3 x stages (a loop of rounds)": (300, 416, 768, dict(stages=2)),
    "stages = 2 x K blocks (two tiles a round)": (300, 416, 256, dict(stages=4)),
    "stages = 3 x K blocks, ragged K": (200, 264, 208, dict(stages=6, block_m=64, block_n=64)),
    "one K block, one stage a tile": (130, 520, 128, dict(stages=2, block_n=64)),
    "two B scales a K block": (200, 600, 384, dict(stages=3, block_n=192)),
    "two waves a warpgroup": (300, 136, 512, dict(stages=2, block_m=256, block_n=64)),
    "a multicast pair, two tiles a round": (300, 416, 256, dict(stages=4, multicast=2)),
    "no early poll": (300, 416, 768, dict(stages=3, early_poll=False)),
    "one CTA per tile": (300, 416, 512, dict(stages=2, persistent=False, raster_group=0)),
}


@pytest.mark.parametrize("assigns", [False, True], ids=["zeroed", "first assigns"])
@pytest.mark.parametrize("name", list(CONSTANT_STAGE_CASES))
def test_constant_stages_on_the_emulator(name, assigns, rng):
    """Exact against the BF16-rounded reference, every element written, 3 CTAs walking several tiles, a random
    schedule: a slot offset or parity flip out of step with the producer's continuing count deadlocks or reads a
    stage of the wrong K block here."""
    from gemm.testing.emulated import run_gemm
    m, n, k, fields = CONSTANT_STAGE_CASES[name]
    config = KernelConfig(constant_stages=True, first_block_assigns=assigns, **fields)
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(run_gemm(config, *problem, sm_count=3, seed=int(rng.integers(1000))), problem)


FIRST_BLOCK_CASES = {
    "dense, the ring wrapping": (300, 416, 640, dict(stages=3)),
    "one K block": (130, 200, 112, dict(stages=2)),
    "two B scales a K block": (200, 600, 384, dict(stages=2, block_n=192)),
    "two waves a warpgroup": (130, 136, 512, dict(stages=2, block_m=256, block_n=64)),
    "split over three CTAs": (9, 200, 1024, dict(stages=2, block_m=64, block_n=64, split_k=3, persistent=False,
                                                 raster_group=0)),
    "swap AB": (20, 392, 640, dict(stages=3, swap_ab=True, block_m=32, block_n=128, persistent=False,
                                   raster_group=0)),
}


@pytest.mark.parametrize("name", list(FIRST_BLOCK_CASES))
def test_first_block_assigns_on_the_emulator(name, rng):
    """The totals are never zeroed: a tile whose first promotion added to the last tile's totals, or a split-K share
    that skipped its first K block, is a wrong answer here (3 CTAs, several tiles each)."""
    from gemm.testing.emulated import run_gemm
    m, n, k, fields = FIRST_BLOCK_CASES[name]
    config = KernelConfig(first_block_assigns=True, **fields)
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(run_gemm(config, *problem, sm_count=3, seed=int(rng.integers(1000))), problem)


def test_first_block_assigns_with_1x128_scales_on_the_emulator(rng):
    """wgrad's per-column promotion (FMUL + FFMA) with the first K block's FFMA an FMUL: D = C + A*B bit for bit."""
    from gemm.testing.emulated import run_gemm
    m, n, k = 200, 232, 400
    config = KernelConfig(block_m=128, block_n=128, stages=2, out_dtype="f32", accumulate=True, b_scales="1x128",
                          raster_group=2, first_block_assigns=True)
    problem = integer_wgrad_problem(m, n, k, rng)
    c = rng.integers(-64, 65, (m, n)).astype(np.float32) / 4
    got = run_gemm(config, *problem, c=c, sm_count=3, seed=int(rng.integers(1000)))
    assert np.array_equal(got, (c + reference_wgrad(*problem)).astype(np.float32))


@pytest.mark.parametrize("stages", [2, 4])
def test_constant_stages_masked_grouped_on_the_emulator(stages, rng):
    """Masked groups (an empty one among them): the tiles a CTA walks skip groups, and the ring's slots still follow
    the producer's count."""
    from gemm.testing.emulated import run_grouped_gemm
    config = KernelConfig(gemm_type="masked", block_m=64, block_n=64, stages=stages, raster_group=0,
                          constant_stages=True, first_block_assigns=True)
    groups, m_max, n, k = 4, 130, 200, 256
    masked_m = rng.permutation([0, 1, m_max, int(rng.integers(2, m_max))]).astype(np.int32)
    problem = masked_problem(groups, m_max, n, k, rng)
    d = run_grouped_gemm(config, *problem, masked_m, sm_count=3, seed=int(rng.integers(1000)))
    check_masked(d, *problem, masked_m)


@pytest.mark.parametrize("fields, words", [
    (dict(constant_stages=True, accumulators=2), "accumulators=1"),
    (dict(first_block_assigns=True, producer="inline", persistent=False, registers=None, raster_group=0),
     "producer='warpgroup'"),
    (dict(constant_stages=True, split_k=2, persistent=False, raster_group=0), "split_k=1"),
    (dict(constant_stages=True, b_scales="1x128"), "K known when the kernel is built"),
])
def test_k_loop_misuse_is_named(fields, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        KernelConfig(**fields)


def test_constant_stages_refuse_the_next_full_seam():
    """The exercise seam answers for a rolled ring's counter; the unrolled loop has none to ask about."""
    from gemm.kernel.seams import Seams
    with pytest.raises(ValueError, match="next_full seam"):
        generate(KernelConfig(stages=4, constant_stages=True), 4096, 512,
                 Seams(next_full=lambda stage, parity, stages: ((stage + 1) % stages, parity)))


def test_constant_stages_name_the_k_blocks_that_do_not_fit():
    with pytest.raises(ValueError, match=r"K=640 has 5 K blocks; constant_stages needs the 4 stages"):
        generate(KernelConfig(stages=4, constant_stages=True), 4096, 640)


def test_both_off_leave_the_kernel_unchanged():
    """The fields default off and then emit the PTX they did before (one home: the rolled loop's body is shared)."""
    config = KernelConfig(stages=4)
    assert generate(config, 4096, 512) == generate(config.replace(first_block_assigns=False,
                                                                  constant_stages=False), 4096, 512)
    assert "mul.rn.f32" not in generate(config, 4096, 512)


def math_instructions_per_tile(cubin, k_blocks: int) -> int:
    """A math thread's SASS instructions per tile of ``k_blocks`` K blocks: the tile loop (the outermost loop around
    a QGMMA), plus the K loop's again for each further time it runs (K blocks peeled out of it run once); the
    out-of-line barrier retries after the last EXIT left out."""
    from ptx.sass import disassemble, loops
    instructions = disassemble(cubin)
    mmas = [i.offset for i in instructions if i.opcode == "QGMMA"]
    last_exit = max(i.offset for i in instructions if i.opcode == "EXIT")
    around = [(a, b) for a, b in loops(cubin) if b < last_exit and any(a <= x <= b for x in mmas)]
    tile, k_loop = around[-1], around[0]  # innermost first: the K loop, then the tile loop
    length = (tile[1] - tile[0]) // 16 + 1
    if k_loop == tile:
        return length
    per_block = sum(k_loop[0] <= x <= k_loop[1] for x in mmas)
    runs = k_blocks - (len(mmas) - per_block) // per_block
    return length + (runs - 1) * ((k_loop[1] - k_loop[0]) // 16 + 1)


def test_constant_stages_take_the_slot_arithmetic_off_the_k_loop():
    """At 128x32768x512's kernel (4 K blocks, 4 stages) a math thread runs fewer instructions per tile: no slot
    addresses built from the stage counter and no counter stepped per K block (constant_stages), no zeroing of the
    64 totals (first_block_assigns, whose first K block's FMULs replace as many FFMAs); no spills, no warnings."""
    from ptx.compile import compile_ptx
    from ptx.sass import disassemble, opcode_counts
    base = KernelConfig(stages=4)
    per_tile, counts = {}, {}
    for name, config in [("rolled", base), ("constant", base.replace(constant_stages=True)),
                         ("first", base.replace(first_block_assigns=True)),
                         ("both", base.replace(constant_stages=True, first_block_assigns=True))]:
        cubin = compile_ptx(generate(config, 32768, 512))
        assert_clean_resources(cubin, KERNEL)
        assert not cubin.warnings, cubin.warnings
        per_tile[name] = math_instructions_per_tile(cubin, 4)
        counts[name] = opcode_counts(disassemble(cubin))
    print(per_tile)
    assert per_tile["constant"] < 0.9 * per_tile["rolled"]
    assert per_tile["first"] < per_tile["rolled"] - 24
    assert counts["first"]["FMUL"] >= counts["rolled"]["FMUL"] + 64


GPU_CASES = [  # (M, N, K, config fields): ragged M, and each way the ring meets the tile, at real sizes
    (130, 32768, 512, dict(block_m=128, block_n=128, stages=4)),  # K blocks = stages
    (4097, 2112, 512, dict(block_m=128, block_n=192, stages=2)),  # two rounds a tile, two B scales a K block
    (65, 32768, 512, dict(block_m=64, block_n=128, stages=8)),  # two tiles a round
    (1000, 24576, 1536, dict(block_m=256, block_n=128, stages=3)),  # four rounds, two waves
    (300, 7168, 2048, dict(block_m=128, block_n=128, stages=4, multicast=2)),  # a pair, a loop of rounds
]


@pytest.mark.gpu
@pytest.mark.parametrize("assigns", [False, True], ids=["zeroed", "first assigns"])
@pytest.mark.parametrize("m, n, k, fields", GPU_CASES)
def test_constant_stages_on_the_gpu(m, n, k, fields, assigns, rng):
    """Against the float64 reference from the dequantized inputs (DeepGEMM's diff < 1e-3), every element written
    (NaN-poisoned D), fresh random inputs."""
    from gemm.testing.problems import random_problem
    from tc_checks import check_against_reference, run_on_gpu
    from test_generator import _configured
    config = KernelConfig(constant_stages=True, first_block_assigns=assigns, **fields)
    a, sa, b, sb = random_problem(m, n, k, rng)
    check_against_reference(run_on_gpu(_configured(config), a, sa, b, sb), a, sa, b, sb, rng)
