"""Stage 13: the math warps' K block in SASS, stage 12 against 13, each instruction coloured by the datapath it
runs on (from the cubins themselves: ``ptx.sass.span`` of QGMMA, what exercise 13's technique check reads)."""
from __future__ import annotations

from collections import Counter

from matplotlib.figure import Figure

from lessons.figures.drawing import LADDER_SHAPE, instruction_strips

# instruction classes, in drawing order: (name, colour, does this opcode belong)
CLASSES = (
    ("tensor core (QGMMA, WARPGROUP)", "#2b6cb0", lambda op: op in ("QGMMA", "WARPGROUP")),
    ("promotion (FFMA, FMUL)", "#9ac1e8", lambda op: op in ("FFMA", "FMUL")),
    ("vector to uniform move (R2UR)", "#d62728", lambda op: op == "R2UR"),
    ("uniform datapath (U*)", "#2ca02c", lambda op: op.startswith("U")),
    ("vector integer (IMAD, IADD3, LEA, ...)", "#ff9f40",
     lambda op: op in ("IMAD", "IADD3", "LEA", "SHF", "LOP3", "MOV", "VIADD", "ISETP", "SEL", "PRMT", "IABS")),
    ("shared loads, barriers, branches, other", "0.75", lambda op: True),
)


def instruction_class(opcode: str) -> int:
    return next(index for index, (_, _, belongs) in enumerate(CLASSES) if belongs(opcode))


def k_block_classes(number: int, m: int, n: int, k: int) -> list[int]:
    """The class (an index of :data:`CLASSES`) of each instruction of stage ``number``'s K block at m x n x k,
    first QGMMA to last, in program order."""
    from lessons.diff_stages import stage_cubin
    from ptx.sass import disassemble, span
    return [instruction_class(i.opcode) for i in span(disassemble(stage_cubin(number, m, n, k)), "QGMMA")]


def uniform_datapath(shape=LADDER_SHAPE) -> Figure:
    strips = []
    for number in (12, 13):
        classes = k_block_classes(number, *shape)
        counts = Counter(classes)
        strips.append((f"stage {number}: {len(classes)} instructions from the first QGMMA to the last; R2UR "
                       f"{counts[2]}, vector integer {counts[4]}, uniform {counts[3]}", classes))
    m, n, k = shape
    return instruction_strips(strips, CLASSES, f"One K block of the math warps' SASS at {m}x{n}x{k}, one cell per "
                              "instruction, by datapath:\nbroadcasting the warpgroup's A offset (shfl.sync) moves "
                              "the descriptor arithmetic to the uniform datapath")


__all__ = ["CLASSES", "instruction_class", "k_block_classes", "uniform_datapath"]
