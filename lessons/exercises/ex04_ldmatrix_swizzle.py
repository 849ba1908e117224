"""Exercise 04 (stage 04, mma.sync): the ldmatrix addresses, with the XOR swizzle that the cp.async writes used.

The holes are ``a_fragment_offset(warp_m, lane, m_tile, k_step)`` and ``b_fragment_offset(warp_n, lane, n_pair,
k_step)``: the byte offset in the A (B) tile that ``lane`` hands ``ldmatrix.x4``. They are plain Python on integers;
``lessons/04_mma_sync.py``'s generator runs them on its warp and lane *registers* (``Traced``: each operator emits
one PTX instruction) to write every ldmatrix address of the stage's own kernel (``generate(...,
fragment_offsets=(a, b))``). The tile's 16-byte chunks are stored swizzled (chunk c of row r at c ^ (r % 8)), so an
address that forgets the swizzle reads the wrong bytes: wrong results, in the emulator as on the GPU.

This module also holds :class:`PtxCandidate`, which exercises 00 and 05 share.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lessons.exercises import Exercise

SASS_SHAPE = (4096, 4096, 7168)


def _stage(number: int):
    import lessons
    return lessons.stage(number)


class PtxCandidate:
    """A PTX stage's generator with a solution's holes plugged in: ``generate(m, n, k)`` -> PTX text; the emulator
    on the CPU (``stage.emulate(..., **hooks)``), the real kernel on a GPU (``stage.gemm(..., **hooks)``)."""

    def __init__(self, stage: int, hooks: dict, sass_shape=SASS_SHAPE):
        self.stage, self.hooks, self.sass_shape = stage, hooks, sass_shape

    def generate(self, *shape) -> str:
        module = _stage(self.stage)
        return module.generate(*shape, **self.hooks)

    def run_cpu(self, a, sa, b, sb) -> np.ndarray:
        return np.asarray(_stage(self.stage).emulate(a, sa, b, sb, **self.hooks), np.float32)

    def run_gpu(self, a, sa, b, sb, d, stream=None) -> None:
        _stage(self.stage).gemm(a, sa, b, sb, d, stream=stream, **self.hooks)

    def cubin(self):
        from ptx.compile import compile_ptx
        return compile_ptx(self.generate(*self.sass_shape))

    def sass(self):
        from ptx.sass import disassemble
        return disassemble(self.cubin())

    def resources(self):
        return next(iter(self.cubin().resources.values()))


HOLES = ("a_fragment_offset", "b_fragment_offset")


def reference():
    stage = _stage(4)
    return SimpleNamespace(a_fragment_offset=stage.a_fragment_offset, b_fragment_offset=stage.b_fragment_offset,
                           is_reference=True)


def build(solution) -> PtxCandidate:
    pair = (solution.a_fragment_offset, solution.b_fragment_offset)
    for offset in pair:  # run each hole once on integers: an unfilled skeleton fails here
        offset(0, 0, 0, 0)
    return PtxCandidate(4, {"fragment_offsets": pair})


PROMPT = """\
Stage 04 feeds mma.sync m16n8k32 (e4m3) from shared memory with ldmatrix.x4: each lane hands ldmatrix the address
of one 16-byte row of one of four 8x8 .b16 matrices, and gets back exactly the fragment registers mma.sync wants.
The A and B tiles are 128 rows of 128 bytes, and cp.async stored them swizzled: 16-byte chunk c of row r sits at
chunk c ^ (r % 8) (lessons/04_mma_sync.py, load_shared_offset). Warps are 2 (M) x 4 (N), each 64 x 32 of the tile.
Write
  a_fragment_offset(warp_m, lane, m_tile, k_step): byte offset in the A tile of the row lane gives ldmatrix for the
      A fragment of m tile m_tile (16 rows, 0..3) at k step k_step (32 bytes of K, 0..3): lanes 0-15 address rows
      0-15 of the tile at K bytes 0-15 of the step, lanes 16-31 the same rows at K bytes 16-31;
  b_fragment_offset(warp_n, lane, n_pair, k_step): the same in the B tile for n tiles 2*n_pair and 2*n_pair+1
      (8 rows each): lanes 0-7 and 8-15 address the first n tile's 8 rows (K bytes 0-15, then 16-31), lanes 16-31
      the second's.
Both must undo the swizzle. They run on registers while the PTX is generated, so use only integers and
+ - * // % & | ^ << >> (no `if` on lane or warp values)."""

EXERCISE = Exercise(
    stage=4,
    name="ldmatrix_swizzle",
    objective="Address ldmatrix so each lane's 16-byte row read lands on the swizzled chunk where cp.async put it, "
              "and the tensor cores get the mma.sync fragment layout.",
    prompt=PROMPT,
    holes=HOLES,
    questions=(
        ("Predict: how many LDSM (ldmatrix) instructions per warp and K block? And HMMA?",
         "Check with `python -m lessons inspect 4` (SASS key opcodes: LDSM 24, HMMA 128 per thread's code)."),
        ("Predict: which banks do the 8 rows of one 8x8 matrix hit with the swizzle, and without it?",
         "Check with `python -m lessons ablate 4` on a CPU (the 'without the XOR swizzle' variant) or the swizzle "
         "figure of lessons/figures/tensor_core_layouts.py."),
        ("Predict: what does D look like if your offsets forget the swizzle (which outputs go wrong)?",
         "Check with the emulator: `lessons.stage(4).emulate(a, sa, b, sb, fragment_offsets=(your_a, your_b))` "
         "against gemm.fp8.reference_gemm on a 70x200x256 problem."),
    ),
    reference=reference,
    build=build,
    required_sass=("HMMA", "LDSM"),
    forbidden_sass=("QGMMA", "HGMMA"),
    shapes_cpu=((70, 200, 256), (130, 9, 128)),
    shapes_gpu=((1000, 2112, 512), (4096, 4096, 7168)),
    perf_threshold=None,
    hole_kinds={"a_fragment_offset": ("expression", ("warp_m", "lane", "m_tile", "k_step")),
                "b_fragment_offset": ("expression", ("warp_n", "lane", "n_pair", "k_step"))},
)
