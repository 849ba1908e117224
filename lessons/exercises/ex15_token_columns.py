"""Exercise 15: which token each accumulator of a swapped tile holds, so which token's scale its promotion takes.

Hole: ``token_column(register, lane) -> column``: in stage 15's swapped tile the weight's rows are wgmma's M side
and the tile's token rows its N columns, so accumulator ``register`` of ``lane`` holds one weight row's product
with one token, and the promotion multiplies it by ``sb * sa[token]``. The seam:
``MathWarpgroups._token_column_offsets`` in :mod:`gemm.kernel.math_warpgroups` (:mod:`gemm.kernel.seams`), which
evaluates it for every lane and register and keeps the answers as a ``.const`` table, each thread reading its row
once before the K loop; every K block then reads the scale of the token each accumulator names. The seam refuses
what names no token of the tile (outside 0 .. token rows - 1, not an int). A wrong token is a wrong D: that
token's partial sums scaled by another token's scales, which the graded runs show wherever the two differ (fresh
random scales: everywhere); the rule check names the first wrong (register, lane) for tiles of 8, 16 and 32
tokens.
"""
from __future__ import annotations

from types import SimpleNamespace

from lessons.exercises import Exercise, failures

STAGE = 15
PROMPT = """\
Stage 15 swaps A and B at decode: each math warpgroup multiplies 64 rows of the weight tile (wgmma's A, M = 64)
by the tile's T token rows (wgmma's B, N = T = 8, 16 or 32), so its accumulators hold D transposed: a row of the
fragment is a weight row, a column is a token. All 64 weight rows share one 128 x 128 block scale sb; each token
has its own activation scale sa[token] per K block. So per K block the promotion is
total[register] += partial[register] * (sb * sa[token of register]).

Fill in, in your copy of lessons/exercises/skeletons/ex15_token_columns.py:
  * token_column(register, lane) -> int: the token (column of the m64nTk32 fragment, 0 .. T - 1) that accumulator
    `register` (0 .. T/2 - 1) of `lane` (0 .. 31) holds. The warp a lane belongs to does not change its column.
The generator evaluates it for every lane and register and emits the answers as a table
(gemm/kernel/math_warpgroups.py MathWarpgroups._token_column_offsets); the epilogue keeps its own layout."""

QUESTIONS = (
    ("Predict: at 16 x 2112 x 7168, how many rows of stage 14's 256 x 64 tile hold a token, and how many of stage "
     "15's 16 x 64?",
     "check with `python -m lessons inspect 15` (the configs) and the figure 15_swap_ab"),
    ("Predict: which accumulators of lane 5 hold token 3?",
     "check with the PTX ISA's wgmma 'Register Fragments' figure for the m64nNk32 .f32 D matrix (the column of a "
     "row's pair of registers), or the figure 05_wgmma_accumulator"),
    ("Predict: the swap changes what the promotion reads per K block. Unswapped, a thread reads two A scales (its two "
     "rows); swapped, how many?",
     "check with `python -m lessons inspect 15`: count the shared loads between a K block's last QGMMA and its "
     "FFMAs, against stage 14's"),
    ("Predict: at M = 1, is swap AB with a 64-token tile faster than the unswapped 64 x 64 tile?",
     "check with results/sweep_swap_ab_tile_rows.json (9.86 against 9.59 us at 1 x 7168 x 2048: no; the gain is the "
     "rows that do not exist)"),
)

TOKEN_ROWS = (8, 16, 32)  # the tiles stage 15 builds (gemm.heuristics.SWAP_AB_MAX_M = 32)


def reference():
    return SimpleNamespace(token_column=lambda register, lane: 8 * (register // 4) + 2 * (lane % 4) + register % 2)


def check_rule(solution) -> None:
    """Raise AssertionError at the first (register, lane) whose answer is not the column the fragment puts there."""
    fragment = reference()
    for register in range(max(TOKEN_ROWS) // 2):
        for lane in range(32):
            got = solution.token_column(register, lane)
            want = fragment.token_column(register, lane)
            if type(got) is not int or got != want:
                narrowest = min(rows for rows in TOKEN_ROWS if register < rows // 2)
                raise AssertionError(f"token_column({register}, {lane}) = {got!r}; in a tile of {narrowest} or more "
                                     f"tokens that accumulator holds token {want}")


def fragment_columns(solution) -> list[str]:
    """The answer is the fragment's column for every lane and every register of the widest tile (32 tokens); the
    graded shapes build some tile widths only, and a wrong column there shows in D only where scales differ."""
    return failures(check_rule, solution)


def build(solution):
    import lessons
    from lessons.exercises.holed import HoledKernel
    stage = lessons.stage(STAGE)
    return HoledKernel(stage.config, lambda m, n, k: dict(token_column=solution.token_column), cpu_stages=2,
                       sass_shape=stage.SHAPE, sm_count_cpu=2)  # a 2-slot ring: it wraps at the graded K


EXERCISE = Exercise(
    stage=STAGE,
    name="token_columns",
    objective="Promote a swapped tile's accumulators with their own tokens' scales: read the wgmma fragment's columns.",
    prompt=PROMPT,
    holes=("token_column",),
    questions=QUESTIONS,
    reference=reference,
    build=build,
    required_sass=("UTMALDG", "QGMMA", "STSM"),  # STSM: the epilogue's transposed stmatrix
    # one tile width each: 8 tokens (M = 5, K split over 2 CTAs), 16 (M = 13, ragged N: a last tile of 8 weight
    # rows), 32 (M = 27, ragged N and 5 K blocks over 2 CTAs)
    shapes_cpu=((5, 136, 384), (13, 200, 256), (27, 136, 640)),
    shapes_gpu=((16, 2112, 7168), (1, 7168, 2048)),
    perf_threshold=None,
    extra={"checks": (fragment_columns,)},
    answer_sites={"gemm/kernel/math_warpgroups.py": ("fragment_column",),
                  "ptx/vocab/wgmma.py": ("accumulator_coords",),
                  "ptx/vocab/mma_sync.py": ("c_fragment_coords",),  # mma.sync's C fragment: the same lane part
                  "ptx/emulate/async_proxy.py": ("_accumulator_layout",)},
)
