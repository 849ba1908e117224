"""TMA tensor maps: the 128-byte descriptor a kernel's cp.async.bulk.tensor reads to copy a 2-D box.

A tensor map describes a row-major 2-D tensor in global memory (base address, rows x cols, row stride)
and the box one TMA copy moves into shared memory (box rows x box cols, optionally swizzled so that
wgmma's reads avoid bank conflicts). The driver encodes it (``cuTensorMapEncodeTiled``); the kernel
receives it by value as a ``.param .align 64 .b8 [128]`` parameter (KernelBuilder type "tmap").

The driver's errors are a bare CUDA_ERROR_INVALID_VALUE, so the rules are checked here first, with messages
that say which argument is wrong (CUDA driver API, "Tensor Map Object Management").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ptx.arrays import as_device_view
from ptx.device import activated, current_device, device_of_pointer

TENSOR_MAP_BYTES = 128
MAX_BOX = 256
_SWIZZLE_SPAN = {0: None, 32: 32, 64: 64, 128: 128}  # bytes of the inner box dimension a swizzle pattern covers


@dataclass(frozen=True)
class TensorMap:
    """An encoded CUtensorMap: ``data`` is the 128 bytes passed by value to the kernel."""
    data: bytes
    dtype: np.dtype
    shape: tuple[int, int]
    box: tuple[int, int]
    swizzle: int

    def __post_init__(self):
        if len(self.data) != TENSOR_MAP_BYTES:
            raise ValueError(f"a tensor map is {TENSOR_MAP_BYTES} bytes, got {len(self.data)}")


def _data_type(dtype: np.dtype):
    from cuda.bindings import driver
    kinds = driver.CUtensorMapDataType
    table = {
        "uint8": kinds.CU_TENSOR_MAP_DATA_TYPE_UINT8,
        "float8_e4m3fn": kinds.CU_TENSOR_MAP_DATA_TYPE_UINT8,  # TMA moves bytes; the meaning is the kernel's
        "uint16": kinds.CU_TENSOR_MAP_DATA_TYPE_UINT16,
        "bfloat16": kinds.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        "float16": kinds.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        "float32": kinds.CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        "uint32": kinds.CU_TENSOR_MAP_DATA_TYPE_UINT32,
        "int32": kinds.CU_TENSOR_MAP_DATA_TYPE_INT32,
    }
    return table[dtype.name]


_SUPPORTED = ("uint8", "float8_e4m3fn", "uint16", "bfloat16", "float16", "float32", "uint32", "int32")


def _as_dtype(dtype) -> np.dtype:
    if isinstance(dtype, str) and dtype in ("bf16", "bfloat16", "e4m3", "float8_e4m3fn"):
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16 if dtype.startswith("bf") else ml_dtypes.float8_e4m3fn)
    try:
        return np.dtype(dtype)
    except TypeError:
        supported = ", ".join(_SUPPORTED)
        raise TypeError(f"tensor_map_2d: unsupported dtype {dtype!r}; use one of {supported}") from None


def validate_2d(ptr: int, dtype, shape, row_stride_bytes: int, box, swizzle: int, oob_fill_nan: bool = False):
    """Check the driver's rules in Python; returns the normalised (dtype, shape, box)."""
    dtype = _as_dtype(dtype)
    if dtype.name not in _SUPPORTED:
        raise TypeError(f"tensor_map_2d: unsupported dtype {dtype.name}; use one of {', '.join(_SUPPORTED)}")
    if not isinstance(ptr, (int, np.integer)) or ptr <= 0:
        raise ValueError(f"tensor_map_2d: ptr must be a positive device address, got {ptr!r}")
    if ptr % 16:
        raise ValueError(f"tensor_map_2d: the base address must be 16-byte aligned, got {ptr:#x}")
    rows, cols = (int(v) for v in shape)
    box_rows, box_cols = (int(v) for v in box)
    if rows < 1 or cols < 1 or rows >= 2**32 or cols >= 2**32:
        raise ValueError(f"tensor_map_2d: shape must be positive and below 2**32, got {tuple(shape)}")
    if row_stride_bytes % 16:
        raise ValueError(f"tensor_map_2d: row_stride_bytes must be a multiple of 16, got {row_stride_bytes}")
    if row_stride_bytes < cols * dtype.itemsize:
        raise ValueError(f"tensor_map_2d: row_stride_bytes={row_stride_bytes} is smaller than a row "
                         f"({cols} x {dtype.itemsize} bytes)")
    if row_stride_bytes >= 2**40:
        raise ValueError(f"tensor_map_2d: row_stride_bytes must be below 2**40, got {row_stride_bytes}")
    for name, value in (("box rows", box_rows), ("box cols", box_cols)):
        if not 1 <= value <= MAX_BOX:
            raise ValueError(f"tensor_map_2d: {name} must be in 1..{MAX_BOX}, got {value}")
    inner_bytes = box_cols * dtype.itemsize
    if inner_bytes % 16:
        raise ValueError(f"tensor_map_2d: the inner box dimension must be a multiple of 16 bytes, got "
                         f"{box_cols} x {dtype.itemsize} = {inner_bytes} bytes")
    if swizzle not in _SWIZZLE_SPAN:
        raise ValueError(f"tensor_map_2d: swizzle must be 0, 32, 64 or 128 (bytes), got {swizzle!r}")
    span = _SWIZZLE_SPAN[swizzle]
    if span is not None and inner_bytes > span:
        raise ValueError(f"tensor_map_2d: with swizzle={swizzle} the inner box dimension may span at most "
                         f"{span} bytes, got {box_cols} x {dtype.itemsize} = {inner_bytes} bytes")
    if oob_fill_nan and dtype.name not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"tensor_map_2d: oob_fill_nan needs a floating-point dtype, got {dtype.name}")
    return dtype, (rows, cols), (box_rows, box_cols)


def _encode(data_type, ptr, shape, row_stride_bytes, box, swizzle, oob_fill_nan):
    from cuda.bindings import driver
    fill = driver.CUtensorMapFloatOOBfill
    swizzles = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}
    rows, cols = shape
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t  # cuda.bindings wants these wrappers, not ints
    return driver.cuTensorMapEncodeTiled(
        data_type, 2, ptr,
        [u64(cols), u64(rows)],        # innermost dimension first
        [u64(row_stride_bytes)],       # strides of dimensions 1.. (dimension 0 is contiguous)
        [u32(box[1]), u32(box[0])],
        [u32(1), u32(1)],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(driver.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{swizzles[swizzle]}"),
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        fill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA if oob_fill_nan
        else fill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )


def tensor_map_2d(ptr: int, dtype, shape, row_stride_bytes: int, box, swizzle: int = 128,
                  oob_fill_nan: bool = False) -> TensorMap:
    """Encode a TMA descriptor for the row-major (rows, cols) tensor at ``ptr`` and a (box rows, box cols) box.

    ``ptr`` is a device address (int) or an array object whose address is taken; ``row_stride_bytes`` is
    the distance between rows in bytes (a multiple of 16).
    Out-of-bounds elements of a box read as zero (or NaN with ``oob_fill_nan``, floating dtypes only), which
    is what makes ragged M and N safe without masks.
    """
    from cuda.bindings import driver
    if not isinstance(ptr, (int, np.integer)):
        view = as_device_view(ptr)
        if not view.on_device:
            raise TypeError(f"tensor_map_2d: {type(ptr).__name__} is not in device memory; copy it to the GPU first")
        ptr = view.ptr  # an array object: its device address
    dtype, shape, box = validate_2d(ptr, dtype, shape, row_stride_bytes, box, swizzle, oob_fill_nan)
    data_type = _data_type(dtype)
    # Encoding needs an initialised driver; some drivers also want a current context, so make one if asked.
    driver.cuInit(0)
    err, tensor_map = _encode(data_type, int(ptr), shape, row_stride_bytes, box, swizzle, oob_fill_nan)
    if err == driver.CUresult.CUDA_ERROR_INVALID_CONTEXT:  # encode in the context of the memory it describes
        owner = device_of_pointer(int(ptr))
        with activated(owner if owner >= 0 else current_device()):
            err, tensor_map = _encode(data_type, int(ptr), shape, row_stride_bytes, box, swizzle, oob_fill_nan)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with {err.name} for dtype={dtype.name} shape={shape} "
                           f"row_stride_bytes={row_stride_bytes} box={box} swizzle={swizzle}")
    words = [int(w) for w in tensor_map.opaque]
    return TensorMap(np.array(words, dtype="<u8").tobytes(), dtype, shape, box, swizzle)


__all__ = ["TensorMap", "tensor_map_2d", "validate_2d", "TENSOR_MAP_BYTES"]
