"""What the Numba stages (01-03) share: FP8 e4m3 decode and BF16 encode on the device, arrays and streams.

Numba has no FP8 or BF16 arithmetic, so the kernels see raw bits (A and B as bytes, D as uint16) and
convert them with the device functions below. Both conversions are plain integer and float arithmetic,
exact, and identical in the CUDA simulator (where libdevice bit casts do not exist) and on the GPU:

* e4m3 byte -> float32: an e4m3 number is ``(8 + mantissa) * 2**(exponent - 10)`` (or ``mantissa * 2**-9``
  when the exponent field is 0), and ``(8 + mantissa) << exponent`` is a small integer, so one int->float
  conversion and one multiply by 2**-10 decode it exactly. NaN (0x7F/0xFF) is not handled: the casts
  saturate at +-448 and never produce it.
* float32 -> BF16 bits, round to nearest even: ``frexp`` gives exponent and significand; adding and
  subtracting 2**23 rounds the 8-bit significand to an integer with the FPU's own ties-to-even rule. This
  runs once per output element, so its cost does not matter next to the K loop.

Loops: a hot ``for k in range(n)`` loop compiles badly in Numba-CUDA 0.30 (the range iterator's "still
valid" flag survives LLVM, about ten extra integer instructions per iteration, and blocks unrolling), so the
stages write their K loops as ``while k < n: ...; k += 1``, which compiles to a clean counted loop.

The host helpers turn any accepted array (Numba device array, CUDA-array-interface object, torch tensor,
and in the simulator NumPy / simulator arrays) into a Numba array of the dtype a kernel wants, zero-copy.
"""
from __future__ import annotations

import math

import numpy as np
from numba import config, cuda
from numpy import float32, int32, uint32, uint64  # casts Numba compiles; NumPy's are 50x faster in the simulator

from gemm.fp8 import GROUP  # noqa: F401  (re-exported: the stages' K-group width)

_TWO_POW_MINUS_10 = float32(2.0 ** -10)
_ROUNDING_MAGIC = float32(2.0 ** 23)  # x + 2**23 - 2**23 rounds 0 <= x < 2**22 to an integer, ties to even
_BF16_MIN_NORMAL = float32(2.0 ** -126)
_TWO_POW_64 = float32(2.0 ** 64)
_TWO_POW_69 = float32(2.0 ** 69)
_FLOAT32_MAX = float32(3.4028234663852886e38)


# ------------------------------------------------------------------------------------------------ device
def device_function(function):
    """``cuda.jit(device=True, inline="always")``; in the simulator, the plain Python function.

    The simulator wraps each device-function call in a swap of the module's globals (tens of microseconds
    a call); these functions use nothing from ``cuda.*``, so the same source runs unwrapped there.
    """
    if config.ENABLE_CUDASIM:
        return function
    return cuda.jit(device=True, inline="always")(function)


@device_function
def e4m3_to_f32(byte):
    """One e4m3 code (any integer type holding 0..255) -> its exact float32 value."""
    code = uint32(byte)
    exponent = (code >> uint32(3)) & uint32(15)
    mantissa = code & uint32(7)
    if exponent != uint32(0):
        mantissa = mantissa | uint32(8)  # the implicit leading bit of a normal number
    else:
        exponent = uint32(1)  # subnormals share the smallest normal exponent
    magnitude = float32(int32(mantissa << exponent)) * _TWO_POW_MINUS_10  # int32: a 32-bit I2F
    if code & uint32(0x80):
        return -magnitude
    return magnitude


@device_function
def e4m3x4_to_f32(word):
    """Four e4m3 codes packed little-endian in a uint32 (byte 0 = lowest address) -> four float32."""
    word = uint32(word)
    return (e4m3_to_f32(word & uint32(0xFF)), e4m3_to_f32((word >> uint32(8)) & uint32(0xFF)),
            e4m3_to_f32((word >> uint32(16)) & uint32(0xFF)), e4m3_to_f32(word >> uint32(24)))


@device_function
def _round_to_integer(x):
    """RNE of a float32 in [0, 2**22] to an integer-valued float32 (the FPU's own rounding does it)."""
    return (float32(x) + _ROUNDING_MAGIC) - _ROUNDING_MAGIC


@device_function
def f32_to_bf16_bits(x):
    """float32 -> BF16 bit pattern (as an int32 in 0..0xFFFF), round to nearest even, like the hardware."""
    x = float32(x)
    sign = int32(0x8000) if math.copysign(float32(1.0), x) < float32(0.0) else int32(0)
    magnitude = abs(x)
    if not magnitude <= _FLOAT32_MAX:  # inf or NaN
        return int32(0x7FC0) if x != x else sign | int32(0x7F80)
    if magnitude < _BF16_MIN_NORMAL:  # subnormal (or zero): units of 2**-133
        return sign | int32(_round_to_integer((magnitude * _TWO_POW_64) * _TWO_POW_69))
    significand, exponent = math.frexp(magnitude)  # magnitude = significand * 2**exponent, significand in [0.5, 1)
    rounded = int32(_round_to_integer(float32(significand) * float32(256.0)))  # 128..256: 8 significant bits
    # A significand that rounds up to 256 carries into the exponent field by itself (up to 0x7F80 = inf).
    return sign | (((int32(exponent) + int32(126)) << int32(7)) + rounded - int32(128))


# -------------------------------------------------------------------------------------------------- host
def _host_array(obj):
    """The NumPy array behind a simulator array or NumPy array (simulator runs), else None."""
    if isinstance(obj, np.ndarray):
        return obj
    if type(obj).__name__ == "FakeCUDAArray":
        return obj._ary
    return None


def kernel_array(view, dtype, shape=None):
    """The memory of a validated argument (a gemm.validate DeviceView) as a Numba array of ``dtype``.

    Zero-copy. ``dtype`` may reinterpret the contiguous last axis (e4m3 -> uint8, bf16 -> uint16, or bytes
    -> uint32/uint64 words for wide loads); ``shape`` is then the new shape. No allocation, no
    synchronization: safe inside a CUDA graph capture.
    """
    dtype = np.dtype(dtype)
    if shape is None:
        shape = tuple(view.shape[:-1]) + (view.shape[-1] * view.itemsize // dtype.itemsize,)
    host = _host_array(view.obj)
    if host is not None:  # simulator: NumPy memory posing as device memory
        reinterpreted = host.view(dtype) if host.dtype != dtype else host
        assert reinterpreted.shape == tuple(shape), (reinterpreted.shape, shape)
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
        return FakeCUDAArray(reinterpreted)  # wraps, does not copy: the kernel writes into the caller's array
    if (hasattr(view.obj, "gpu_data") and view.obj.dtype == dtype  # already what the kernel wants
            and tuple(view.obj.shape) == tuple(shape)):
        return view.obj
    if dtype.itemsize == view.itemsize:
        byte_strides = tuple(s * view.itemsize for s in view.strides)
    else:  # the validator guaranteed a contiguous last axis
        byte_strides = tuple(s * view.itemsize for s in view.strides[:-1]) + (dtype.itemsize,)
    interface = {"shape": tuple(shape), "strides": byte_strides, "typestr": dtype.str,
                 "data": (view.ptr, False), "version": 3}
    return cuda.from_cuda_array_interface(interface, owner=view.obj, sync=False)


def kernel_ptx(kernel, operand_dtype="u1", cc=(9, 0)) -> str:
    """PTX of a stage kernel (a, sa, b, sb, d, m, n, groups) for compute capability ``cc``, without a GPU.

    Needs NVVM only (not a driver); not available in the simulator, so run it in a process without
    NUMBA_ENABLE_CUDASIM. ``operand_dtype``: how the kernel reads A and B (bytes, or uint64 words).
    """
    from numba import types
    from numba.np.numpy_support import from_dtype
    operand = types.Array(from_dtype(np.dtype(operand_dtype)), 2, "C")
    sa = types.Array(types.float32, 2, "A")  # M-major: not C-contiguous
    signature = (operand, sa, operand, types.Array(types.float32, 2, "C"), types.Array(types.uint16, 2, "C"),
                 types.int64, types.int64, types.int64)
    ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=cc)
    return ptx


_streams: dict = {}


def launch_stream(stream):
    """The Numba stream to launch on: None or 0 -> the default stream; otherwise a cudaStream_t handle (int),
    or anything convertible to one (cuda.bindings CUstream, Numba stream, torch stream via ``.cuda_stream``)."""
    if stream is None or config.ENABLE_CUDASIM:  # the simulator has one stream
        return 0
    handle = int(getattr(stream, "cuda_stream", stream))
    if handle == 0:
        return 0
    if handle not in _streams:  # wrapping is cheap, but keep one wrapper per handle
        _streams[handle] = cuda.external_stream(handle)
    return _streams[handle]
