"""Stages 04 and 05 with each bundled idea turned off (``Options``, ``python -m lessons ablate 4|5``).

CPU: every ablated variant is still a correct kernel: its PTX runs in the emulator at a small ragged shape
(NaN-poisoned D, every element written, diff < 1e-3 against the float64 reference); stage 04's in lockstep and as
cooperatively scheduled warpgroups (bar.sync really waits there, so a missing barrier shows up), stage 05's
scheduled with a seed. The defaults are the stage as taught; each ablation changes the PTX and, assembled for
sm_90a, the SASS the way its docstring says. The ablate command and python -m lessons docs handle the variants.
GPU (H100): each variant against the reference on the hardware.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import lessons
from gemm.fp8 import align, bf16_to_float, calc_diff
from gemm.testing.problems import random_problem, reference_gemm

sys.path.insert(0, str(Path(__file__).parent))  # tests/tc_checks.py
from tc_checks import check_against_reference, run_on_gpu  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHAPE = (70, 40, 384)  # one ragged CTA (M, N < 128, odd rows, N not a multiple of 8), three K blocks
VARIANTS = [(number, label) for number in (4, 5) for label in lessons.stage(number).ABLATIONS]


def _options(number: int, label: str):
    stage = lessons.stage(number)
    return dataclasses.replace(stage.Options(), **stage.ABLATIONS[label])


def _scheduled(stage, options, a, sa, b, sb, seed: int) -> np.ndarray:
    """The kernel run as cooperatively scheduled warpgroups (ptx.emulate.run_kernel), warpgroups picked at random."""
    from ptx.emulate import run_kernel
    m, k = a.shape
    n = b.shape[0]
    storage = np.zeros((sa.shape[1], align(m, 4)), np.float32)
    storage[:, :m] = np.asarray(sa).T
    d = np.full((m, n), 0x7FC0, np.uint16)
    run_kernel(stage.generate(m, n, k, options), stage.KERNEL, stage.grid(m, n), options.threads,
               options.shared_bytes, dict(a=a.view(np.uint8), sa=storage, b=b.view(np.uint8),
                                          sb=np.ascontiguousarray(sb, np.float32), d=d, sa_stride=align(m, 4)),
               seed=seed)
    return bf16_to_float(d)


def _assert_correct(got, want):
    assert not np.isnan(got).any(), f"unwritten outputs at {np.argwhere(np.isnan(got))[:5].tolist()}"
    assert calc_diff(got, want) < 1e-3


# ------------------------------------------------------------------------------ CPU: the variants, emulated
@pytest.mark.parametrize("number, label", VARIANTS, ids=[f"{n:02d} {label}" for n, label in VARIANTS])
def test_ablated_variant_is_correct_in_the_emulator(number, label, rng):
    stage, options = lessons.stage(number), _options(number, label)
    a, sa, b, sb = random_problem(*SHAPE, rng)
    want = reference_gemm(a, sa, b, sb)
    seed = int(rng.integers(1 << 16))
    if number == 4:  # lockstep (stage 04's own emulate) and scheduled, where a missing barrier is a wrong answer
        _assert_correct(stage.emulate(a, sa, b, sb, options=options), want)
    _assert_correct(_scheduled(stage, options, a, sa, b, sb, seed), want)


@pytest.mark.parametrize("number", [4, 5])
def test_every_idea_off_at_once_is_still_correct(number, rng):
    stage = lessons.stage(number)
    changes = {key: value for label in stage.ABLATIONS for key, value in stage.ABLATIONS[label].items()
               if key != "stages" or value == 1}
    options = dataclasses.replace(stage.Options(), **changes)
    a, sa, b, sb = random_problem(*SHAPE, rng)
    _assert_correct(_scheduled(stage, options, a, sa, b, sb, seed=1), reference_gemm(a, sa, b, sb))


def test_the_synchronous_ring_needs_its_second_barrier(rng):
    """Power check of the scheduled emulator: stage 04 with one stage and no barrier after the math lets a warpgroup
    refill the stage while the other still reads it, which the emulator sees as a wrong answer."""
    stage = lessons.stage(4)
    options = stage.Options(stages=1)
    m, n, k = 128, 128, 512
    a, sa, b, sb = random_problem(m, n, k, rng)
    ptx = stage.generate(m, n, k, options)
    barriers = ptx.count("bar.sync 0;")
    assert barriers == 2
    cut = ptx.rindex("bar.sync 0;")
    broken = ptx[:cut] + ptx[cut + len("bar.sync 0;"):]
    from ptx.emulate import run_kernel
    storage = np.zeros((sa.shape[1], align(m, 4)), np.float32)
    storage[:, :m] = np.asarray(sa).T
    d = np.full((m, n), 0x7FC0, np.uint16)
    run_kernel(broken, stage.KERNEL, stage.grid(m, n), options.threads, options.shared_bytes,
               dict(a=a.view(np.uint8), sa=storage, b=b.view(np.uint8), sb=np.ascontiguousarray(sb, np.float32),
                    d=d, sa_stride=align(m, 4)))
    assert calc_diff(bf16_to_float(d), reference_gemm(a, sa, b, sb)) > 1e-3


# ------------------------------------------------------------------------------ CPU: the switches themselves
@pytest.mark.parametrize("number", [4, 5])
def test_defaults_are_the_stage_and_every_ablation_changes_the_ptx(number):
    stage = lessons.stage(number)
    shape = (200, 136, 384)
    default = stage.generate(*shape)
    assert stage.generate(*shape, stage.Options()) == default and stage.Options() == stage.DEFAULT
    assert stage.DEFAULT.shared_bytes == stage.SHARED_BYTES and stage.DEFAULT.threads == stage.THREADS
    texts = {label: stage.generate(*shape, _options(number, label)) for label in stage.ABLATIONS}
    assert all(text != default for text in texts.values())
    assert len(set(texts.values())) == len(texts)  # no two labels name the same variant


def test_invalid_options_are_refused():
    with pytest.raises(ValueError, match="at least one stage"):
        lessons.stage(4).Options(stages=0)
    with pytest.raises(ValueError, match="warp tile"):
        lessons.stage(4).Options(warp_m=16)
    with pytest.raises(ValueError, match="m64n64k32"):
        lessons.stage(5).Options(wgmma_n=32)


def test_stage05_copies_land_in_the_layout_the_no_swizzle_descriptor_names():
    """Without the swizzle the PTX computes (row/8)*1024 + chunk*128 + (row%8)*16 (+ pass * 4096) and the
    descriptors say LBO 128, SBO 1024, layout type 0: the same place, by the ISA's no-swizzle formula."""
    from ptx.vocab import wgmma as w
    stage = lessons.stage(5)
    for tid in range(stage.THREADS):
        for p in range(stage.BLOCK_M // stage.LOAD_ROWS_PER_PASS):
            row, chunk = stage.load_slot(tid, p)
            ptx_offset = (tid // 8 // 8) * 1024 + (tid % 8) * 128 + (tid // 8 % 8) * 16 + p * 4096
            assert ptx_offset == stage.core_matrix_offset(row, 16 * chunk)
    fields = w.descriptor_fields(w.descriptor_constant_part(stage.CORE_LBO, stage.CORE_SBO, swizzle=0))
    assert (fields["leading_byte_offset"], fields["stride_byte_offset"], fields["swizzle"]) == (128, 1024, 0)
    ptx = stage.generate(128, 128, 128, stage.Options(swizzle=False))
    assert f"{fields['leading_byte_offset'] >> 4 << 16 | fields['stride_byte_offset'] >> 4 << 32};" in ptx


# ------------------------------------------------------------------------------ CPU: assembled for sm_90a
def _sass(number: int, options) -> dict:
    from lessons.ablate import assembled
    return assembled(lessons.stage(number), 256, 256, 512, options)


def test_stage04_variants_assemble_to_the_instructions_they_describe():
    stage = lessons.stage(4)
    full = _sass(4, stage.DEFAULT)["sass"]
    assert full["LDSM"] and full["LDGSTS"] and not full["STS"]
    no_ldmatrix = _sass(4, stage.Options(ldmatrix=False))["sass"]
    assert no_ldmatrix["LDSM"] == 0 and no_ldmatrix["LDS"] >= full["LDS"] + 4 * full["LDSM"]
    no_copies = _sass(4, stage.Options(cp_async=False))["sass"]
    assert no_copies["LDGSTS"] == 0 and no_copies["STS"] and no_copies["LDG"] > full["LDG"]
    assert _sass(4, stage.Options(stages=1))["sass"]["BAR"] == 2
    small = _sass(4, stage.Options(warp_m=32))
    assert small["sass"]["HMMA"] == full["HMMA"] // 2 and small["registers"] <= 128  # 512 threads


def test_stage05_variants_assemble_to_the_instructions_they_describe():
    from ptx.compile import compile_ptx
    from ptx.sass import disassemble
    stage = lessons.stage(5)
    full = _sass(5, stage.DEFAULT)["sass"]
    narrow = [i.text for i in disassemble(compile_ptx(stage.generate(256, 256, 512, stage.Options(wgmma_n=64))))
              if i.opcode == "QGMMA"]
    assert len(narrow) == 2 * full["QGMMA"] and all("QGMMA.64x64x32" in text for text in narrow)
    direct = _sass(5, stage.Options(staged_epilogue=False))["sass"]
    assert direct["STS"] == 0 and direct["STG"] > full["STG"]  # no staging tile; 4-byte stores from registers
    assert _sass(5, stage.Options(swizzle=False))["spill_bytes"] == 0


# ------------------------------------------------------------------------------ the command and the docs
def test_ablate_without_gpu_tables_the_assembled_variants(capsys, monkeypatch):
    import ptx.device
    from lessons import ablate
    monkeypatch.setattr(ptx.device, "is_hopper", lambda: False)
    assert ablate.ablate(5, 256, 256, 512, Path("unused")) == 2  # nothing timed
    out = capsys.readouterr().out
    assert "need a Hopper GPU" in out and "QGMMA" in out and "spill B" in out
    for label in lessons.stage(5).ABLATIONS:
        assert f"05 {label}" in out
    assert ablate.stages_with_ablations() == [4, 5, 8, 15, 20]


def test_ablate_refuses_a_stage_that_bundles_nothing(capsys):
    from lessons.__main__ import main
    with pytest.raises(SystemExit) as exit_info:
        main(["ablate", "6"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "lists no ABLATIONS" in err and "04, 05, 08" in err


def _fake_ablation(number: int) -> dict:
    stage = lessons.stage(number)
    rows = [{"name": f"stage {number - 1:02d}", "config": "before", "time_us": 800.0, "tflops": 300.0,
             "gbps": 100.0, "diff": 1.4e-6, "status": "ok"}]
    from lessons.ablate import ablation_options
    for i, (name, options) in enumerate(ablation_options(number).items()):
        rows.append({"name": name, "config": options.describe(), "registers": 200 + i, "spill_bytes": 8 * i,
                     "sass": {"LDSM": 24 - i, "LDS": 14, "BAR": 1}, "time_us": 400.0 + 100 * i,
                     "tflops": 1200.0 / (1 + i / 4), "gbps": 400.0, "diff": 1.4e-6, "status": "ok",
                     "vs_stage": 400.0 / (400.0 + 100 * i)})
    assert len(rows) == 2 + len(stage.ABLATIONS)
    return {"command": f"python -m lessons ablate {number}", "date": "2026-11-23T00:00:00+00:00",
            "device": {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132}, "shape": {"m": 4096, "n": 4096, "k": 7168},
            "rows": rows}


def test_render_docs_fills_the_ablation_blocks_and_docstrings(tmp_path):
    from lessons import render_docs
    docs, results, stages = tmp_path / "docs", tmp_path / "results", tmp_path / "lessons"
    for folder in (docs, results, stages):
        folder.mkdir()
    (docs / "ladder.md").write_text((ROOT / "docs" / "ladder.md").read_text())
    for number in (4, 5):
        source = next((ROOT / "lessons").glob(f"{number:02d}_*.py"))
        (stages / source.name).write_text(source.read_text())
    before = render_docs.render(results, docs, stages)  # no JSON: placeholders, docstrings untouched
    block = before.get(docs / "ladder.md", (docs / "ladder.md").read_text()).split("<!-- ablation_05 -->")[1]
    placeholder = block.split("<!-- /ablation_05 -->")[0].strip()
    assert placeholder.startswith("_No result yet: run `python -m lessons ablate 5`")
    assert not any(path.parent == stages for path in before)
    (results / "ablation_04.json").write_text(json.dumps(_fake_ablation(4)))
    rendered = render_docs.render(results, docs, stages)
    ladder = rendered[docs / "ladder.md"]
    block = ladder.split("<!-- ablation_04 -->")[1].split("<!-- /ablation_04 -->")[0]
    assert "| regs | spill B | LDSM |" in block and "| 04 without ldmatrix |" in block and "0.80x" in block
    assert "_No result yet: run `python -m lessons ablate 5`" in ladder  # 05 still waits for its run
    docstring = rendered[stages / "04_mma_sync.py"]
    paragraph = docstring.split("Ablations measured:")[1].split("\n\n")[0]
    assert "1,200 TFLOP/s" in " ".join(paragraph.split()) and "without ldmatrix 0.67x" in " ".join(paragraph.split())
    measured = next(line for line in (ROOT / "lessons" / "04_mma_sync.py").read_text().splitlines()
                    if line.startswith("Measured:"))
    assert measured in docstring  # the ladder's paragraph is not this one's business


# ------------------------------------------------------------------------------ GPU: the variants on the hardware
@pytest.mark.gpu
@pytest.mark.parametrize("number, label", VARIANTS, ids=[f"{n:02d} {label}" for n, label in VARIANTS])
@pytest.mark.parametrize("m, n, k", [(300, 136, 384), (256, 2112, 512)])
def test_ablated_variant_matches_reference_on_gpu(number, label, m, n, k, rng):
    stage, options = lessons.stage(number), _options(number, label)

    class Variant:
        @staticmethod
        def gemm(a, sa, b, sb, d, stream=None):
            stage.gemm(a, sa, b, sb, d, stream=stream, options=options)

    a, sa, b, sb = random_problem(m, n, k, rng)
    check_against_reference(run_on_gpu(Variant, a, sa, b, sb), a, sa, b, sb, rng)
