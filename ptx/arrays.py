"""Zero-copy array interop: read pointer, shape, strides, dtype and device off any array we are handed.

Accepted: torch tensors (read directly, so float8_e4m3fn and bfloat16 keep their meaning), anything with
``__cuda_array_interface__`` (Numba, CuPy), anything with ``__dlpack__`` (through cuda.core's
StridedMemoryView), Numba-simulator arrays and NumPy arrays (host memory: ``on_device`` is False, which the
validators turn into a clear error for GPU kernels).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)

@dataclass(frozen=True)
class DeviceView:
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements, like torch (not bytes, unlike NumPy)
    dtype: np.dtype
    device_id: int  # CUDA ordinal; -1 for host memory
    obj: Any

    @property
    def on_device(self) -> bool:
        return self.device_id >= 0

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    def is_row_major(self) -> bool:
        """C-contiguous (size-1 dimensions may carry any stride)."""
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True


_TORCH_DTYPES: dict = {}  # torch dtype -> NumPy dtype, built on first use (torch is optional)


def _torch_dtype(t) -> np.dtype:
    if not _TORCH_DTYPES:
        import torch
        _TORCH_DTYPES.update({
            torch.float8_e4m3fn: E4M3, torch.bfloat16: BF16, torch.uint8: np.dtype(np.uint8),
            torch.float32: np.dtype(np.float32), torch.float16: np.dtype(np.float16),
            torch.int32: np.dtype(np.int32), torch.int64: np.dtype(np.int64), torch.float64: np.dtype(np.float64),
        })
        uint16 = getattr(torch, "uint16", None)
        if uint16 is not None:
            _TORCH_DTYPES[uint16] = np.dtype(np.uint16)
    dtype = _TORCH_DTYPES.get(t.dtype)
    if dtype is None:
        raise TypeError(f"unsupported torch dtype {t.dtype}")
    return dtype


def _from_torch(t) -> DeviceView:
    device_id = t.device.index if t.device.type == "cuda" else -1
    return DeviceView(t.data_ptr(), tuple(t.shape), tuple(t.stride()), _torch_dtype(t), device_id, t)


def _from_cai(obj) -> DeviceView:
    cai = obj.__cuda_array_interface__
    dtype = np.dtype(cai["typestr"])
    shape = tuple(cai["shape"])
    if cai.get("strides") is None:
        strides = _c_strides(shape)
    else:
        strides = tuple(s // dtype.itemsize for s in cai["strides"])
    ptr = int(cai["data"][0])
    return DeviceView(ptr, shape, strides, dtype, _device_of_pointer(ptr), obj)


def _c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))


def _device_of_pointer(ptr: int) -> int:
    from ptx.device import device_of_pointer
    return device_of_pointer(ptr)


def is_torch_tensor(obj) -> bool:
    """Whether ``obj`` is a torch tensor, without importing torch (a caller that never used it pays nothing)."""
    return type(obj).__module__.startswith("torch")


def as_device_view(obj) -> DeviceView:
    """Describe ``obj`` without copying it. Raises TypeError for things that are not arrays."""
    if isinstance(obj, DeviceView):
        return obj
    if is_torch_tensor(obj):
        return _from_torch(obj)
    if type(obj).__name__ == "FakeCUDAArray":  # Numba's CUDA simulator: host memory posing as device memory
        host = obj._ary
        return DeviceView(host.ctypes.data, host.shape, tuple(s // host.itemsize for s in host.strides),
                          host.dtype, 0, obj)
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cai(obj)
    if isinstance(obj, np.ndarray):
        return DeviceView(obj.ctypes.data, obj.shape, tuple(s // obj.itemsize for s in obj.strides),
                          obj.dtype, -1, obj)
    if hasattr(obj, "__dlpack__"):
        from cuda.core.utils import StridedMemoryView
        view = StridedMemoryView(obj, stream_ptr=-1)
        shape = tuple(view.shape)
        strides = tuple(view.strides) if view.strides is not None else _c_strides(shape)
        device_id = view.device_id if view.is_device_accessible else -1
        return DeviceView(int(view.ptr), shape, strides, np.dtype(view.dtype), device_id, obj)
    raise TypeError(f"expected an array (torch tensor, CUDA array interface or DLPack), got {type(obj).__name__}")
