"""The accumulator-precision model of the emulator's wgmma (ptx.emulate.matrix) and the precision tables
(lessons.precision): off by default and then bit-identical to the exact arithmetic, on it loses exactly what it
documents, and the tables order the schemes as the notebook says, for every seed tried. CPU only."""
import ml_dtypes
import numpy as np
import pytest

import lessons
from lessons import precision
from gemm.fp8 import calc_diff, e4m3_decode
from gemm.kernel import generate
from gemm.testing.problems import reference_gemm
from ptx.emulate.matrix import (AccumulatorModel, accumulator_model, active_accumulator_model,
                                limited_precision_sum, wgmma_accumulate)

SEEDS = [0, 1, 2, 3]
STAGE08 = lessons.stage(8)


def bf16(x):
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def e4m3_values(rng, shape):
    """Random e4m3 values as float64, spanning the format (subnormals and 448 included)."""
    bits = rng.integers(0, 256, shape, dtype=np.uint8)
    bits[(bits & 0x7F) == 0x7F] = 0  # no NaN codes
    return bits.view(ml_dtypes.float8_e4m3fn).astype(np.float64)


# ------------------------------------------------------------------------------------- the model, off and on

def test_the_model_is_off_by_default_and_only_inside_its_block():
    assert active_accumulator_model() is None
    with accumulator_model(12) as model:
        assert active_accumulator_model() == model == AccumulatorModel(12)
        with accumulator_model(None):
            assert active_accumulator_model() is None
        assert active_accumulator_model() == model
    assert active_accumulator_model() is None
    with pytest.raises(RuntimeError), accumulator_model():
        raise RuntimeError("left by an exception")
    assert active_accumulator_model() is None


@pytest.mark.parametrize("seed", SEEDS)
def test_the_exact_path_is_the_former_arithmetic_bit_for_bit(seed):
    """With the model off, one wgmma's update is what the emulator computed before the model existed:
    (sign * A @ B^T)[fragment] + accumulator in float64, rounded once to FP32."""
    from ptx.emulate.async_proxy import _accumulator_layout
    rng = np.random.default_rng(seed)
    for n, sign, scale_d in ((256, 1, True), (64, -1, True), (16, 1, False)):
        a, b = e4m3_values(rng, (64, 32)), e4m3_values(rng, (n, 32))
        rows, cols = _accumulator_layout(n)
        current = (rng.standard_normal((128, n // 2)) * 2.0 ** rng.integers(-20, 20, (128, n // 2)))
        current = current.astype(np.float32).astype(np.float64)
        got = wgmma_accumulate(a, b, sign, rows, cols, current if scale_d else None)
        fragment = (sign * (a @ b.T))[rows, cols]
        want = np.stack([(fragment[:, i] + (current[:, i] if scale_d else 0.0)).astype(np.float32)
                         for i in range(n // 2)], 1)
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"seed {seed}"


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_an_emulated_kernel_without_the_model_does_every_wgmma_as_before(seed, monkeypatch):
    """A real run (random data, so FP32 rounding happens), each wgmma checked against the former arithmetic."""
    from gemm.testing.emulated import run_gemm
    from gemm.testing.problems import random_problem
    from ptx.emulate.async_proxy import _accumulator_layout
    from ptx.emulate.warpgroup import Warpgroup
    multiply, checked = Warpgroup._multiply, []

    def checking(self, acc, a_desc, b_desc, scale_d, n, sign):
        before = {name: np.array(self.regs[name]) for name in acc if scale_d}
        multiply(self, acc, a_desc, b_desc, scale_d, n, sign)
        fragment = (sign * (self._operand(a_desc, 64) @ self._operand(b_desc, n).T))[_accumulator_layout(n)]
        for i, name in enumerate(acc):
            want = (fragment[:, i] + (before[name].astype(np.float64) if scale_d else 0.0)).astype(np.float32)
            assert np.array_equal(np.asarray(self.regs[name], np.float32).view(np.uint32), want.view(np.uint32))
        checked.append(n)

    monkeypatch.setattr(Warpgroup, "_multiply", checking)
    m, n, k = 130, 192, 384
    problem = random_problem(m, n, k, np.random.default_rng(seed))
    config = STAGE08.config(m, n, k).replace(block_m=128, block_n=192, stages=2)
    out = run_gemm(config, *problem, sm_count=2, seed=seed)
    assert checked and calc_diff(out, reference_gemm(*problem)) < 1e-5, f"seed {seed}"


def test_small_addends_vanish_after_a_large_one():
    """bits=14: once the accumulator holds 256 = 2**8, a term keeps only its bits of weight >= 2**(8-13) = 1/32."""
    big = np.array([256.0])
    assert limited_precision_sum(np.full((1, 32), 2.0 ** -6), big)[0] == 256.0  # exact: 256.5
    assert limited_precision_sum(np.full((1, 32), -2.0 ** -6), big)[0] == 256.0  # truncated toward zero
    assert limited_precision_sum(np.full((1, 32), 2.0 ** -5), big)[0] == 257.0  # exactly representable: kept
    assert limited_precision_sum(np.full((1, 32), 3 * 2.0 ** -6), big)[0] == 257.0  # 3/64 -> 2/64 each
    assert limited_precision_sum(np.full((1, 32), 2.0 ** -6))[0] == 0.5  # alone they are the largest: exact
    products = np.zeros((1, 32))
    products[0, 0], products[0, 1:] = 256.0, 2.0 ** -6  # the large one among the products does the same
    assert limited_precision_sum(products)[0] == 256.0
    assert AccumulatorModel(20).accumulate(np.full((1, 32), 2.0 ** -6), big)[0] == 256.5  # wider: kept


@pytest.mark.parametrize("seed", SEEDS)
def test_the_model_keeps_bits_below_the_largest_term_and_is_sign_symmetric(seed):
    rng = np.random.default_rng(seed)
    for bits in (8, 14, 18):  # up to 18 bits the sum (< 2**(bits + 6) units) is written to FP32 exactly
        products = e4m3_values(rng, (200, 32)) * e4m3_values(rng, (200, 32))
        current = (rng.standard_normal(200) * 2.0 ** rng.integers(-10, 12, 200)).astype(np.float32)
        got = limited_precision_sum(products, current, bits).astype(np.float64)
        exact = products.sum(1) + current
        largest = np.maximum(np.abs(products).max(1), np.abs(current))
        unit = 2.0 ** (np.floor(np.log2(largest)) - bits + 1)
        assert (np.abs(got - exact) <= 33 * unit).all(), f"seed {seed} bits {bits}"  # < 1 unit lost per term
        assert np.array_equal(limited_precision_sum(-products, -current, bits), -got.astype(np.float32))
        assert np.array_equal(got, limited_precision_sum(products[:, ::-1], current, bits)), "order-free"


def test_the_emulated_kernel_loses_the_small_addends_under_the_model():
    """D[i, j] = 16*16 + 96 * (1/8)^2 = 257.5 over one K block: BF16 258 exactly, 256 under the 14-bit model."""
    from gemm.testing.emulated import run_gemm
    m = n = 64
    k = 128
    x = np.zeros((m, k), np.float32)
    x[:, 0], x[:, 32:] = 16.0, 0.125
    a = x.astype(ml_dtypes.float8_e4m3fn)
    sa, sb = np.ones((m, 1), np.float32), np.ones((1, 1), np.float32)
    config = STAGE08.config(m, n, k)
    assert (run_gemm(config, a, sa, a, sb, sm_count=1) == 258.0).all()
    with accumulator_model(14):
        assert (run_gemm(config, a, sa, a, sb, sm_count=1) == 256.0).all()


@pytest.mark.parametrize("seed", SEEDS[:2])
@pytest.mark.parametrize("data", ["zero-mean", "same-sign"])
def test_precision_accumulate_is_the_emulated_kernel_bit_for_bit(seed, data):
    """One home for the model: lessons.precision.accumulate, promoted every 128 or never, reproduces the emulated
    kernel (promotion as generated, or deleted) exactly, for the exact path and for the model."""
    from gemm.testing.emulated import run_gemm
    m, n, k = 100, 72, 384
    a, sa, b, sb = precision.per_tensor_problem(m, n, k, data, seed=seed)
    scale = np.float32(sa[0, 0]) * np.float32(sb[0, 0])
    a64, b64 = (e4m3_decode(v).astype(np.float64) for v in (a, b))
    config = STAGE08.config(m, n, k)
    deleted = precision.without_promotion(generate(config, n, k))
    for model in (None, AccumulatorModel(14), AccumulatorModel(9)):
        with accumulator_model(model):
            promoted = run_gemm(config, a, sa, b, sb, sm_count=2, seed=seed)
            whole = run_gemm(config, a, sa, b, sb, sm_count=2, seed=seed, ptx=deleted)
        assert np.array_equal(promoted, bf16(precision.accumulate(a64, b64, model, 128, scale=scale))), \
            f"seed {seed} {model}"
        assert np.array_equal(whole, bf16(precision.accumulate(a64, b64, model, None) * scale)), f"seed {seed} {model}"


def test_deleting_the_promotion_on_the_emulator_makes_the_error_grow_with_k():
    from gemm.testing.emulated import run_gemm
    errors = {}
    for k in (256, 2048):
        problem = precision.per_tensor_problem(64, 64, k, "same-sign", seed=k)
        want, config = reference_gemm(*problem), STAGE08.config(64, 64, k)
        deleted = precision.without_promotion(generate(config, 64, k))
        assert calc_diff(run_gemm(config, *problem, sm_count=1, ptx=deleted), want) < 1e-5  # exact: harmless
        with accumulator_model(14):
            errors[k] = calc_diff(run_gemm(config, *problem, sm_count=1, ptx=deleted), want)
        with accumulator_model(14):
            assert calc_diff(run_gemm(config, *problem, sm_count=1), want) < 1e-5  # promoted: BF16's error
    assert errors[2048] > 10 * errors[256] > 1e-5, errors


def test_without_promotion_edits_the_ptx_and_refuses_what_it_cannot_delete():
    from gemm.kernel import generate
    config = STAGE08.config(256, 256, 512)
    ptx = generate(config, 256, 512)
    edited = precision.without_promotion(ptx)
    assert "fma.rn.f32 %tot" in ptx and "fma.rn.f32 %tot" not in edited
    assert "%p_fresh" in ptx.split("wgmma.mma_async", 1)[1] and "wgmma" in edited
    assert not any("%p_fresh" in line for line in edited.splitlines() if "wgmma.mma_async" in line)
    assert "mov.f32 %acc_" not in ptx and edited.count("mov.f32 %acc_") == ptx.count("mov.f32 %tot_")
    with pytest.raises(ValueError, match="several"):
        precision.without_promotion(generate(config.replace(block_m=256, block_n=128, stages=2), 256, 512))


# ------------------------------------------------------------------------------------------------- the tables

@pytest.mark.parametrize("seed", SEEDS)
def test_fine_grained_scaling_beats_per_tensor_on_outlier_data(seed):
    rows = {(r["activations"], r["weights"]): r for r in precision.scaling_table(seed=seed)}
    tensor, block, group = rows["tensor", "tensor"], rows["128x128", "128x128"], rows["1x128", "1x128"]
    deepseek = rows["1x128", "128x128"]
    where = f"seed {seed}: {rows}"
    assert tensor["x_flushed"] > 0.2 and block["x_flushed"] < tensor["x_flushed"], where
    assert group["x_flushed"] < 1e-3 and deepseek["x_flushed"] < 1e-3, where
    for key in ("diff_ordinary", "worst_token"):
        assert block[key] < tensor[key] and group[key] < tensor[key] / 2 and deepseek[key] < tensor[key] / 2, where
    assert group["diff"] < tensor["diff"] and deepseek["diff"] < tensor["diff"], where
    assert all(r["w_flushed"] < 1e-3 for r in rows.values()), where  # smooth weights: any scaling holds them


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("data", ["zero-mean", "same-sign"])
def test_promotion_keeps_the_accumulation_error_flat_while_without_it_it_grows(seed, data):
    ks = (512, 1024, 2048, 4096, 8192)
    rows = precision.accumulation_table(ks, data=data, seed=seed)
    whole = [r["rel_whole"] for r in rows]
    promoted = [r["rel_promoted"] for r in rows]
    where = f"seed {seed} {data}: whole {whole}, promoted {promoted}"
    assert all(later > earlier for earlier, later in zip(whole, whole[1:])), where
    assert whole[-1] > 4 * whole[0], where
    assert max(promoted) < 1.5 * min(promoted), where
    assert all(p < w for p, w in zip(promoted, whole)), where
    assert all(r["diff_fp32"] < 1e-12 for r in rows), where  # an FP32 accumulator alone is not the problem


@pytest.mark.parametrize("seed", SEEDS)
def test_128x128_weight_blocks_serve_w_and_its_transpose(seed):
    rows = {r["scaling"]: r for r in precision.transpose_table(n=256, k=384, seed=seed)}
    block, group = rows["128x128"], rows["1x128"]
    assert block["same_codes"] == 1.0 and "transposed" in block["wt_scales"], f"seed {seed}: {block}"
    assert block["diff_from_fp8"] == block["diff_cast"], f"seed {seed}: {block}"  # the very same values
    assert group["same_codes"] < 0.9 and group["diff_from_fp8"] > 1.3 * group["diff_cast"], f"seed {seed}: {group}"


def test_128x128_weight_blocks_need_one_scale_per_tile_and_k_block():
    rows = {r["scaling"]: r for r in precision.scale_loads_table(128, 128, 7168)}
    assert rows["128x128"]["b_scales"] == 1 and rows["128x128"]["thread_scales"] == 1
    assert rows["1x128"]["b_scales"] == 128 and rows["1x128"]["thread_scales"] == 32  # wgmma's fragment: 32 columns
    assert rows["1x128"]["b_bytes"] == 128 * rows["128x128"]["b_bytes"] == 128 * 4 * 56
    assert precision.accumulator_columns(256) == 64


def test_print_tables_runs(capsys):
    precision.print_tables()
    out = capsys.readouterr().out
    assert "no promotion" in out and "cast(W^T) == cast(W)^T" in out and "1x128" in out
