"""Exercise 05 (stage 05, wgmma): the shared-memory matrix descriptor's bit fields.

The hole is ``descriptor_bits(start_address, leading_byte_offset, stride_byte_offset, swizzle)``: pack the 64-bit
wgmma matrix descriptor (PTX ISA "Matrix Descriptor Format"). ``lessons/05_wgmma.py``'s generator calls it for the
constant part of every descriptor it bakes into the stage's own kernel (``generate(..., descriptor_bits=...)``,
:func:`descriptor_constant_part`); the kernel ORs the tile's start address >> 4 in at run time. A wrong field makes
wgmma read the wrong bytes (or an address the emulator refuses): wrong results.
"""
from __future__ import annotations

from types import SimpleNamespace

from lessons.exercises import Exercise, failures
from lessons.exercises.ex04_ldmatrix_swizzle import PtxCandidate, _stage

HOLES = ("descriptor_bits",)


def reference():
    from ptx.vocab import wgmma
    return SimpleNamespace(descriptor_bits=wgmma.descriptor_bits, is_reference=True)


RANDOM_CASES = 200


def _cases() -> list[tuple[int, int, int, int]]:
    """(start_address, leading_byte_offset, stride_byte_offset, swizzle): the stage's own call, each field alone at
    its extremes, then :data:`RANDOM_CASES` drawn afresh on every run (from the OS): the kernels only ever ask for
    descriptor_bits(0, 16, 1024, 128), whose value a notebook prints, and a red team passed with that constant."""
    import random
    cases = [(0, 16, 1024, 128)]
    for swizzle in (0, 32, 64, 128):
        cases += [(0, 16, 1024, swizzle), (2**18 - 16, 0, 0, swizzle), (0, 2**18 - 16, 0, swizzle),
                  (0, 0, 2**18 - 16, swizzle), (16, 16, 16, swizzle)]
    draw = random.SystemRandom()
    cases += [(16 * draw.randrange(2**14), 16 * draw.randrange(2**14), 16 * draw.randrange(2**14),
               draw.choice((0, 32, 64, 128))) for _ in range(RANDOM_CASES)]
    return cases


def check_rule(solution) -> None:
    """Raise AssertionError at the first field values whose descriptor differs from the PTX ISA's."""
    from ptx.vocab.wgmma import descriptor_bits
    for case in _cases():
        got, want = solution.descriptor_bits(*case), descriptor_bits(*case)
        if type(got) is not int or got != want:
            raise AssertionError(f"descriptor_bits{case} = {got!r}; the ISA's matrix descriptor is {want:#x}")


def descriptor_fields_right(solution) -> list[str]:
    """The descriptor is right for every field value checked, the stage's own and drawn ones.

    The kernels use one descriptor; the rule is the technique."""
    return failures(check_rule, solution)


def build(solution) -> PtxCandidate:
    value = solution.descriptor_bits(0, 16, 1024, 128)  # an unfilled skeleton fails here
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise ValueError(f"descriptor_bits must return a 64-bit unsigned int, got {value!r}")
    return PtxCandidate(5, {"descriptor_bits": solution.descriptor_bits})


PROMPT = """\
Stage 05 multiplies with wgmma.mma_async, which reads both e4m3 tiles straight from shared memory through 64-bit
matrix descriptors. The tiles are K-major, 128 bytes a row, stored with the 128-byte swizzle, 1024-byte aligned.
Write `descriptor_bits(start_address, leading_byte_offset, stride_byte_offset, swizzle=128)`: the descriptor as an
int, per the PTX ISA's "Matrix Descriptor Format": the three byte quantities are stored in 16-byte units (>> 4),
14 bits each, at bits 0, 16 and 32; the base offset (bits 49-51) is 0 here; bits 62-63 are the swizzle mode
(0: none, 1: 128-byte, 2: 64-byte, 3: 32-byte). The stage calls it as descriptor_bits(0, 16, 1024, 128) (the start
address is added at run time). Read ptx/vocab/wgmma.py's module docstring and lessons/05_wgmma.py."""

EXERCISE = Exercise(
    stage=5,
    name="descriptor",
    objective="Encode a wgmma shared-memory matrix descriptor (start, leading and stride byte offsets, swizzle "
              "mode) and see why SBO = 1024 for 128B-swizzled K-major tiles.",
    prompt=PROMPT,
    holes=HOLES,
    questions=(
        ("Predict: the hex value of the constant part of the stage's descriptors, descriptor_bits(0, 16, 1024, 128).",
         "Check with `python -m lessons inspect 5`: the `or.b64` after each descriptor's shr/and/cvt in the PTX "
         "excerpt."),
        ("Predict: how many QGMMA per K block does the stage issue per warpgroup (128x128 tile, k32 steps)?",
         "Check with `python -m lessons inspect 5` (SASS key opcodes: QGMMA)."),
        ("Predict: what happens if the swizzle mode says 'none' while the tiles are stored swizzled?",
         "Check with the emulator: `lessons.stage(5).emulate(a, sa, b, sb, descriptor_bits=yours)` against "
         "gemm.fp8.reference_gemm (wrong D), and `python -m lessons ablate 5` for the unswizzled layout done right."),
    ),
    reference=reference,
    build=build,
    required_sass=("QGMMA",),
    forbidden_sass=("HMMA",),
    shapes_cpu=((70, 200, 256), (130, 9, 128)),
    shapes_gpu=((1000, 2112, 512), (4096, 4096, 7168)),
    perf_threshold=None,
    extra={"checks": (descriptor_fields_right,)},
    answer_sites={"ptx/vocab/wgmma.py": ("descriptor_bits", "descriptor_constant_part", "descriptor_value",
                                          "wgmma_descriptor")},
)
