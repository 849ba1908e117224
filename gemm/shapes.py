"""Shape lists as the command lines take them: "M,N,K;M,N,K" (or MxNxK), "N,K;N,K" for prebuild."""
from __future__ import annotations

import argparse


def parse_shape_list(text: str, dims: int, example: str) -> list[tuple[int, ...]]:
    """ "a,b,c;a,b,c" (or axbxc) -> [(a, b, c), ...] of ``dims`` positive integers each; anything else is an
    argparse usage error that shows ``example``."""
    names = {2: "N,K", 3: "M,N,K"}.get(dims, f"{dims} integers")
    shapes = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        try:
            values = tuple(int(v) for v in part.replace("x", ",").split(","))
        except ValueError:
            values = ()
        if len(values) != dims or min(values) <= 0:
            raise argparse.ArgumentTypeError(f"shape {part!r}: expected {names} ({dims} positive integers), "
                                             f"e.g. {example}")
        shapes.append(values)
    return shapes


__all__ = ["parse_shape_list"]
