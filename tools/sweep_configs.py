"""Time named kernel configs on one shape with the one kernel timer: for ablations and heuristic checks (GPU).

    python tools/sweep_configs.py 64,7168,2048 production stage06 stage07 stage08 "production:stages=6" \
        "production:block_n=32,epilogue=staged"

A name is ``production`` (the heuristics' config), ``stageNN`` (a ladder stage's; 06 is the generator configured
as stage 06) or either with ``:field=value,...`` overrides of gemm.kernel.KernelConfig fields. Every config is
checked against the float64 reference (NaN-poisoned output) before it is timed. Prints a table; ``--json`` writes
the rows.
"""
import argparse
import ast
import shlex
import sys


def parse_config(text: str, m: int, n: int, k: int):
    import lessons
    from gemm.heuristics import choose_config
    from lessons.generated import stage06_config
    base, _, overrides = text.partition(":")
    if base == "production":
        config = choose_config(m, n, k)
    elif base == "stage06":
        config = stage06_config(m, n, k)
    elif base.startswith("stage"):
        config = lessons.stage(int(base[5:])).config(m, n, k)
    else:
        raise SystemExit(f"unknown config {base!r}")
    changes, items, depth, current = {}, [], 0, ""
    for ch in overrides:  # split on the commas outside brackets: "post_passes=('a',),stages=3"
        depth += ch in "([{" and 1 or (ch in ")]}" and -1 or 0)
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    items.append(current)
    for item in filter(None, items):
        key, _, value = item.partition("=")
        try:
            changes[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            changes[key] = value
    changed = config.replace(**changes)
    if "stages" not in changes:  # a wider tile may not fit the old stage count
        from gemm.kernel.config import max_stages
        changed = changed.replace(stages=min(config.stages, max_stages(changed, n, k)))
    return changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("shape", help='"M,N,K" or "M,N,K;M,N,K;..." or "bench" (the 18 DeepSeek shapes + 8192^3)')
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from gemm.bench import BENCH_SHAPES, CONFIG_COLUMNS, parse_shapes, time_configs
    from gemm.testing import device_info, format_table, write_result
    shapes = BENCH_SHAPES if args.shape == "bench" else parse_shapes(args.shape)
    rows = []
    for m, n, k in shapes:
        shape_rows = time_configs(m, n, k, {name: parse_config(name, m, n, k) for name in args.configs})
        for row in shape_rows:
            row.update(m=m, n=n, k=k, vs_first=shape_rows[0]["time_us"] / row["time_us"])
        print(f"M={m} N={n} K={k}")
        print(format_table(CONFIG_COLUMNS, shape_rows), flush=True)
        rows += shape_rows
    if args.json:
        command = shlex.join(["python", "tools/sweep_configs.py", args.shape, *args.configs])
        write_result(args.json, command=command, rows=rows, device=device_info(),
                     configs=args.configs,
                     timing="CUDA-graph replay of (256 MiB L2 flush; call) pairs minus flushes only; median of 5")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
