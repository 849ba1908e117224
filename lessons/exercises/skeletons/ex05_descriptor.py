"""Exercise 05 - the wgmma descriptor fields (lessons/05_wgmma.py).

Learning objective: encode a wgmma shared-memory matrix descriptor (start, leading and stride byte offsets, swizzle
mode) and see why SBO = 1024 for 128B-swizzled K-major tiles.

Stage 05 multiplies with wgmma.mma_async, which reads both e4m3 tiles straight from shared memory through 64-bit
matrix descriptors. The tiles are K-major, 128 bytes a row, stored with the 128-byte swizzle, 1024-byte aligned.
Write `descriptor_bits(start_address, leading_byte_offset, stride_byte_offset, swizzle=128)`: the descriptor as an
int, per the PTX ISA's "Matrix Descriptor Format": the three byte quantities are stored in 16-byte units (>> 4),
14 bits each, at bits 0, 16 and 32; the base offset (bits 49-51) is 0 here; bits 62-63 are the swizzle mode
(0: none, 1: 128-byte, 2: 64-byte, 3: 32-byte). The stage calls it as descriptor_bits(0, 16, 1024, 128) (the start
address is added at run time). Read ptx/vocab/wgmma.py's module docstring and lessons/05_wgmma.py.

Grade it: python -m lessons grade 5 this_file.py
"""


def descriptor_bits(start_address: int, leading_byte_offset: int, stride_byte_offset: int, swizzle: int = 128) -> int:
    """The 64-bit wgmma matrix descriptor for a shared-memory operand, as a Python int.

    start_address, leading_byte_offset, stride_byte_offset: bytes (multiples of 16, below 2**18);
    swizzle: the swizzle width in bytes, 128, 64, 32, or 0 for none.
    """
    raise NotImplementedError("descriptor_bits: pack the fields (>> 4) at bits 0, 16, 32 and the mode at 62")


# Predict, then check:
# 1. Predict: the hex value of the constant part of the stage's descriptors, descriptor_bits(0, 16, 1024, 128).
#    Check with `python -m lessons inspect 5`: the `or.b64` after each descriptor's shr/and/cvt in the PTX excerpt.
# 2. Predict: how many QGMMA per K block does the stage issue per warpgroup (128x128 tile, k32 steps)?
#    Check with `python -m lessons inspect 5` (SASS key opcodes: QGMMA).
# 3. Predict: what happens if the swizzle mode says "none" while the tiles are stored swizzled?
#    Check with the emulator: lessons.stage(5).emulate(a, sa, b, sb, descriptor_bits=yours) against
#    gemm.fp8.reference_gemm (wrong D), and `python -m lessons ablate 5` for the unswizzled layout done right.
