"""``python -m lessons ladder|inspect|diff|ablate``: run the ladder, look inside a stage, compare two, ablate one.

    python -m lessons ladder [--m 4096 --n 4096 --k 7168] [--stages 1,2,3] [--no-peer] [--out results]
    python -m lessons inspect 6 [--m 4096 --n 4096 --k 7168]
    python -m lessons diff 6 7          # config, PTX and SASS-opcode difference (no GPU needed)
    python -m lessons ablate 8          # each bundled idea of a stage turned off, timed (GPU)
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _stage_list(text: str) -> list[int]:
    """"1,2,5" or "1-6" (or a mix) -> sorted stage numbers."""
    numbers = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, _, high = part.partition("-")
        numbers.update(range(int(low), int(high or low) + 1))
    return sorted(numbers)


def _shape(text: str) -> tuple[int, int, int]:
    values = tuple(int(v) for v in text.replace("x", ",").split(","))
    if len(values) != 3:
        raise argparse.ArgumentTypeError(f"expected M,N,K, got {text!r}")
    return values


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lessons", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ladder = commands.add_parser("ladder", help="check and time every GEMM stage against cuBLAS")
    inspect = commands.add_parser("inspect", help="registers, spills, shared memory and SASS opcodes of a stage")
    diff = commands.add_parser("diff", help="config, PTX and SASS difference between two PTX stages")
    ablate = commands.add_parser("ablate", help="time a stage with each of its bundled ideas turned off (GPU)")
    for sub in (ladder, inspect, diff, ablate):
        sub.add_argument("--m", type=int, default=4096, help="rows of A and D (default 4096)")
        sub.add_argument("--n", type=int, default=4096, help="rows of B, columns of D (default 4096)")
        sub.add_argument("--k", type=int, default=7168, help="reduction length, a multiple of 128 (default 7168)")
    ladder.add_argument("--stages", type=_stage_list, default=None, help='e.g. "1,2,3" or "1-6" (default: all)')
    ladder.add_argument("--no-peer", action="store_true", help="skip the cuBLAS blockwise peer")
    ladder.add_argument("--out", type=Path, default=Path("results"), help="folder for ladder.json and .png")
    ladder.add_argument("--sim-shape", type=_shape, default=(32, 48, 256),
                        help="M,N,K for the simulator run when there is no GPU (default 32,48,256)")
    inspect.add_argument("stage", type=int)
    diff.add_argument("before", type=int)
    diff.add_argument("after", type=int)
    ablate.add_argument("stage", type=int)
    ablate.add_argument("--out", type=Path, default=Path("results"), help="folder for ablation_NN.json")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from ptx.device import has_gpu
    if not has_gpu():
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # before anything imports numba.cuda
    if args.command == "ladder":
        from lessons.ladder import main as ladder
        return ladder(args)
    if args.command == "diff":
        from lessons.diff_stages import diff
        return diff(args.before, args.after, args.m, args.n, args.k)
    if args.command == "ablate":
        from lessons.ablate import ablate
        return ablate(args.stage, args.m, args.n, args.k, args.out)
    from lessons.inspect_stage import inspect
    return inspect(args.stage, args.m, args.n, args.k)


if __name__ == "__main__":
    sys.exit(main())
