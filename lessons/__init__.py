"""The ladder: one numbered stage per idea, each a real FP8 GEMM kernel (stage 00 is the PTX warm-up).

Every GEMM stage is a module ``lessons/NN_idea.py`` (or a package ``lessons/NN_idea/``) exposing:

* ``IDEA``: one line, the idea this stage adds;
* ``KIND``: ``"numba"`` or ``"ptx"``;
* ``gemm(a, sa, b, sb, d, stream=None)``: launch D = (A*sA)(B*sB)^T on device arrays (the contract in
  :mod:`gemm.fp8`): ``a`` (M, K) and ``b`` (N, K) e4m3 bytes (uint8 or float8), ``sa`` (M, K/128) float32
  stored M-major with M padded to 4 (``gemm.sa_to_mn_major``), ``sb`` (N/128, K/128) float32, ``d`` (M, N)
  BF16 (uint16 bits or bfloat16). ``stream`` is a CUDA stream handle (int) or None for the default stream.
  The launch is asynchronous and safe to capture in a CUDA graph once the shape has run once.
* PTX stages also expose ``generate(m, n, k) -> str`` (the PTX text for that shape); Numba stages expose
  ``KERNEL`` (the ``@cuda.jit`` kernel) and ``OPERAND_DTYPE`` (how it reads A and B). With them
  ``python -m lessons inspect`` and the CPU tests compile any stage for sm_90a without a GPU.

Each stage's docstring tells its story once: the one idea, what changed vs the stage before, its speed of light
(the unit that bounds it; the rates are :data:`lessons.ladder.UNITS`) and what it measured (the "Measured:"
paragraph, rewritten from ``results/ladder.json`` by ``python -m lessons docs``). The notebooks print it.

Module names start with digits, so load them with :func:`stage`.

Topic lessons (:data:`TOPICS`, e.g. ``lessons/moe_grouped.py``) are ordinary modules with no stage number:
``from lessons import moe_grouped``.
"""
from __future__ import annotations

import importlib

import gemm._compat  # noqa: F401  (numba-cuda vs newer NumPy; before any stage imports numba)

STAGES = {
    0: "00_ptx_dequant",
    1: "01_naive",
    2: "02_smem_tiling",
    3: "03_register_tiling",
    4: "04_mma_sync",
    5: "05_wgmma",
    6: "06_tma_pipeline",
    7: "07_warp_specialization",
    8: "08_persistent_tma_store",
    9: "09_tma_multicast",
    10: "10_ffma_interleave",
    11: "11_tall_tiles",
    12: "12_split_k",
    13: "13_uniform_datapath",
    14: "14_early_poll",
    15: "15_swap_ab",
    16: "16_evict_first",
    17: "17_even_waves",
    18: "18_split_k_push",
    19: "19_split_k_lead",
    20: "20_narrow_pair_tiles",
}
GEMM_STAGES = [n for n in STAGES if n >= 1]
# Topic lessons (lessons/<name>.py): one subject told across the stages, not a rung of the ladder. No stage number,
# none of the stage contract above; ``python -m lessons`` and the ladder never load them.
TOPICS = {"moe_grouped": "grouped GEMMs for MoE: the contiguous and the masked layout, and their tile walks",
          "training_recipe": "FP8 training's forward, dgrad and wgrad GEMMs: their scales, and the precision of each"}


def stage(number: int):
    """Import stage ``number`` (e.g. ``stage(1)`` -> ``lessons/01_naive.py``)."""
    if number not in STAGES:
        raise ValueError(f"no stage {number}; stages are {sorted(STAGES)}")
    return importlib.import_module(f"lessons.{STAGES[number]}")


def available_stages() -> list[int]:
    """Stage numbers whose module exists in this checkout."""
    found = []
    for number in STAGES:
        try:
            importlib.util.find_spec(f"lessons.{STAGES[number]}")
        except ModuleNotFoundError:
            continue
        if importlib.util.find_spec(f"lessons.{STAGES[number]}") is not None:
            found.append(number)
    return found
