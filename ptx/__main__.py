"""Commands of the PTX toolchain.

    python -m ptx smoke [--inline | --item N]    the runtime's GPU smoke items (ptx.smoke); exit status: failures
"""
from __future__ import annotations

import argparse
import sys

from ptx import smoke as smoke_items
from ptx.device import has_gpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ptx", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    smoke = commands.add_parser("smoke", help="run the GPU smoke items of the PTX runtime (needs a GPU)")
    how = smoke.add_mutually_exclusive_group()
    how.add_argument("--inline", action="store_true", help="all items in this process (default: one process each)")
    how.add_argument("--item", type=int, metavar="N", help="only item N, in this process")
    args = parser.parse_args(argv)
    if args.item is not None and not 0 <= args.item < len(smoke_items.ITEMS):
        parser.error(f"--item must be in 0..{len(smoke_items.ITEMS) - 1}, got {args.item}")
    if not has_gpu():
        print("python -m ptx smoke needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    if args.item is not None:
        return smoke_items.main(["--item", str(args.item)])
    return smoke_items.main(["--inline"] if args.inline else [])


if __name__ == "__main__":
    sys.exit(main())
