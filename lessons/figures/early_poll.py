"""Stage 14: the stretch of the math warps' SASS after a K block's last wgmma, stage 13 against 14, each instruction
coloured by what it does, so where the barrier instructions land among the promotion FFMAs shows (from the cubins:
``ptx.sass.span`` of QGMMA, then what follows it up to the K loop's back edge)."""
from __future__ import annotations

from matplotlib.figure import Figure

from lessons.figures.drawing import LADDER_SHAPE, instruction_strips

def _opcode(text: str) -> str:
    return text.split()[0].split(".")[0]


# instruction classes, in drawing order: (name, colour, does this instruction belong)
CLASSES = (
    ("wgmma wait (WARPGROUP)", "#2b6cb0", lambda text: text.startswith("WARPGROUP")),
    ("promotion (FFMA, FMUL)", "#9ac1e8", lambda text: _opcode(text) in ("FFMA", "FMUL")),
    ("release (SYNCS.ARRIVE)", "#2ca02c", lambda text: text.startswith("SYNCS.ARRIVE")),
    ("full barrier: test (PHASECHK) or wait (TRYWAIT)", "#d62728", lambda text: text.startswith("SYNCS.PHASECHK")),
    ("branches", "#7f3fbf", lambda text: _opcode(text) == "BRA"),
    ("other", "0.78", lambda text: True),
)


def after_last_wgmma(number: int, m: int, n: int, k: int) -> list[tuple[int, str]]:
    """(class index of :data:`CLASSES`, SASS text without predicate) of each instruction of stage ``number``'s cubin
    at m x n x k from its last QGMMA to the first backward branch after it (the K loop's end), in program order."""
    from lessons.diff_stages import stage_cubin
    from ptx.sass import disassemble, span
    instructions = disassemble(stage_cubin(number, m, n, k))
    last = instructions.index(span(instructions, "QGMMA")[-1])
    rows = []
    for instruction in instructions[last + 1:]:
        words = instruction.text.split()
        text = " ".join(words[1:] if words[0].startswith("@") else words)
        rows.append((next(i for i, (_, _, belongs) in enumerate(CLASSES) if belongs(text)), text))
        if instruction.opcode == "BRA" and len(rows) > 70:  # past the promotion: the loop's back edge
            break
    return rows


def early_poll(shape=LADDER_SHAPE) -> Figure:
    strips = []
    for number in (13, 14):
        cells = after_last_wgmma(number, *shape)
        where = [x for x, (cls, _) in enumerate(cells) if cls == 3]
        told = (f"the full barrier tested at instruction {where[0] + 1}, after "
                f"{sum(cls == 1 for cls, _ in cells[:where[0]])} FFMAs" if where
                else "no full-barrier instruction here: it is polled at the top of the next K block")
        strips.append((f"stage {number}: {len(cells)} instructions from the last QGMMA to the K loop's back edge; "
                       f"{told}", [cls for cls, _ in cells]))
    m, n, k = shape
    return instruction_strips(strips, CLASSES, f"After a K block's last wgmma at {m}x{n}x{k}, one cell per SASS "
                              "instruction:\nstage 14 tests the next stage's full barrier right after the release, "
                              "so the promotion FFMAs hide the test")


__all__ = ["CLASSES", "after_last_wgmma", "early_poll"]
