"""``python -m gemm bench configs``: time named kernel configs on shapes, each checked first (GPU).

    python -m gemm bench configs bench production "production:multicast=2"
    python -m gemm bench configs 64,7168,2048 production "production:stages=6" "production:block_n=32,epilogue=staged"

A name is ``production`` (the heuristics' config for the shape) with optional ``:field=value,...`` overrides of
:class:`gemm.kernel.KernelConfig` fields. At decode (M <= 32) production swaps A and B; ``swap_ab=False``, or a
field the swapped kernel does not take (``accumulators=2``, ``epilogue='staged'``, ...), starts from the unswapped
one. An override sets only the fields it names: ``split_k=3`` on a config that does not split gives the gathered
exchange (stage 12's), where production's own splits push their partials (``split_k_push=True``; name both to get
production's exchange). Production's BF16 splits also give rank 0 a lead (``split_k_lead=2``, but for swapped
pairs), which an override of other fields keeps: ``production:split_k=2`` on a config that splits over three still
carries it (name ``split_k_lead=0`` for even shares, as the sweeps before the lead ran). A config an override cannot apply to at a shape (multicast on a one-wave, non-persistent
config) is a row that says why, not the end of the run. Every config is checked against
the float64 reference (NaN-poisoned output) before it is timed. Prints a table per shape; ``--json`` writes the
rows. (A ladder stage's config with its ideas turned off: ``python -m lessons ablate``.) ``--clocks`` samples the SM
clock and board power through every timed round (:mod:`gemm.testing.clock_log`): whether a config ran faster in
cycles or at a higher clock.
"""
from __future__ import annotations

import argparse
import ast
import functools
import shlex
import statistics

import numpy as np

from gemm.testing.clock_log import ClockLog, query_fields
from gemm.testing.l2_flush import FLUSHES
from gemm.testing.problems import checked_run, device_problem, flops, gemm_bytes, random_problem, reference_rows
from gemm.testing.records import Column, device_info, format_table, gpu_bus_id, write_result
from gemm.testing.timer import bench_back_to_back, bench_kernel, paired_speeds, palindrome


def parse_fields(text: str) -> dict:
    """ "stages=3,post_passes=('a',)" -> {"stages": 3, "post_passes": ("a",)} (commas inside brackets kept)."""
    items, depth, current = [], 0, ""
    for ch in text:
        depth += 1 if ch in "([{" else -1 if ch in ")]}" else 0
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    items.append(current)
    changes = {}
    for item in filter(None, items):
        key, _, value = item.partition("=")
        try:
            changes[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            changes[key] = value
    return changes


def parse_config(text: str, m: int, n: int, k: int):
    """A config name (module docstring) -> the KernelConfig at (M, N, K); ValueError when it cannot apply there."""
    from gemm.heuristics import choose_config, paired_k_blocks
    from gemm.kernel.config import max_stages
    base, _, overrides = text.partition(":")
    if base != "production":
        raise ValueError(f"unknown config {base!r}: a name is production[:field=value,...] "
                         "(a ladder stage's config: python -m lessons ablate)")
    changes = parse_fields(overrides)
    config = choose_config(m, n, k, allow_swap_ab=changes.get("swap_ab", True) is not False)

    def overridden(config):
        if "accumulators" in changes:
            changed = config.replace(**changes)
        else:  # the accumulator sets follow the overridden tile and D as production's rule would set them
            changed = config.replace(accumulators=1, **changes)
            if paired_k_blocks(changed):
                changed = changed.replace(accumulators=2)
        if "stages" not in changes:  # a wider tile may not fit the old stage count
            changed = changed.replace(stages=min(config.stages, max_stages(changed, n, k)))
        return changed
    try:
        return overridden(config)
    except ValueError:
        if not config.swap_ab or "swap_ab" in changes:
            raise
    # a field swap AB does not take (two K blocks in flight, a staged epilogue, a 32-wide tile, ...): the override
    # applies to the unswapped decode kernel, production's before swap AB, so earlier sweeps' commands still run
    return overridden(choose_config(m, n, k, allow_swap_ab=False))


def timed_rounds(launches: dict, timer, rounds: int, warmup: int = 0, *, clock_log=None,
                 windows: dict | None = None) -> dict[str, list[float]]:
    """Each launch's median in each of ``rounds`` rounds, the launches in order, then in reverse, ... (the clock
    drifts with heat: the palindrome shares the drift out), after ``warmup`` untimed passes over them all: a GPU left
    idle by the checks and compiles runs its first kernels at a higher clock. The best of a launch's rounds is its
    time; its ratio to the first launch round by round is :func:`gemm.testing.timer.paired_speeds`. With a
    ``clock_log`` (:class:`gemm.testing.clock_log.ClockLog`), each timed round is a window of it, appended to
    ``windows[name]``."""
    names = list(launches)
    for _ in range(warmup):
        for name in names:
            timer(launches[name])
    times: dict[str, list[float]] = {name: [] for name in names}
    for name in palindrome(names, rounds):
        if clock_log is None:
            times[name].append(timer(launches[name]).median_us)
            continue
        with clock_log.window() as window:
            times[name].append(timer(launches[name]).median_us)
        if windows is not None:
            windows.setdefault(name, []).append(window)
    return times


def clock_fields(windows: list) -> dict:
    """A config's rounds' clock log as row fields: each round's median SM clock and power (None where no sample
    fell inside the round), its sample count and clock event reasons, and the medians over the rounds."""
    mhz = [w.summary.get("sm_mhz") for w in windows]
    watts = [w.summary.get("power_w") for w in windows]
    known_mhz, known_watts = [v for v in mhz if v is not None], [v for v in watts if v is not None]
    return {"round_mhz": mhz, "round_w": watts, "round_samples": [w.summary.get("samples", 0) for w in windows],
            "round_reasons": [w.summary.get("reasons", []) for w in windows],
            "sm_mhz": statistics.median(known_mhz) if known_mhz else None,
            "power_w": statistics.median(known_watts) if known_watts else None}


def time_configs(m: int, n: int, k: int, configs: dict, rng=None, *, timer=bench_kernel,
                 rounds: int = 1, warmup: int = 0, clock_log_factory=None) -> list[dict]:
    """Check (NaN-poisoned, float64 reference) then time each named KernelConfig on one problem: the
    ablation tables and heuristic checks (``python -m gemm bench configs``; ``python -m lessons ablate`` for a stage's).
    ``rounds`` and ``warmup``: :func:`timed_rounds`; each timed row has its best (``time_us``), every round's time
    (``round_us``) and, past the first config, its speed against the first, round by round (``vs_first_paired``:
    median, low, high). ``clock_log_factory()``: a :class:`gemm.testing.clock_log.ClockLog` to sample the clock
    and power through the rounds (:func:`clock_fields` in each row)."""
    from gemm.api import gemm
    rng = rng or np.random.default_rng()
    host = random_problem(m, n, k, rng)
    reference = reference_rows(*host, rng)
    problem = device_problem(*host)
    rows, launches = {}, {}
    for name, config in configs.items():
        def run(a, sa, b, sb, d, stream=None, config=config):
            gemm(a, sa, b, sb, d, stream, config=config)
        check = checked_run(run, problem, reference)
        launches[name] = lambda stream, run=run: run(problem.a, problem.sa, problem.b, problem.sb, problem.d, stream)
        rows[name] = {"name": name, "config": config.describe(), "diff": check["diff"],
                      "status": "ok" if check["correct"] else "WRONG"}
    windows: dict = {}
    if clock_log_factory is None:
        times = timed_rounds(launches, timer, rounds, warmup)
    else:
        with clock_log_factory() as clock_log:
            times = timed_rounds(launches, timer, rounds, warmup, clock_log=clock_log, windows=windows)
    for name, own in windows.items():
        rows[name].update(clock_fields(own))
    for name, own in times.items():
        if not own:  # no rounds: checked, not timed
            continue
        median = min(own)
        rows[name].update(time_us=median, round_us=own, tflops=flops(m, n, k) / median / 1e6,
                          gbps=gemm_bytes(m, n, k) / median / 1e3)
    if times and rounds:
        for name, speed in paired_speeds(times, next(iter(times))).items():
            rows[name]["vs_first_paired"] = speed
    return list(rows.values())


CONFIG_COLUMNS = [Column("name", "config name", align="left"), Column("config", "config", align="left"),
                  Column("time_us", "time (us)", "{:.1f}"), Column("tflops", "TFLOP/s", "{:.0f}"),
                  Column("gbps", "GB/s", "{:.0f}"), Column("diff", "diff", "{:.1e}"),
                  Column("status", "status", align="left")]
# bench configs' terminal table: each config's speed against the first, round by round (paired_text)
SWEEP_COLUMNS = CONFIG_COLUMNS[:-2] + [Column("paired", "vs first, paired", align="left")] + CONFIG_COLUMNS[-2:]
CLOCK_INTERVAL_MS = 10  # nvidia-smi -lms: a 30-170 us kernel's round of graph replays spans tens of ms
# with --clocks: each config's median SM clock and board power over its timed rounds (clock_fields)
CLOCK_COLUMNS = [Column("sm_mhz", "SM MHz", "{:.0f}"), Column("power_w", "power (W)", "{:.0f}")]


def paired_text(speed: dict | None, unit: str = "") -> str | None:
    """A paired speed (:func:`gemm.testing.timer.paired_speeds`) as "median (low-high)", ``unit`` after the
    median (the docs' tables write "1.012x (0.998-1.030)")."""
    return None if not speed else f"{speed['median']:.3f}{unit} ({speed['low']:.3f}-{speed['high']:.3f})"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shapes", help='"M,N,K;M,N,K;...", "bench" (the dense bench shapes: 18 DeepSeek, 8192^3, '
                                       'decode and prefill spots) or "deepseek" (the 18)')
    parser.add_argument("configs", nargs="+", help='production[:field=value,...], e.g. "production:multicast=2"')
    parser.add_argument("--json", default=None, help="write the rows here")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time the configs in order, then reversed, ... this many times; keep each one's best")
    parser.add_argument("--warmup", type=int, default=0, metavar="PASSES",
                        help="untimed passes over the configs before the rounds (the first kernels after the checks "
                             "run on a cool GPU)")
    parser.add_argument("--back-to-back", type=int, default=0, metavar="CALLS",
                        help="time CALLS calls back to back in one graph, no L2 flush (launch gaps, ramp-up and tail "
                             "included: the measure for pdl=True) instead of flushed single calls")
    parser.add_argument("--flush", choices=FLUSHES, default="memset",
                        help="how the L2 is emptied before each flushed call: memset (leaves it dirty; default) or "
                             "clean (a read pass), gemm/testing/l2_flush.py")
    parser.add_argument("--clocks", action="store_true",
                        help="sample the SM clock and board power with nvidia-smi through the timed rounds and "
                             "report each config's (gemm/testing/clock_log.py): did it run faster, or at a higher clock?")


def configs_for_shape(names, m: int, n: int, k: int) -> tuple[dict, list[dict]]:
    """({name: KernelConfig} to time at (M, N, K), [a row per name that cannot apply there, saying why]): what
    :func:`parse_config` refuses (multicast on a one-wave config) and what the generator refuses for this N and K
    (constant_stages where the stages and the K blocks do not divide) are rows, not the end of the run."""
    from gemm.kernel.generator import check_problem, compiled_k
    configs, skipped = {}, []
    for name in names:
        try:
            config = parse_config(name, m, n, k)
            check_problem(config, n, compiled_k(config, k))
            configs[name] = config
        except (ValueError, TypeError) as error:
            skipped.append({"name": name, "config": "-", "status": f"n/a: {error}"})
    return configs, skipped


def run(args) -> int:
    from gemm.testing.bench_dense import parse_shapes
    rows = []
    clock_log_factory, shape_logs = None, []
    if args.clocks:
        gpu = gpu_bus_id()
        fields = query_fields(gpu)  # asked once: each shape's log samples the same fields
        if fields is None:
            print("--clocks: nvidia-smi cannot sample this GPU's clock and power here; timing without them")
        else:
            def sampled_log():
                log = ClockLog(gpu, CLOCK_INTERVAL_MS, fields=fields)
                shape_logs.append(log)
                return log
            clock_log_factory = sampled_log
    columns = SWEEP_COLUMNS[:-2] + CLOCK_COLUMNS * bool(clock_log_factory) + SWEEP_COLUMNS[-2:]
    for m, n, k in parse_shapes(args.shapes):
        configs, skipped = configs_for_shape(args.configs, m, n, k)
        timer = (functools.partial(bench_back_to_back, calls=args.back_to_back) if args.back_to_back
                 else functools.partial(bench_kernel, flush=args.flush))
        shape_rows = time_configs(m, n, k, configs, timer=timer, rounds=args.rounds, warmup=args.warmup,
                                  clock_log_factory=clock_log_factory) + skipped
        timed = [r for r in shape_rows if "time_us" in r]
        for row in shape_rows:
            row.update(m=m, n=n, k=k)
            if timed and "time_us" in row:
                row["vs_first"] = timed[0]["time_us"] / row["time_us"]
        print(f"M={m} N={n} K={k}")
        for log in shape_logs:
            if log.error:
                print(f"--clocks: the sampler gave nothing ({log.error}); the clock columns are empty")
        shape_logs.clear()
        print(format_table(columns, [dict(row, paired=paired_text(row.get("vs_first_paired")))
                                           for row in shape_rows]), flush=True)
        rows += shape_rows
    if args.json:
        options = ([f"--rounds={args.rounds}"] if args.rounds != 1 else []) + \
            ([f"--warmup={args.warmup}"] if args.warmup else []) + \
            ([f"--back-to-back={args.back_to_back}"] if args.back_to_back else []) + \
            ([f"--flush={args.flush}"] if args.flush != "memset" else []) + (["--clocks"] if args.clocks else [])
        command = shlex.join(["python", "-m", "gemm", "bench", "configs", args.shapes, *args.configs, *options])
        timing = (f"CUDA-graph replay of {args.back_to_back} calls back to back, no flush; median of 5"
                  if args.back_to_back else
                  f"CUDA-graph replay of (256 MiB L2 flush: {args.flush}; call) pairs minus flushes only; median of 5")
        if args.rounds > 1:
            timing += (f"; {args.rounds} rounds, configs in alternating order, best kept; vs_first_paired: the "
                       "first config's time over each one's, round by round (median, low, high)")
        if args.warmup:
            timing += f"; {args.warmup} untimed pass{'es' * (args.warmup > 1)} first"
        if clock_log_factory is not None:
            timing += (f"; round_mhz / round_w: nvidia-smi's SM clock and board power every {CLOCK_INTERVAL_MS} "
                       "ms, the median of the samples from a round's graph capture to its last replay (round_samples "
                       "of them; sm_mhz / power_w: the median over the rounds)")
        write_result(args.json, command=command, rows=rows, device=device_info(), configs=args.configs, timing=timing)
    return 0 if all(r["status"] == "ok" or r["status"].startswith("n/a") for r in rows) else 1


__all__ = ["parse_config", "configs_for_shape", "time_configs", "timed_rounds", "clock_fields", "paired_text",
           "CONFIG_COLUMNS", "run"]
