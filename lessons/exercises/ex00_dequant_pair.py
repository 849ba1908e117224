"""Exercise 00 (stage 00, PTX from Python): write the PTX that dequantizes a pair of e4m3 values.

The hole is ``dequantize_pair(kb, pair, scale)``: Python that *emits PTX text* into the kernel builder, the stage's
one idea. ``lessons/00_ptx_dequant.py``'s ``generate(m, k, dequantize_pair=...)`` calls it for each of the 8 pairs
a thread converts (the stage's own function reproduces the stage's PTX byte for byte).

Stage 00 is not a GEMM, so its candidate keeps the course's GEMM contract this way: ``run_cpu(a, sa, b, sb)``
dequantizes A (per-token scales) with the student's kernel, in the PTX emulator, and multiplies the BF16 result on
the host, in float64, with B dequantized exactly on the host (stage 00's ``reference``, B's 128x128 block scales
repeated per row). ``extra["reference"]`` is the same product with A dequantized exactly too (:func:`reference`), so
a right kernel scores a calc_diff of ~0, and a wrong pair (swapped halves, a missing scale, f16 instead of bf16)
fails: B is not permuted with it. NaN poison in the dequantized A (elements the kernel never wrote) reaches D.
``run_gpu`` runs the kernel on the device and does the product on the host (synchronous: the exercise grades
correctness and technique, not speed).

The lockstep emulator (ptx.emulate.lockstep) models the GEMM stages' instructions; :class:`_DequantCTA` adds the four
this kernel uses besides (%ntid, cvt.rn.f16x2.e4m3x2, the b32 -> {b16, b16} unpack, cvt.f32.f16), from the ISA.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from lessons.exercises import Exercise

HOLES = ("dequantize_pair",)
SASS_SHAPE = (4096, 7168)


def _stage():
    import lessons
    return lessons.stage(0)


def _row_scales_b(sb, n: int) -> np.ndarray:
    """sb (ceil(N/128), Kg) per 128x128 block -> one scale row per row of B: (N, Kg), row n = sb[n // 128]."""
    return np.ascontiguousarray(np.repeat(np.asarray(sb, np.float32), 128, axis=0)[:n])


def _product(a_values, b_values) -> np.ndarray:
    """(M, K) x (N, K)^T in float64, NaN-propagating (the poison of an unwritten element reaches D). The grader's
    side, not the student's: the vendor-GEMM guard refuses matmul only to code in the student's file."""
    return np.asarray(a_values, np.float64) @ np.asarray(b_values, np.float64).T


def _exact(x, s) -> np.ndarray:
    """bf16(e4m3(x) * s) on the host (stage 00's own reference), as float64."""
    from gemm.fp8 import bf16_to_float
    return bf16_to_float(_stage().reference(x, np.ascontiguousarray(s, np.float32))).astype(np.float64)


def reference(a, sa, b, sb) -> np.ndarray:
    """What run_cpu returns for a right kernel: the exact BF16 dequantization of A and B, multiplied in float64."""
    return _product(_exact(a, sa), _exact(b, _row_scales_b(sb, b.shape[0])))


def _dequant_cta():
    import ml_dtypes

    from ptx.emulate.lockstep import CTA

    class _DequantCTA(CTA):
        def execute(self, opcode, ops, mask):
            v = self.value
            if opcode == "mov.b32" and ops[0].startswith("{"):  # unpack: {low, high} = b32
                low, high = (x.strip() for x in ops[0].strip("{}").split(","))
                word = v(ops[1]).astype(np.int64) & 0xFFFFFFFF
                self.write(low, word & 0xFFFF, mask)
                self.write(high, word >> 16, mask)
            elif opcode == "cvt.rn.f16x2.e4m3x2":  # each byte of the b16 to the f16 of the same half
                codes = (v(ops[1]).astype(np.int64) & 0xFFFF).astype(np.uint16).view(np.uint8).reshape(-1, 2)
                halves = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float16).view(np.uint16).astype(np.int64)
                self.write(ops[0], halves[:, 0] | (halves[:, 1] << 16), mask)
            elif opcode == "cvt.f32.f16":
                bits = (v(ops[1]).astype(np.int64) & 0xFFFF).astype(np.uint16)
                self.write(ops[0], bits.view(np.float16).astype(np.float32), mask)
            else:
                super().execute(opcode, ops, mask)

    return _DequantCTA


def emulate_dequantize(ptx: str, x, s) -> np.ndarray:
    """Run a stage-00 kernel's PTX on the CPU: y = bf16(e4m3(x) * s) as float32, NaN where it wrote nothing."""
    from gemm.fp8 import bf16_to_float
    from ptx.emulate.common import GlobalMemory, Program
    stage = _stage()
    m, k = x.shape
    y = np.full((m, k), 0x7FC0, np.uint16)
    memory, kernel = GlobalMemory(), stage.KERNEL_NAME
    params = {f"{kernel}_param_{name}": memory.add(name, value) for name, value in
              (("x", np.ascontiguousarray(x).view(np.uint8)), ("s", np.ascontiguousarray(s, np.float32)), ("y", y))}
    chunks = m * k // stage.BYTES_PER_THREAD
    program, blocks = Program(ptx, kernel), -(-chunks // stage.THREADS)
    cta_class = _dequant_cta()
    for block in range(blocks):
        # lockstep cannot diverge: the last block runs only its in-range threads (the rest would exit at once)
        threads = min(stage.THREADS, chunks - block * stage.THREADS)
        cta = cta_class(ptx, kernel, params, memory, (block, 0), threads, 0, nctaid=(blocks, 1), program=program)
        cta.extra_specials["%ntid.x"] = stage.THREADS
        cta.run()
    return bf16_to_float(y)


class DequantCandidate:
    def __init__(self, pair):
        self.pair = pair

    def generate(self, m: int, k: int) -> str:
        return _stage().generate(m, k, dequantize_pair=self.pair)

    def run_cpu(self, a, sa, b, sb) -> np.ndarray:
        m, k = a.shape
        a_values = emulate_dequantize(self.generate(m, k), a, np.asarray(sa, np.float32))
        return _product(a_values.astype(np.float64), _exact(b, _row_scales_b(sb, b.shape[0]))).astype(np.float32)

    def run_gpu(self, a, sa, b, sb, d) -> None:
        """Dequantize A on the device with the kernel (device arrays from gemm.testing.problems.device_problem), multiply on
        the host with the exact B, write D's BF16 bits to ``d``. Synchronous (the exercise is not timed)."""
        from numba import cuda

        from gemm.fp8 import BF16, E4M3, bf16_to_float
        from ptx.compile import compile_ptx
        from ptx.runtime import load_kernel
        stage = _stage()
        m, k = a.shape
        host = lambda x: x.copy_to_host() if hasattr(x, "copy_to_host") else np.asarray(x)  # noqa: E731
        kernel = load_kernel(compile_ptx(self.generate(m, k)), stage.KERNEL_NAME)
        y = cuda.device_array((m, k), np.uint16)
        y.copy_to_device(np.full((m, k), 0x7FC0, np.uint16))  # NaN poison: unwritten elements reach D
        scales = cuda.to_device(np.ascontiguousarray(host(sa), np.float32))  # sa arrives M-major: make it (M, Kg)
        kernel.launch(-(-m * k // stage.BYTES_PER_THREAD // stage.THREADS), stage.THREADS,
                      [a.__cuda_array_interface__["data"][0], scales.__cuda_array_interface__["data"][0],
                       y.__cuda_array_interface__["data"][0]])
        cuda.synchronize()
        b_host = host(b).view(E4M3)
        values = _product(bf16_to_float(y.copy_to_host()).astype(np.float64),
                          _exact(b_host, _row_scales_b(host(sb), b_host.shape[0])))
        d.copy_to_device(values.astype(BF16).view(np.uint16))

    def sass(self):
        from ptx.compile import compile_ptx
        from ptx.sass import disassemble
        return disassemble(compile_ptx(self.generate(*SASS_SHAPE)))


def reference_solution():
    return SimpleNamespace(dequantize_pair=_stage().dequantize_pair, is_reference=True)


def build(solution) -> DequantCandidate:
    _stage().generate(1, 16, dequantize_pair=solution.dequantize_pair)  # an unfilled skeleton fails here
    return DequantCandidate(solution.dequantize_pair)


def hardware_conversions(instructions) -> list[str]:
    """Technique (modifiers, which base opcodes cannot show): the e4m3 -> f16 unpack and the bf16 pack are the
    hardware's F2FP instructions, 8 of each per thread, not a software decode."""
    texts = [" ".join(i.text.split()[1:] if i.text.startswith("@") else i.text.split()) for i in instructions]
    unpack = sum(t.startswith("F2FP.F16.E4M3.UNPACK_B") for t in texts)
    pack = sum(t.startswith("F2FP.BF16.F32.PACK_AB") for t in texts)
    failures = []
    if unpack != 8:
        failures.append(f"{unpack} F2FP.F16.E4M3.UNPACK_B (cvt.rn.f16x2.e4m3x2), expected 8 per thread")
    if pack != 8:
        failures.append(f"{pack} F2FP.BF16.F32.PACK_AB (cvt.rn.bf16x2.f32), expected 8 per thread")
    return failures


PROMPT = """\
Stage 00 writes a kernel as PTX text from Python: y = bf16(e4m3(x) * s), 16 bytes of x per thread. The stage loads
the bytes and the scale and stores the results; you write the conversion. Implement
`dequantize_pair(kb, pair, scale)`: `kb` is the ptx.builder.KernelBuilder (kb.reg("b32") etc. give fresh registers,
kb.emit(...) appends PTX lines), `pair` a .b16 register holding two e4m3 codes (the first element in the low byte),
`scale` the .f32 scale of their group. Emit PTX that converts both to f16 with one instruction
(cvt.rn.f16x2.e4m3x2), splits the halves, widens each to f32, multiplies by the scale (mul.rn.f32) and packs the two
products into one .b32 of two bf16 (cvt.rn.bf16x2.f32: its *first* source goes to the *upper* half); return that
register, the first element in the low half. The idioms are in ptx/vocab/core.py; read lessons/00_ptx_dequant.py.
The grader dequantizes A and B with your kernel and multiplies them on the host."""

EXERCISE = Exercise(
    stage=0,
    name="dequant_pair",
    objective="Write PTX from Python: emit the hardware FP8 -> BF16 conversion of two elements into a kernel and "
              "see what ptxas makes of it.",
    prompt=PROMPT,
    holes=HOLES,
    questions=(
        ("Predict: how many F2FP.F16.E4M3.UNPACK_B, HADD2.F32 and F2FP.BF16.F32.PACK_AB does one thread execute?",
         "Check with `python -m lessons inspect 0` (SASS key opcodes; tests/test_stage00.py pins 8, 16 and 8)."),
        ("Predict: which element ends up in the low half if you pass the products to cvt.rn.bf16x2.f32 in "
         "(first, second) order?", "Check with the emulator: "
         "`lessons.exercises.ex00_dequant_pair.emulate_dequantize(ptx, x, s)` against lessons.stage(0).reference."),
        ("Predict: how many bytes does the kernel move at 4096x7168, and how long must it take at 3.35 TB/s?",
         "Check with the stage's docstring and `python -m lessons inspect 0` (speed of light: HBM)."),
    ),
    reference=reference_solution,
    build=build,
    required_sass=("F2FP",),
    forbidden_sass=("HMMA", "QGMMA", "HGMMA", "I2F"),
    shapes_cpu=((70, 200, 256), (33, 130, 128)),
    shapes_gpu=((1000, 2112, 512), (4096, 512, 7168)),  # the product is on the host: a narrow N keeps it short
    perf_threshold=None,
    extra={"reference": reference, "sass_checks": (hardware_conversions,),
           "untimed": "stage 00 is no GEMM (the grader multiplies on the host): no GEMM speed of light to grade "
                      "against (notebooks/00_ptx_dequant.ipynb times the dequantization kernel against HBM)"},
    hole_kinds={"dequantize_pair": "emitter"},
)
