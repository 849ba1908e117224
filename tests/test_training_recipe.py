"""The training recipe's lesson (lessons/training_recipe.py): the three GEMMs' operands as the library casts them, and
the claims docs/guide.md section 5 and notebooks/training_recipe.ipynb make from its tables, on several seeds and a
small layer (CPU, seconds): dgrad reuses the forward's weight bit for bit, wgrad's operands are cast along the
tokens, the recipe beats each alternative where the guide says it does, and ``python -m lessons precision
--training`` writes what the guide quotes."""
from __future__ import annotations

import functools
import json

import numpy as np
import pytest

from gemm.fp8 import GROUP, ceil_div, per_block_cast_to_fp8, per_token_cast_to_fp8, transpose_cast_to_fp8
from lessons import training_recipe as tr
from lessons.__main__ import main

SEEDS = [0, 1, 2]
SMALL = dict(tokens=512, in_features=256, out_features=256)


@functools.lru_cache(maxsize=None)
def small_study(seed: int) -> dict:
    return tr.study(**SMALL, seed=seed)


def rows_by_scheme(result: dict) -> dict[tuple[str, str], dict]:
    return {(row["gemm"], row["scheme"]): row for row in result["rows"]}


@pytest.mark.parametrize("ue8m0", [False, True])
def test_dgrad_takes_the_forwards_weight_cast_bit_for_bit(ue8m0, rng):
    """A 128x128 block of W is a block of W^T: casting W^T afresh gives the forward's codes and scales, transposed."""
    x, w, dy = tr.training_data(256, 384, 640, rng)  # O = 640: five 128-row blocks of W, I = 384: three
    (_, (b, sb)) = tr.recipe_operands(x, w, dy, ue8m0=ue8m0)["dgrad"]
    q, scales = per_block_cast_to_fp8(np.ascontiguousarray(w.T), ue8m0=ue8m0)
    assert b.shape == (384, 640) and sb.shape == (3, 5)
    assert np.array_equal(b.view(np.uint8), q.view(np.uint8)) and np.array_equal(sb, scales)
    reuse = tr.weight_reuse(w)
    assert reuse["128x128"] == {"same_codes": 1.0, "same_scales": True}
    assert reuse["1x128"]["same_codes"] < 0.5 and not reuse["1x128"]["same_scales"]


def test_wgrad_operands_are_cast_along_the_tokens(rng):
    """dy^T (O, T) and x^T (I, T), one scale per row per 128 tokens, T ragged; K = T in the kernel's view."""
    tokens, in_features, out_features = 400, 136, 200
    x, w, dy = tr.training_data(tokens, in_features, out_features, rng)
    (a, sa), (b, sb) = tr.recipe_operands(x, w, dy)["wgrad"]
    assert a.shape == (out_features, tokens) and sa.shape == (out_features, ceil_div(tokens, GROUP))
    assert b.shape == (in_features, tokens) and sb.shape == (in_features, ceil_div(tokens, GROUP))
    for (q, scales), source in (((a, sa), dy), ((b, sb), x)):
        want_q, want_scales = transpose_cast_to_fp8(source)
        assert np.array_equal(q.view(np.uint8), want_q.view(np.uint8)) and np.array_equal(scales, want_scales)
    forward_a, forward_sa = tr.recipe_operands(x, w, dy)["forward"][0]
    assert np.array_equal(forward_sa, per_token_cast_to_fp8(x)[1]) and forward_a.shape == (tokens, in_features)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_recipe_beats_per_tensor_and_128x128_activations(seed):
    rows = rows_by_scheme(small_study(seed))
    for gemm in tr.GEMMS:
        recipe, tensor, blocks = rows[gemm, "recipe"], rows[gemm, "per tensor"], rows[gemm, "128x128 activations"]
        where = f"seed {seed} {gemm}: {recipe}, {tensor}, {blocks}"
        assert tensor["a_flushed"] > 0.1 and 3 * recipe["a_flushed"] < blocks["a_flushed"] < tensor["a_flushed"], where
        assert recipe["err_median"] < tensor["err_median"] / 1.5 and recipe["err_max"] < tensor["err_max"] / 3, where
        assert recipe["err_median"] < blocks["err_median"] and recipe["err_max"] < blocks["err_max"], where


@pytest.mark.parametrize("seed", SEEDS)
def test_a_1x128_weight_cast_twice_for_dgrad_costs_precision(seed):
    rows = rows_by_scheme(small_study(seed))
    recipe, twice = rows["dgrad", "recipe"], rows["dgrad", "1x128 weight, cast twice"]
    assert twice["diff"] > 1.3 * recipe["diff"] and twice["err_median"] > recipe["err_median"], (seed, recipe, twice)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_forwards_cast_cannot_serve_wgrad(seed):
    """Its scales vary along wgrad's K (per token); applied per element they would be about as precise (no kernel
    can), and its codes under one scale per K block are wrong."""
    result = small_study(seed)
    rows = rows_by_scheme(result)
    recipe = rows["wgrad", "recipe"]
    per_element = rows["wgrad", "forward cast, per element"]
    one_scale = rows["wgrad", "forward codes, one scale per K block"]
    assert result["forward_scale_spread"]["median"] > 10, result["forward_scale_spread"]
    assert per_element["err_median"] >= 0.9 * recipe["err_median"], (seed, recipe, per_element)
    assert one_scale["diff"] > 0.1 and one_scale["err_median"] > 10 * recipe["err_median"], (seed, one_scale)


@pytest.mark.parametrize("seed", SEEDS)
def test_recasting_the_forwards_fp8_moves_only_subnormal_values_with_power_of_two_scales(seed):
    recast = {row["scales"]: row for row in small_study(seed)["recast"]}
    amax, ue8m0 = recast["amax / 448"], recast["UE8M0 (power of two)"]
    assert amax["changed"] > 0.9 and ue8m0["changed"] < 0.15, recast
    assert ue8m0["diff_again"] == pytest.approx(ue8m0["diff_direct"], rel=0.02), ue8m0
    # the mechanism: a value moves only where the second scale puts it below e4m3's smallest normal, 2^-6
    from gemm.fp8 import dequantize_per_token
    x, _, _ = tr.training_data(**SMALL, rng=np.random.default_rng(seed))
    forward = dequantize_per_token(*per_token_cast_to_fp8(x, ue8m0=True))
    q, scales = transpose_cast_to_fp8(forward.astype(np.float32), ue8m0=True)
    moved = dequantize_per_token(q, scales) != forward.T
    scaled = np.abs(forward.T) / np.repeat(scales.astype(np.float64), GROUP, axis=1)[:, :x.shape[0]]
    assert moved.any() and (scaled[moved] < 2.0 ** -6).all()


def test_the_command_writes_what_the_guide_quotes(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tr, "study", functools.partial(tr.study, **SMALL))  # the command's sizes, made small
    assert main(["precision", "--training", "--seed", "3", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "forward's x codes, 1st token's scale" in out and f"wrote {tmp_path}" in out
    result = json.loads((tmp_path / tr.RESULT_NAME).read_text())
    assert result["command"] == "python -m lessons precision --training --seed 3" and result["seed"] == 3
    assert result["sizes"] == {"tokens": 512, "in_features": 256, "out_features": 256} and result["date"]
    assert [row["gemm"] for row in result["rows"]] == ["forward"] * 3 + ["dgrad"] * 4 + ["wgrad"] * 5
    block = tr.markdown_block(result)
    assert "| wgrad | dy^T 1x128 along tokens | x^T 1x128 along tokens |" in block and result["command"] in block
    assert main(["precision", "--out", str(tmp_path)]) == 2  # --out says where --training writes, nothing else


def test_the_committed_result_is_the_commands():
    """results/training_precision.json holds the default study (the guide's block is rendered from it: tests/
    test_harness.py checks that the guide is current)."""
    from lessons import results_store
    path = results_store.committed_dir() / tr.RESULT_NAME
    result = json.loads(path.read_text())
    assert result["command"] == tr.COMMAND and result["seed"] == 0
    assert result["sizes"] == {"tokens": tr.TOKENS, "in_features": tr.IN_FEATURES, "out_features": tr.OUT_FEATURES}
    assert [(row["gemm"], row["scheme"]) for row in result["rows"]] == \
        [(row["gemm"], row["scheme"]) for row in small_study(0)["rows"]]
