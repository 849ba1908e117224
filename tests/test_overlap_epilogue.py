"""The next tile's first wave issued before this tile's epilogue (KernelConfig.overlap_epilogue): exact on the PTX
emulator on every tile walk it allows (one and two waves a warpgroup, two B scales a K block, a multicast pair, a
ragged edge, one K block a tile), the pre-issued path taken (a mutation that issues nothing ahead fails), the SASS
keeping that wave in flight through the epilogue and the next tile's start, misuse named, and on the GPU against the
float64 reference."""
import sys
from pathlib import Path

import pytest

from gemm.heuristics import H100, choose_config
from gemm.kernel import KERNEL, KernelConfig, generate

sys.path.insert(0, str(Path(__file__).parent))
from tc_checks import assert_clean_resources, assert_exact, small_integer_problem  # noqa: E402

# (M, N, K, fields): 3 CTAs walk several tiles each; every tile but a CTA's first has its first wave issued ahead
CASES = {
    "dense, the ring wrapping": (300, 416, 640, dict(stages=3)),
    "two waves a warpgroup": (300, 136, 512, dict(stages=2, block_m=256, block_n=64)),
    "one K block a tile": (130, 520, 128, dict(stages=2, block_n=64)),
    "two B scales a K block": (200, 600, 384, dict(stages=3, block_n=192)),
    "a multicast pair": (300, 416, 256, dict(stages=4, multicast=2)),
    "ragged edges, one warpgroup": (257, 200, 400, dict(stages=2, block_m=64, block_n=64)),
}


@pytest.mark.parametrize("after_writes, peeled", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["before the epilogue", "after its shared writes", "peeled first block",
                              "peeled, after the writes"])
@pytest.mark.parametrize("name", list(CASES))
def test_overlap_epilogue_on_the_emulator(name, after_writes, peeled, rng):
    """Exact against the BF16-rounded reference, every element written: a wave issued from the wrong slot, a stage
    released before its pre-issued wave was waited for, or a deferred store lost or aimed at the wrong tile is a
    wrong answer (or an unwritten element) here."""
    from gemm.testing.emulated import run_gemm
    m, n, k, fields = CASES[name]
    config = KernelConfig(overlap_epilogue=True, overlap_after_writes=after_writes, first_block_assigns=peeled,
                          **fields)
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(run_gemm(config, *problem, sm_count=3, seed=int(rng.integers(1000))), problem)


def test_the_emulator_takes_the_overlapped_path(rng, monkeypatch, request):
    """The tests above vouch for the overlap only if its path runs: with the wave not issued ahead (the K block still
    skips its issue), the same problem fails."""
    from gemm.kernel import math_warpgroups
    from gemm.testing.emulated import run_gemm
    generate.cache_clear()  # generate() keeps the PTX of configs built before; the mutated kernel must be new
    request.addfinalizer(generate.cache_clear)  # and must not outlive this test
    monkeypatch.setattr(math_warpgroups.MathWarpgroups, "issue_first_wave", lambda self, *args: None)
    m, n, k, fields = CASES["dense, the ring wrapping"]
    problem = small_integer_problem(m, n, k, rng)
    with pytest.raises(AssertionError):
        assert_exact(run_gemm(KernelConfig(overlap_epilogue=True, **fields), *problem, sm_count=3,
                              seed=int(rng.integers(1000))), problem)


def test_a_choice_from_a_warps_own_poll_is_caught(rng, monkeypatch, request):
    """The first version issued the wave where the early poll had seen the stage land. Each warp polls on its own,
    so warps of one warpgroup chose differently and a wgmma issued by part of a warpgroup hung the GPU (a
    multicast pair, 777x7168x2048). The emulator's test_wait lets each warp see a completion late under a seeded
    schedule, so that version fails here on every seed, named as a collective executed by part of the group."""
    from gemm.kernel import generator
    from gemm.testing.emulated import run_gemm
    from ptx.emulate import EmulationError

    def chosen_by_each_warp(self, math, scheduler, c_stage, c_parity):
        more, _ = scheduler.next_tile()
        flag, skip = self.pre_issued.flag, self.b.label("next_wave_held")
        self.b.emit(f"and.pred {flag}, {more}, {self.full_known};", f"@!{flag} bra {skip};")
        slot = self.ring.stage(c_stage)
        math.issue_first_wave(slot.a_tile, slot.b_tile, slot.sa_tile, self.pre_issued)
        self.b.place(skip)

    generate.cache_clear()
    request.addfinalizer(generate.cache_clear)
    monkeypatch.setattr(generator._Kernel, "issue_next_first_wave", chosen_by_each_warp)
    m, n, k, fields = CASES["dense, the ring wrapping"]
    problem = small_integer_problem(m, n, k, rng)
    with pytest.raises(EmulationError, match="only part of the warpgroup"):
        run_gemm(KernelConfig(overlap_epilogue=True, **fields), *problem, sm_count=3, seed=int(rng.integers(1000)))


def _sass(config, n, k):
    from ptx.compile import compile_ptx
    from ptx.sass import disassemble
    cubin = compile_ptx(generate(config, n, k))
    assert_clean_resources(cubin, KERNEL)
    assert not cubin.warnings, cubin.warnings
    return [instruction.text for instruction in disassemble(cubin)]


def _in_flight_after_last_group(sass: list[str]) -> list[str]:
    """The instructions between the listing's last QGMMA (the wave issued ahead, where there is one) and the first
    wgmma wait after it."""
    last = max(i for i, text in enumerate(sass) if text.startswith("QGMMA"))
    after = sass[last + 1:]
    return after[:next(i for i, text in enumerate(after) if text.startswith("WARPGROUP.DEPBAR"))]


@pytest.mark.parametrize("after_writes", [False, True], ids=["before the epilogue", "after its shared writes"])
@pytest.mark.parametrize("m, n, k", [(4096, 24576, 1536), (4096, 2112, 7168)])
def test_the_wave_stays_in_flight_through_the_epilogue(m, n, k, after_writes):
    """ptxas completes the wgmmas in flight before a bulk wait_group (so the epilogue drains the previous stores
    before the wave is issued) and on the loop's exit path (so the walk's last tile waits there itself). What this
    asserts: after the wave issued ahead the epilogue's TMA stores (and, issued before the epilogue, its stmatrix)
    run before any wgmma wait, while production's last wgmma group is waited for before its epilogue starts."""
    config = choose_config(m, n, k, H100).replace(d_buffer=None)
    production = _in_flight_after_last_group(_sass(config, n, k))
    assert not any(text.startswith(("STSM", "UTMASTG")) for text in production), production
    overlapped = _in_flight_after_last_group(
        _sass(config.replace(overlap_epilogue=True, overlap_after_writes=after_writes), n, k))
    assert any(text.startswith("UTMASTG") for text in overlapped), overlapped
    assert after_writes or any(text.startswith("STSM") for text in overlapped), overlapped


def test_off_leaves_the_kernel_unchanged():
    """Production's PTX is pinned by tests/test_ptx_identity.py; here: none of the overlap's registers appear."""
    ptx = generate(KernelConfig(stages=3, block_m=256, block_n=128), 4096, 1536)
    assert "p_pre_issued" not in ptx and "sa_pre" not in ptx


@pytest.mark.parametrize("fields, words", [
    (dict(persistent=False, raster_group=0), "persistent=True"),
    (dict(accumulators=2), "accumulators=1"),
    (dict(early_poll=False), "early_poll=True"),
    (dict(d_buffer=(128, 64)), "d_buffer=None"),
    (dict(epilogue="staged"), "epilogue='tma'"),
    (dict(constant_stages=True), "constant_stages"),
    (dict(gemm_type="contiguous", block_m=128), "gemm_type='normal'"),
])
def test_overlap_epilogue_misuse_is_named(fields, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        KernelConfig(overlap_epilogue=True, **fields)


def test_overlap_after_writes_needs_the_overlap():
    with pytest.raises(ValueError, match="needs overlap_epilogue=True"):
        KernelConfig(overlap_after_writes=True)


GPU_CASES = [
    (1000, 24576, 1536, dict(block_m=256, block_n=128, stages=3)),  # two waves, several tiles a CTA
    (4097, 2112, 512, dict(block_m=128, block_n=192, stages=4)),  # two B scales a K block, a ragged row
    (777, 7168, 2048, dict(block_m=128, block_n=128, stages=4, multicast=2)),  # a pair
    (300, 4096, 128, dict(block_m=128, block_n=64, stages=2)),  # one K block a tile
]


@pytest.mark.gpu
@pytest.mark.parametrize("after_writes, peeled", [(False, False), (True, False), (True, True)],
                         ids=["before the epilogue", "after its shared writes", "peeled, after the writes"])
@pytest.mark.parametrize("m, n, k, fields", GPU_CASES)
def test_overlap_epilogue_on_the_gpu(m, n, k, fields, after_writes, peeled, rng):
    """Against the float64 reference from the dequantized inputs (DeepGEMM's diff < 1e-3), every element written
    (NaN-poisoned D), fresh random inputs."""
    from gemm.testing.problems import random_problem
    from tc_checks import check_against_reference, run_on_gpu
    from test_generator import _configured
    config = KernelConfig(overlap_epilogue=True, overlap_after_writes=after_writes, first_block_assigns=peeled,
                          **fields)
    a, sa, b, sb = random_problem(m, n, k, rng)
    check_against_reference(run_on_gpu(_configured(config), a, sa, b, sb), a, sa, b, sb, rng)
