"""Exercise 00 - PTX from Python: dequantize a pair of e4m3 values (lessons/00_ptx_dequant.py).

Learning objective: write PTX from Python, emit the hardware FP8 -> BF16 conversion of two elements into a kernel,
and see what ptxas makes of it.

Stage 00 writes a kernel as PTX text from Python: y = bf16(e4m3(x) * s), 16 bytes of x per thread. The stage loads
the bytes and the scale and stores the results; you write the conversion. Implement
`dequantize_pair(kb, pair, scale)`: `kb` is the ptx.builder.KernelBuilder (kb.reg("b32") etc. give fresh registers,
kb.emit(...) appends PTX lines), `pair` a .b16 register holding two e4m3 codes (the first element in the low byte),
`scale` the .f32 scale of their group. Emit PTX that converts both to f16 with one instruction
(cvt.rn.f16x2.e4m3x2), splits the halves, widens each to f32, multiplies by the scale (mul.rn.f32) and packs the two
products into one .b32 of two bf16 (cvt.rn.bf16x2.f32: its *first* source goes to the *upper* half); return that
register, the first element in the low half. The idioms are in ptx/vocab/core.py; read lessons/00_ptx_dequant.py.
The grader dequantizes A and B with your kernel and multiplies them on the host.

Grade it: python -m lessons grade 0 this_file.py
"""
from ptx.vocab import core  # noqa: F401  (cvt_e4m3x2_to_f16x2, unpack_b32, cvt_f16_to_f32, cvt_f32x2_to_bf16x2)


def dequantize_pair(kb, pair: str, scale: str) -> str:
    """Emit the PTX for two elements into ``kb``; return the .b32 register with bf16(e4m3 * scale) of both.

    kb: ptx.builder.KernelBuilder of the kernel being generated (kb.reg(type) -> a new register name, kb.emit(*lines)).
    pair: a .b16 register: two e4m3 codes, the first element in the low byte.
    scale: a .f32 register: the scale of their 128-wide group.
    Returns: a .b32 register, the first element's bf16 in the low 16 bits, the second's in the high 16 bits.
    """
    raise NotImplementedError("dequantize_pair: emit cvt.rn.f16x2.e4m3x2, unpack, cvt.f32.f16, mul.rn.f32, "
                              "cvt.rn.bf16x2.f32 and return the packed register")


# Predict, then check:
# 1. Predict: how many F2FP.F16.E4M3.UNPACK_B, HADD2.F32 and F2FP.BF16.F32.PACK_AB does one thread execute?
#    Check with `python -m lessons inspect 0` (SASS key opcodes; tests/test_stage00.py pins 8, 16 and 8).
# 2. Predict: which element ends up in the low half if you pass the products to cvt.rn.bf16x2.f32 in
#    (first, second) order?
#    Check with the emulator: lessons.exercises.ex00_dequant_pair.emulate_dequantize(ptx, x, s) against
#    lessons.stage(0).reference.
# 3. Predict: how many bytes does the kernel move at 4096x7168, and how long must it take at 3.35 TB/s?
#    Check with the stage's docstring and `python -m lessons inspect 0` (speed of light: HBM).
