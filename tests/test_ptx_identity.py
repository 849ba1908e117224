"""The generated PTX of every stage and of every production config the heuristics pick on the bench shapes, hashed.

A refactor that means to change no behaviour must leave these bytes alone. ``FP8LADDER_UPDATE_PTX_HASHES=1
python -m pytest tests/test_ptx_identity.py`` rewrites ``tests/data/ptx_hashes.json`` when a change is meant to
alter the kernels (say so in the commit).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

import lessons
from gemm.heuristics import H100, choose_config, choose_grouped_config
from gemm.kernel import generate

HASHES = Path(__file__).parent / "data" / "ptx_hashes.json"
DEEPSEEK_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
DENSE = [(m, n, k) for m in (64, 128, 4096) for n, k in DEEPSEEK_NK] + [(8192, 8192, 8192), (1, 7168, 2048),
                                                                         (256, 7168, 2048), (100, 1000, 384)]
GROUPED = [("contiguous", 4, 8192, 4096, 7168), ("contiguous", 8, 4096, 7168, 2048),
           ("masked", 1, 1024, 4096, 7168), ("masked", 4, 256, 7168, 2048), ("masked", 2, 64, 4096, 7168),
           ("masked", 8, 16, 4096, 7168)]  # the last: MoE decode, swap AB
STAGE_SHAPES = [(4096, 4096, 7168), (200, 264, 512)]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _cases() -> dict[str, callable]:
    cases = {}
    for m, n, k in DENSE:
        for out, acc in (("bf16", False), ("f32", True)):
            cfg = choose_config(m, n, k, H100, out_dtype=out, accumulate=acc)
            cases[f"dense {m}x{n}x{k} {out}{'+c' if acc else ''}"] = (lambda c=cfg, n=n, k=k: generate(c, n, k))
    for kind, groups, m, n, k in GROUPED:
        cfg = choose_grouped_config(kind, m * groups if kind == "contiguous" else m, n, k, groups, H100)
        cases[f"{kind} G={groups} {m}x{n}x{k}"] = (lambda c=cfg, n=n, k=k: generate(c, n, k))
    cases["stage 0"] = lambda: lessons.stage(0).generate()
    for number in range(4, max(lessons.STAGES) + 1):
        for m, n, k in STAGE_SHAPES:
            cases[f"stage {number} {m}x{n}x{k}"] = (lambda s=number, m=m, n=n, k=k: lessons.stage(s).generate(m, n, k))
    return cases


def test_generated_ptx_is_unchanged(monkeypatch):
    monkeypatch.delenv("FP8LADDER_FFMA_INTERLEAVE", raising=False)
    found = {name: _digest(make()) for name, make in _cases().items()}
    if os.environ.get("FP8LADDER_UPDATE_PTX_HASHES"):
        HASHES.write_text(json.dumps(found, indent=1) + "\n")
        pytest.skip(f"rewrote {HASHES}")
    expected = json.loads(HASHES.read_text())
    changed = sorted(name for name in expected if found.get(name) != expected[name])
    assert set(found) == set(expected), f"cases differ: {set(found) ^ set(expected)}"
    assert not changed, f"the generated PTX changed for: {changed}"
