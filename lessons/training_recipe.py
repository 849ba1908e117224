"""FP8 training's three GEMMs with DeepSeek-V3's scales, and the precision of each, measured on the CPU (a topic
lesson). ``python -m lessons precision --training`` prints the tables and writes results/training_precision.json,
which docs/guide.md's section 5 (the story: why the three granularities, what the wgrad kernel changes) quotes;
notebooks/training_recipe.ipynb runs it, with the wgrad kernel on the emulator.

A linear layer y = x W^T over T tokens (x (T, I), W (O, I), dy = dL/dy (T, O)): forward y = x W^T, dgrad
dx = dy W, wgrad dW = dy^T x, each as the kernels' D = (A sA)(B sB)^T (:data:`GEMMS`; :func:`recipe_operands` casts
their operands as the recipe does, with the library's casts).

**What is measured** (:func:`study`). One synthetic layer: activations x with the outlier model of
:mod:`lessons.precision` (1% of channels x100, 3 tokens x1000) times a log-normal magnitude per token
(sigma X_TOKEN_SIGMA), gradients dy the same with a wider spread (DY_TOKEN_SIGMA: tokens the model already predicts
well get tiny gradients), weights N(0, WEIGHT_STD). Each GEMM is computed in float64 from the dequantized operands
of a scaling scheme and compared with the float64 GEMM of the *unquantized* operands: DeepGEMM's ``calc_diff``,
and per element the error relative to sum_k |a_k b_k| (the magnitude of the dot product's terms, which stays
meaningful where the terms cancel; the unit in which tests/test_wgrad.py bounds the kernel's own accumulation error
on the GPU, 2^-10). So the numbers are the quantization error alone: the kernel adds the tensor cores' accumulation
and its FP32 promotion on top (which notebooks/precision.ipynb measures with a model of the accumulator, and the
training notebook on the wgrad kernel).
"""
from __future__ import annotations

import numpy as np

from gemm.fp8 import (GROUP, calc_diff, dequantize_per_block, dequantize_per_token, e4m3_decode,
                      per_block_cast_to_fp8, per_token_cast_to_fp8, transpose_cast_to_fp8)
from gemm.testing.records import Column, format_table
from lessons import precision
from lessons.precision import WEIGHT_STD, flushed_fraction, quantize

TOKENS, IN_FEATURES, OUT_FEATURES = 2048, 1024, 1024  # the study's layer: seconds on a CPU
X_TOKEN_SIGMA = 1.0  # log-normal per-token magnitude of the activations (e^sigma: one standard deviation)
DY_TOKEN_SIGMA = 2.0  # gradients spread wider across tokens
RESULT_NAME = "training_precision.json"
COMMAND = "python -m lessons precision --training"
ACCUMULATION_BOUND = 2.0 ** -10  # tests/test_wgrad.py (GPU): the kernel's error vs float64 per element, of sum |ab|

GEMMS = {  # gemm -> (D, A, B, K), the kernel's view
    "forward": ("y = x W^T (T, O)", "x (T, I)", "W (O, I)", "I"),
    "dgrad": ("dx = dy W (T, I)", "dy (T, O)", "W^T (I, O)", "O"),
    "wgrad": ("dW = dy^T x (O, I), FP32 +=", "dy^T (O, T)", "x^T (I, T)", "T"),
}


# ----------------------------------------------------------------------------------------------- the operands

def training_data(tokens: int, in_features: int, out_features: int, rng) -> tuple[np.ndarray, ...]:
    """(x (T, I), w (O, I), dy (T, O)) float32: activations and gradients with outlier channels, outlier tokens
    (:func:`lessons.precision.outlier_activations`) and a log-normal magnitude per token; weights N(0, WEIGHT_STD)."""
    def spread(values, sigma):
        return values * np.exp(sigma * rng.standard_normal((values.shape[0], 1))).astype(np.float32)
    x = spread(precision.outlier_activations(tokens, in_features, rng)[0], X_TOKEN_SIGMA)
    w = rng.standard_normal((out_features, in_features), dtype=np.float32) * np.float32(WEIGHT_STD)
    dy = spread(precision.outlier_activations(tokens, out_features, rng)[0], DY_TOKEN_SIGMA)
    return x, w, dy


def unquantized_operands(x, w, dy) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{gemm: (A, B)} in float32, D = A B^T: what each GEMM multiplies before any cast."""
    return {"forward": (x, w), "dgrad": (dy, w.T), "wgrad": (dy.T, x.T)}


def recipe_operands(x, w, dy, *, ue8m0: bool = False) -> dict[str, tuple[tuple, tuple]]:
    """{gemm: ((a, sa), (b, sb))} as the kernels take them, cast by the library (NumPy, row-major scales):
    x and dy 1x128 per token, W 128x128 once; dgrad's B is that cast of W transposed, not a cast of its own;
    wgrad's operands are dy and x cast again, transposed, 1x128 along the tokens."""
    weight = per_block_cast_to_fp8(w, ue8m0=ue8m0)
    weight_t = (np.ascontiguousarray(weight[0].T), np.ascontiguousarray(weight[1].T))
    return {"forward": (per_token_cast_to_fp8(x, ue8m0=ue8m0), weight),
            "dgrad": (per_token_cast_to_fp8(dy, ue8m0=ue8m0), weight_t),
            "wgrad": (transpose_cast_to_fp8(dy, ue8m0=ue8m0), transpose_cast_to_fp8(x, ue8m0=ue8m0))}


def dequantize_operands(gemm: str, operands) -> tuple[np.ndarray, np.ndarray]:
    """(A, B) in float64 from :func:`recipe_operands`' entry for ``gemm`` (B is 128x128 except in wgrad)."""
    (a, sa), (b, sb) = operands
    b_values = dequantize_per_token(b, sb) if gemm == "wgrad" else dequantize_per_block(b, sb)
    return dequantize_per_token(a, sa), b_values


def weight_reuse(w) -> dict:
    """dgrad's B, the forward's 128x128 cast of W transposed, against casting W^T afresh: the fraction of equal
    codes and whether the scales are equal (128x128 blocks: all of them, bit for bit), and the same for 1x128 groups
    (per_token_cast_to_fp8 of W and of W^T), whose groups run along the other axis."""
    out = {}
    for scaling, cast in (("128x128", per_block_cast_to_fp8), ("1x128", per_token_cast_to_fp8)):
        (q, s), (qt, st) = cast(w), cast(np.ascontiguousarray(w.T))
        out[scaling] = {"same_codes": float(np.mean(qt.view(np.uint8) == q.T.view(np.uint8))),
                        "same_scales": bool(st.shape == s.T.shape and np.array_equal(st, s.T))}
    return out


def forward_scale_spread(x) -> dict:
    """How much the forward's scales of x vary along wgrad's K axis: for every 128-token K block of wgrad and every
    128-channel group, the ratio of the largest to the smallest per-token scale (one would have to be constant for
    a kernel to apply it after the tensor cores' sum): its median and maximum over the blocks."""
    _, scales = per_token_cast_to_fp8(x)
    ratios = [(block.max(axis=0) / block.min(axis=0)) for block in
              (scales[start:start + GROUP] for start in range(0, scales.shape[0], GROUP))]
    ratios = np.concatenate(ratios)
    return {"median": float(np.median(ratios)), "max": float(ratios.max())}


# ------------------------------------------------------------------------------------------------- the table

def errors(d, exact, magnitude) -> dict:
    """calc_diff and the per-element error relative to sum |a b| (median, max)."""
    relative = np.abs(d - exact) / magnitude
    return {"diff": calc_diff(d, exact), "err_median": float(np.median(relative)), "err_max": float(relative.max())}


def _forward_codes_with_one_scale_per_block(q, scales) -> np.ndarray:
    """x (T, I) from the forward's codes when one scale must serve each 128-token K block of wgrad: every token's
    codes taken with the scales of its block's first token (the forward's scales vary along the block)."""
    tokens = q.shape[0]
    first = scales[(np.arange(tokens) // GROUP) * GROUP]  # (T, I/128)
    return e4m3_decode(q).astype(np.float64) * np.repeat(first.astype(np.float64), GROUP, axis=1)[:, :q.shape[1]]


RECIPE_LABELS = {  # gemm -> how the recipe scales A and B
    "forward": ("x 1x128 per token", "W 128x128"),
    "dgrad": ("dy 1x128 per token", "forward's W 128x128, transposed"),
    "wgrad": ("dy^T 1x128 along tokens", "x^T 1x128 along tokens"),
}


def precision_table(x, w, dy) -> list[dict]:
    """One row per (GEMM, scaling scheme): the recipe, then what it is chosen over. ``scheme`` names the row."""
    recipe = recipe_operands(x, w, dy)
    rows = []
    for gemm, (a, b) in unquantized_operands(x, w, dy).items():
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        exact, magnitude = a64 @ b64.T, np.abs(a64) @ np.abs(b64).T

        def row(scheme, a_label, b_label, a_values, a_flushed, b_values, b_flushed):
            rows.append({"gemm": gemm, "scheme": scheme, "a": a_label, "b": b_label, "a_flushed": a_flushed,
                         "b_flushed": b_flushed, **errors(a_values @ b_values.T, exact, magnitude)})

        (qa, _), (qb, _) = recipe[gemm]
        a_values, b_values = dequantize_operands(gemm, recipe[gemm])
        a_recipe, b_recipe = (a_values, flushed_fraction(qa, a)), (b_values, flushed_fraction(qb, b))
        a_label, b_label = RECIPE_LABELS[gemm]
        a_name, b_name = GEMMS[gemm][1].split()[0], GEMMS[gemm][2].split()[0]
        row("recipe", a_label, b_label, *a_recipe, *b_recipe)
        row("per tensor", f"{a_name} per tensor", f"{b_name} per tensor", *quantize(a, "tensor"),
            *quantize(b, "tensor"))
        if gemm != "wgrad":  # the weight as in the recipe
            row("128x128 activations", f"{a_name} 128x128", b_label, *quantize(a, "128x128"), *b_recipe)
        if gemm == "dgrad":  # a 1x128 weight: W^T's groups run along O, so W^T is made again from the forward's FP8 W
            forward_w = dequantize_per_token(*per_token_cast_to_fp8(w))  # (O, I), 1x128 along I
            q, scales = per_token_cast_to_fp8(np.ascontiguousarray(forward_w.T, np.float32))  # along O: rounded again
            row("1x128 weight, cast twice", a_label, "W^T 1x128, re-cast from a 1x128 forward W", *a_recipe,
                dequantize_per_token(q, scales), flushed_fraction(q, b))
        if gemm == "wgrad":
            row("128x128 activations", f"{a_name} 128x128", f"{b_name} 128x128", *quantize(a, "128x128"),
                *quantize(b, "128x128"))
            q, scales = recipe["forward"][0]
            row("forward cast, per element", a_label, "forward's x cast, per element (no kernel)", *a_recipe,
                dequantize_per_token(q, scales).T, flushed_fraction(q, x))
            row("forward codes, one scale per K block", a_label, "forward's x codes, 1st token's scale", *a_recipe,
                _forward_codes_with_one_scale_per_block(q, scales).T, flushed_fraction(q, x))
    return rows


TABLE_COLUMNS = [
    Column("gemm", "GEMM", align="left"), Column("a", "A", align="left"), Column("b", "B", align="left"),
    Column("a_flushed", "A flushed to 0", "{:.2%}"), Column("b_flushed", "B flushed to 0", "{:.2%}"),
    Column("diff", "calc_diff", "{:.1e}"), Column("err_median", "err, median", "{:.1e}"),
    Column("err_max", "err, max", "{:.1e}"),
]


def recast_table(x, dy) -> list[dict]:
    """wgrad's x^T made from the forward's FP8 x (dequantized, cast again along the tokens: what a framework that
    keeps only the FP8 activations for the backward pass does) against cast from x itself, with amax/448 scales and
    with power-of-two (UE8M0) scales, dy^T cast from dy alike. ``changed``: the fraction of x's values that the
    second cast moves off the forward's. With power-of-two scales only values that the new scale puts below e4m3's
    smallest normal (2^-6), where fewer mantissa bits are left, can move: a normal e4m3 value times a power of two
    is another one."""
    dy_t = dy.T.astype(np.float64)
    exact = dy_t @ x.astype(np.float64)
    magnitude = np.abs(dy_t) @ np.abs(x.astype(np.float64))
    rows = []
    for scales, ue8m0 in (("amax / 448", False), ("UE8M0 (power of two)", True)):
        a_values = dequantize_per_token(*transpose_cast_to_fp8(dy, ue8m0=ue8m0))
        forward = dequantize_per_token(*per_token_cast_to_fp8(x, ue8m0=ue8m0))  # (T, I), as the forward saw it
        direct = dequantize_per_token(*transpose_cast_to_fp8(x, ue8m0=ue8m0))
        again = dequantize_per_token(*transpose_cast_to_fp8(forward.astype(np.float32), ue8m0=ue8m0))
        rows.append({"scales": scales, "changed": float(np.mean(again != forward.T)),
                     **{f"{key}_direct": value for key, value in errors(a_values @ direct.T, exact,
                                                                        magnitude).items()},
                     **{f"{key}_again": value for key, value in errors(a_values @ again.T, exact,
                                                                       magnitude).items()}})
    return rows


RECAST_COLUMNS = [
    Column("scales", "scales", align="left"), Column("changed", "x values the 2nd cast moves", "{:.2%}"),
    Column("diff_direct", "calc_diff, x^T cast from x", "{:.1e}"),
    Column("diff_again", "calc_diff, from the forward's FP8", "{:.1e}"),
    Column("err_max_direct", "max err, from x", "{:.1e}"), Column("err_max_again", "max err, from FP8", "{:.1e}"),
]


# ----------------------------------------------------------------------------------------------- the study

def study(tokens: int = TOKENS, in_features: int = IN_FEATURES, out_features: int = OUT_FEATURES,
          seed: int = 0) -> dict:
    """Everything the command writes: the sizes and data, the precision table, the re-cast table, the weight
    reuse check and the spread of the forward's scales along wgrad's K."""
    x, w, dy = training_data(tokens, in_features, out_features, np.random.default_rng(seed))
    return {"seed": seed, "sizes": {"tokens": tokens, "in_features": in_features, "out_features": out_features},
            "data": describe_data(), "rows": precision_table(x, w, dy), "recast": recast_table(x, dy),
            "weight_reuse": weight_reuse(w), "forward_scale_spread": forward_scale_spread(x),
            "accumulation_bound": ACCUMULATION_BOUND}


def describe_data() -> str:
    return (f"x: N(0,1), {precision.OUTLIER_CHANNELS:.0%} of channels x{precision.CHANNEL_GAIN:g}, "
            f"{precision.OUTLIER_TOKENS} tokens x{precision.TOKEN_GAIN:g}, per-token log-normal magnitude "
            f"(sigma {X_TOKEN_SIGMA:g}); dy: the same with sigma {DY_TOKEN_SIGMA:g}; W: N(0, {WEIGHT_STD:g})")


def describe(result: dict) -> list[str]:
    """The lines around the tables, for the terminal, the guide (python -m lessons docs) and the notebook."""
    sizes = result["sizes"]
    spread, reuse = result["forward_scale_spread"], result["weight_reuse"]
    return [
        f"T={sizes['tokens']} tokens, I={sizes['in_features']} in, O={sizes['out_features']} out features, "
        f"seed {result['seed']}. Data: {result['data']}.",
        "Each row: float64 GEMM of the dequantized operands against the float64 GEMM of the unquantized ones "
        "(quantization alone); err = |D - exact| / sum|ab| per element. The kernel adds its accumulation error on "
        f"top: the GPU tests (tests/test_wgrad.py) hold it under {result['accumulation_bound']:.1e} of sum|ab| on "
        "Gaussian operands.",
        "dgrad's weight, cast(W^T) against the forward's cast(W)^T: " + "; ".join(
            f"{scaling}: {reuse[scaling]['same_codes']:.1%} of the codes equal, the scales "
            + ("equal" if reuse[scaling]["same_scales"] else "different") for scaling in ("128x128", "1x128")) + ".",
        f"wgrad's K blocks: within 128 tokens, the forward's scales of one 128-channel group of x span a factor "
        f"of {spread['median']:.0f} (median over blocks; at most {spread['max']:.0f}).",
    ]


def print_study(result: dict) -> None:
    head, *notes = describe(result)
    print("FP8 training, one linear layer's three GEMMs. " + head)
    print(format_table(TABLE_COLUMNS, result["rows"]))
    for line in notes:
        print(line)
    print("\nwgrad's x^T made from the forward's FP8 copy of x, by the kind of scale:")
    print(format_table(RECAST_COLUMNS, result["recast"]))


def markdown_block(result: dict) -> str:
    """The guide's block (``python -m lessons docs`` writes it from results/training_precision.json)."""
    head, *notes = describe(result)
    return "\n".join([f"{head} {result['date'][:10]}; `{result['command']}`.", "",
                      format_table(TABLE_COLUMNS, result["rows"], markdown=True), "",
                      *(f"* {line}" for line in notes), "",
                      "wgrad's xᵀ made from the forward's FP8 copy of x, by the kind of scale:", "",
                      format_table(RECAST_COLUMNS, result["recast"], markdown=True)])


def run(seed: int = 0, out=None) -> int:
    """``python -m lessons precision --training``: print the study and write it as a result file into ``out``
    (default: results/ in a checkout, :func:`lessons.results_store.write_dir`)."""
    from pathlib import Path

    from gemm.testing.records import device_info, write_result
    from lessons import results_store
    result = study(seed=seed)
    print_study(result)
    path = Path(out or results_store.write_dir()) / RESULT_NAME
    command = COMMAND + (f" --seed {seed}" if seed else "")
    write_result(path, command=command, device=device_info(), **result)
    print(f"\nwrote {results_store.shown(path)}")
    return 0


__all__ = [
    "TOKENS", "IN_FEATURES", "OUT_FEATURES", "X_TOKEN_SIGMA", "DY_TOKEN_SIGMA", "RESULT_NAME", "COMMAND",
    "ACCUMULATION_BOUND", "GEMMS", "RECIPE_LABELS", "training_data", "unquantized_operands", "recipe_operands",
    "dequantize_operands", "weight_reuse", "forward_scale_spread", "errors", "precision_table", "TABLE_COLUMNS",
    "recast_table", "RECAST_COLUMNS", "study", "describe_data", "describe", "print_study", "markdown_block", "run",
]
