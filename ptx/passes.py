"""Cubin -> cubin SASS passes. Stage 10: FFMA interleaving (the yield/reuse bits of the promotion FFMAs).

DeepGEMM found that letting every other promotion FFMA *yield* (and dropping its operand-cache ``reuse``
flag, which a yielded warp cannot keep) lets one math warpgroup's FFMAs overlap the other's WGMMA. ptxas
from CUDA 12.9 on emits that pattern itself, but only for CTAs of more than 8 warps; so a pass first counts
the yielding FFMAs (:func:`count_yielding_ffma`), and :func:`interleave_ffma` reports what it changed.

Bits (the high 64-bit word of a 128-bit Hopper instruction, CuAssembler's control-code layout):

* bit 45: the **inverted** yield flag, 1 = no yield, 0 = yield (:func:`is_yield`);
* bits 58-61: operand reuse flags, one per source slot; bit 59 = the 2nd source, Rb (:func:`reuse_b`).

A flip clears both (``high & ~0x0800200000000000``); on an FFMA with reuse set and yield off, as every one
the rules pick is, that is DeepGEMM's ``high ^ 0x0800200000000000``. Rules (applied per run of >= 8
consecutive FFMAs of one function):

* ``"deepgemm"``: the first ``floor(9 n / 16)`` FFMAs of a run of n; walking in order, an FFMA with the
  Rb-reuse bit is flipped if its Rb was not seen before in the run, or if the previous FFMA kept its reuse
  bit with the same Rb. A flipped FFMA counts as "no reuse" for the next step.
* ``"every_other"``: the 1st, 3rd, 5th... of the run's FFMAs that have the Rb-reuse bit (whole run), so
  the pass changes SASS even where ptxas already interleaved (DeeperGEMM-style "1 yield every N").

Environment: ``FP8LADDER_FFMA_INTERLEAVE`` = ``off`` (default; also ``0``, ``none`` or empty) |
``deepgemm`` | ``every_other``; :func:`pass_from_environment` reads it (the generator calls the pass).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ptx.sass import Instruction, disassemble, patch_instructions

NO_YIELD_BIT = 45  # high word; 1 = no yield (inverted flag)
REUSE_B_BIT = 59  # high word; reuse flag of the 2nd source slot (Rb)
FLIP_MASK = (1 << REUSE_B_BIT) | (1 << NO_YIELD_BIT)  # == 0x0800200000000000, DeepGEMM's XOR mask
ENV_VAR = "FP8LADDER_FFMA_INTERLEAVE"
RULES = ("deepgemm", "every_other")


class PatchVerificationError(RuntimeError):
    """The patched cubin differs from the original in something other than the intended bits."""


# -- bit and operand helpers ------------------------------------------------------------------------
def high_word(encoding: int) -> int:
    """The upper 64 bits of the 128-bit instruction (control code and reuse flags live there)."""
    return encoding >> 64


def is_yield(encoding: int) -> bool:
    """True when the instruction yields: high-word bit 45 is an inverted flag, so yield <=> bit == 0."""
    return not high_word(encoding) >> NO_YIELD_BIT & 1


def reuse_b(encoding: int) -> bool:
    """True when the 2nd source operand (Rb) is kept in the operand reuse cache: high-word bit 59."""
    return bool(high_word(encoding) >> REUSE_B_BIT & 1)


def flipped_encoding(encoding: int) -> int:
    """The encoding with Rb reuse cleared and yield enabled (both flag bits cleared, nothing else)."""
    return encoding & ~(FLIP_MASK << 64)


_REGISTER = re.compile(r"[-|]*(R\d+|RZ)(?:\.reuse)?\|?")


def second_source_register(text: str) -> str | None:
    """Rb of ``[@P] FFMA[.mods] Rd, Ra, Rb[.reuse], Rc`` ("R207"); None when Rb is not a register
    (an immediate or a constant-bank operand) or ``text`` has no 4 operands."""
    words = text.split(None, 1)
    if words and words[0].startswith("@"):  # drop the predicate guard
        words = words[1].split(None, 1) if len(words) > 1 else []
    if len(words) < 2:
        return None
    operands = [operand.strip() for operand in words[1].split(",")]
    if len(operands) != 4:
        return None
    match = _REGISTER.fullmatch(operands[2])
    return match.group(1) if match else None


def count_yielding_ffma(instructions) -> tuple[int, int]:
    """(FFMAs whose yield is on, all FFMAs) among ``instructions``."""
    ffma = [i for i in instructions if i.opcode == "FFMA"]
    return sum(is_yield(i.encoding) for i in ffma), len(ffma)


def ffma_runs(instructions, min_run: int = 8) -> list[list[Instruction]]:
    """Runs of >= ``min_run`` FFMAs at consecutive 16-byte offsets of one function, in listing order.
    Labels do not split a run (DeepGEMM's cuobjdump listing has none either); any other opcode does."""
    runs, current = [], []
    for ins in instructions:
        follows = current and ins.function == current[-1].function and ins.offset == current[-1].offset + 16
        if ins.opcode == "FFMA" and follows:
            current.append(ins)
            continue
        if len(current) >= min_run:
            runs.append(current)
        current = [ins] if ins.opcode == "FFMA" else []
    if len(current) >= min_run:
        runs.append(current)
    return runs


# -- the rules: which FFMAs of a run to flip --------------------------------------------------------
def _select_deepgemm(run: list[Instruction]) -> list[Instruction]:
    seen, last_reuse, last_rb, chosen = set(), False, None, []
    for ins in run[:len(run) * 9 // 16]:  # DeepGEMM PR #42: only the head of the run (+~0.5% on 12.8)
        rb = second_source_register(ins.text)
        keeps = reuse_b(ins.encoding)
        if keeps and rb is not None and (rb not in seen or (last_reuse and rb == last_rb)):
            chosen.append(ins)
            keeps = False  # the flipped FFMA no longer feeds the reuse cache
        seen.add(rb)
        last_reuse, last_rb = keeps, rb
    return chosen


def _select_every_other(run: list[Instruction]) -> list[Instruction]:
    reusing = [i for i in run if reuse_b(i.encoding) and second_source_register(i.text) is not None]
    return reusing[::2]


_SELECT = {"deepgemm": _select_deepgemm, "every_other": _select_every_other}


def choose_flips(run: list[Instruction], rule) -> list[Instruction]:
    """The FFMAs of one run (from :func:`ffma_runs`) that ``rule`` flips, in order. ``rule``: a name of
    :data:`RULES`, or a function ``run -> chosen`` of the same kind (the stage 10 exercise plugs one in); a
    function's choice must be instructions of the run, each at most once."""
    if callable(rule):
        chosen = list(rule(list(run)))
        inside = {(i.function, i.offset) for i in run}
        where = [(i.function, i.offset) for i in chosen]
        if not set(where) <= inside or len(set(where)) != len(where):
            raise ValueError(f"rule {getattr(rule, '__name__', rule)!r} chose instructions outside the run "
                             f"or twice: {[(f, hex(o)) for f, o in where if (f, o) not in inside][:5]}")
        by_place = {(i.function, i.offset): i for i in run}
        return [by_place[key] for key in where]  # the run's own instructions (their encodings, not copies)
    if rule not in _SELECT:
        raise ValueError(f"rule {rule!r}: choose one of {RULES}")
    return _SELECT[rule](run)


# -- the pass ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class InterleaveReport:
    rule: str
    runs: int  # FFMA runs of >= min_run instructions
    ffma_in_runs: int
    ffma_total: int  # all FFMAs of the selected function(s)
    yielding_before: int
    yielding_after: int
    flipped: int
    flipped_offsets: tuple[tuple[str, int], ...]  # (function, byte offset in .text.<function>)

    def __str__(self) -> str:
        return (f"FFMA interleave ({self.rule}): {self.runs} runs, {self.ffma_in_runs}/{self.ffma_total} FFMAs "
                f"in runs, yielding {self.yielding_before} -> {self.yielding_after}, {self.flipped} flipped")


def _strip_reuse(text: str) -> str:
    return text.replace(".reuse", "")


def verify_patch(original, new_image: bytes, patches: dict[tuple[str, int], int],
                 before: list[Instruction] | None = None) -> list[Instruction]:
    """Disassemble ``new_image`` and check it against ``original`` plus ``patches`` ({(function, offset):
    new encoding}): same instructions, same text but for ``.reuse``, exactly the intended encodings; then
    that no byte outside those instructions moved. Returns the new listing; raises PatchVerificationError."""
    before = disassemble(original) if before is None else before
    after = disassemble(new_image)  # raises if nvdisasm rejects the image
    if len(after) != len(before):
        raise PatchVerificationError(f"{len(before)} instructions before, {len(after)} after")
    for old, new in zip(before, after):
        where = f"{old.function}+{old.offset:#x} ({old.text})"
        if (old.function, old.offset, old.opcode) != (new.function, new.offset, new.opcode):
            raise PatchVerificationError(f"{where} became {new.function}+{new.offset:#x} ({new.text})")
        if _strip_reuse(old.text) != _strip_reuse(new.text):
            raise PatchVerificationError(f"{where} now reads {new.text!r}")
        expected = patches.get((old.function, old.offset), old.encoding)
        if new.encoding != expected:
            raise PatchVerificationError(f"{where}: bits {new.encoding ^ expected:#034x} differ from the intended "
                                         f"encoding")
    seen = {(i.function, i.offset) for i in before}
    if set(patches) - seen:
        raise PatchVerificationError(f"patches at no instruction: {sorted(set(patches) - seen)}")
    # Bytes outside .text (headers, symbols, relocations) are not in the listing: compare whole images.
    expected_image = patch_instructions(original, patches)
    if new_image != expected_image:
        first = next(k for k, (a, b) in enumerate(zip(new_image, expected_image)) if a != b) \
            if len(new_image) == len(expected_image) else min(len(new_image), len(expected_image))
        raise PatchVerificationError(f"image differs from the intended patch at file offset {first:#x}")
    return after


def interleave_ffma(cubin, kernel: str | None = None, rule: str = "deepgemm", min_run: int = 8,
                    listing: list[Instruction] | None = None) -> tuple[bytes, InterleaveReport]:
    """Flip yield/reuse on the FFMAs that ``rule`` picks in every run of ``kernel`` (all functions when
    None). Returns the verified patched image (a copy; ``cubin`` is untouched) and the report.
    ``listing``: ``disassemble(cubin)`` when the caller has it already (nvdisasm takes ~0.5 s a call)."""
    if not callable(rule) and rule not in _SELECT:  # fail before the (slow) disassembly
        raise ValueError(f"rule {rule!r}: choose one of {RULES}")
    image = cubin.image if hasattr(cubin, "image") else bytes(cubin)
    listing = disassemble(image) if listing is None else listing
    selected = [i for i in listing if kernel is None or i.function == kernel]
    if not selected:
        raise KeyError(f"no function {kernel!r} in the cubin")
    runs = ffma_runs(selected, min_run)
    chosen = [ins for run in runs for ins in choose_flips(run, rule)]
    patches = {(i.function, i.offset): flipped_encoding(i.encoding) for i in chosen}
    new_image = patch_instructions(image, patches)
    after = verify_patch(image, new_image, patches, before=listing)
    yielding_before, ffma_total = count_yielding_ffma(selected)
    yielding_after, _ = count_yielding_ffma([i for i in after if kernel is None or i.function == kernel])
    report = InterleaveReport(rule if isinstance(rule, str) else getattr(rule, "__name__", "custom"), len(runs), sum(map(len, runs)), ffma_total, yielding_before, yielding_after,
                              len(chosen), tuple((i.function, i.offset) for i in chosen))
    return new_image, report


def pass_from_environment(environ=None) -> str | None:
    """The rule named by ``$FP8LADDER_FFMA_INTERLEAVE``, or None when it is unset or off."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "").strip().lower()
    if value in ("", "off", "0", "none"):
        return None
    if value not in RULES:
        raise ValueError(f"{ENV_VAR}={value!r}: use off, {' or '.join(RULES)}")
    return value


__all__ = ["FLIP_MASK", "ENV_VAR", "RULES", "InterleaveReport", "PatchVerificationError", "choose_flips",
           "count_yielding_ffma", "ffma_runs", "flipped_encoding", "high_word", "interleave_ffma", "is_yield",
           "pass_from_environment", "reuse_b", "second_source_register", "verify_patch"]
