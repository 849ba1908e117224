"""``python -m lessons ablate 8``: a bundled stage, each of its ideas turned off on its own, timed (GPU).

A stage that must bundle ideas lists them as ``ABLATIONS = {label: config changes}``; each row is the stage's
config with one change undone, checked against the float64 reference and timed with the one kernel timer
(:func:`gemm.bench.time_configs`), next to the previous stage and the stage itself. Writes ``ablation_NN.json``.
"""
from __future__ import annotations

from pathlib import Path

import lessons


def ablation_configs(number: int, m: int, n: int, k: int) -> dict:
    from gemm.kernel.config import max_stages
    module = lessons.stage(number)
    ablations = getattr(module, "ABLATIONS", None)
    if not ablations:
        raise ValueError(f"stage {number} lists no ABLATIONS (it adds one idea)")
    full = module.config(m, n, k)
    configs = {f"stage {number - 1:02d}": lessons.stage(number - 1).config(m, n, k), f"stage {number:02d}": full}
    for label, changes in ablations.items():
        config = full.replace(**changes)
        configs[f"{number:02d} {label}"] = config.replace(stages=min(full.stages, max_stages(config, n, k)) or 2)
    return configs


def ablate(number: int, m: int, n: int, k: int, out: Path) -> int:
    from ptx.device import is_hopper
    configs = ablation_configs(number, m, n, k)
    if not is_hopper():
        print("ablations are timings: they need a Hopper GPU. The configs that would run:")
        for name, config in configs.items():
            print(f"  {name}: {config.describe()}")
        return 0
    from gemm.bench import CONFIG_COLUMNS, time_configs
    from gemm.testing import command_line, device_info, format_table, write_result
    rows = time_configs(m, n, k, configs)
    base = next(r for r in rows if r["name"] == f"stage {number:02d}")
    for row in rows:
        row["vs_stage"] = base["time_us"] / row["time_us"]
    print(f"M={m} N={n} K={k}")
    print(format_table(CONFIG_COLUMNS, rows))
    out.mkdir(parents=True, exist_ok=True)
    write_result(out / f"ablation_{number:02d}.json", command=command_line("lessons"), rows=rows,
                 device=device_info(), shape={"m": m, "n": n, "k": k},
                 timing="CUDA-graph replay of (256 MiB L2 flush; call) pairs minus flushes only; median of 5")
    return 0 if all(r["status"] == "ok" for r in rows) else 1
