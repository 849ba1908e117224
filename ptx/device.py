"""Which GPU, and its context: device discovery, per-device primary contexts, the device of a pointer or stream.

Every device has one *primary context* (the one torch, Numba and cuda.core also use); a launch, a module load or a
copy runs in the context current on the calling thread. A serving process keeps every GPU visible and calls
``torch.cuda.set_device(rank)``, so the context current when a call arrives is not necessarily the one of the
call's tensors. :func:`activated` makes a device's primary context current for a block and restores the caller's
(push/pop: nothing changes when it is already current), per thread, as CUDA's contexts are.

Nothing here holds "the" device: the device of a call is the device of its arguments, read by
:mod:`ptx.arrays` (torch device, DLPack device, the pointer attribute of ``__cuda_array_interface__``).
:func:`current_device` (the device of the thread's current context, else 0, CUDA's default) is only for calls
that have no argument to ask (``gemm.get_num_sms()``, ``prebuild`` on a GPU machine).

All driver calls go through :func:`driver`, so CPU tests can replace the driver with a fake that has several
devices (tests/test_multi_device.py).
"""
from __future__ import annotations

import functools
import numbers
import os
import threading
from contextlib import contextmanager

_DRIVER = None  # cuda.bindings.driver, imported on first use; tests put a fake here
_contexts: dict[int, object] = {}  # device ordinal -> its retained primary CUcontext
_contexts_lock = threading.Lock()  # held only while a device's context is first retained

# Stream handles that name "the current context's default stream" (cuda.h): they belong to every device.
CU_STREAM_LEGACY, CU_STREAM_PER_THREAD = 0x1, 0x2


class DeviceMismatchError(ValueError):
    """A call's arguments, or its stream, are not all on one device."""


def driver():
    """The CUDA driver bindings (``cuda.bindings.driver``), or the fake a test installed."""
    global _DRIVER
    if _DRIVER is None:
        from cuda.bindings import driver as bindings
        _DRIVER = bindings
    return _DRIVER


def check(result, what: str):
    """cuda.bindings returns (err, *values): raise RuntimeError naming ``what`` on error; else the value(s)."""
    cuda = driver()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cuda.CUresult.CUDA_SUCCESS:
        _, message = cuda.cuGetErrorString(err)
        text = message.decode() if isinstance(message, bytes) else message
        raise RuntimeError(f"{what} failed: {getattr(err, 'name', err)} ({text})")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


@functools.lru_cache(maxsize=None)
def has_gpu() -> bool:
    """True when the CUDA driver initialises and sees a device (never true under Numba's simulator)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False
    try:
        cuda = driver()
    except Exception:
        return False
    try:
        (err,) = cuda.cuInit(0)
        if err != cuda.CUresult.CUDA_SUCCESS:
            return False
        err, count = cuda.cuDeviceGetCount()
        return err == cuda.CUresult.CUDA_SUCCESS and count > 0
    except Exception:
        return False


def device_count() -> int:
    """Visible CUDA devices (0 without a driver or under the simulator)."""
    if not has_gpu():
        return 0
    return int(check(driver().cuDeviceGetCount(), "cuDeviceGetCount"))


def compute_capability(device: int) -> tuple[int, int]:
    cuda = driver()
    attr = cuda.CUdevice_attribute
    major = check(cuda.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device), "major")
    minor = check(cuda.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device), "minor")
    return int(major), int(minor)


@functools.lru_cache(maxsize=None)
def is_hopper(device: int = 0) -> bool:
    """True when device ``device`` has compute capability 9.0 (sm_90a code runs only there). Tests ask about the
    device they run on (0 unless told otherwise); library code asks about the device of a call's tensors."""
    if not has_gpu() or device >= device_count():
        return False
    return compute_capability(device) == (9, 0)


def check_ordinal(device: int) -> int:
    """``device`` as an int, or a ValueError that says how many devices there are."""
    count = device_count()
    if not isinstance(device, int) or isinstance(device, bool) or not 0 <= device < max(count, 1):
        raise ValueError(f"device must be a CUDA device ordinal in 0..{max(count, 1) - 1} ({count} visible), got "
                         f"{device!r}")
    return device


def primary_context(device: int):
    """Device ``device``'s primary context (retained once per process, never released: it lives as long as
    torch's and Numba's own use of it)."""
    context = _contexts.get(device)
    if context is not None:
        return context
    with _contexts_lock:
        context = _contexts.get(device)
        if context is None:
            cuda = driver()
            check(cuda.cuInit(0), "cuInit")
            check_ordinal(device)
            handle = check(cuda.cuDeviceGet(device), f"cuDeviceGet({device})")
            context = check(cuda.cuDevicePrimaryCtxRetain(handle), f"retaining cuda:{device}'s primary context")
            _contexts[device] = context
    return context


def current_device() -> int:
    """The device of the calling thread's current context; 0 when none is current (CUDA's default device)."""
    cuda = driver()
    check(cuda.cuInit(0), "cuInit")
    if int(check(cuda.cuCtxGetCurrent(), "cuCtxGetCurrent")) == 0:
        return 0
    return int(check(cuda.cuCtxGetDevice(), "cuCtxGetDevice"))


@contextmanager
def activated(device: int):
    """Run the block with ``device``'s primary context current on this thread, then restore the caller's."""
    cuda = driver()
    context = primary_context(device)
    if int(check(cuda.cuCtxGetCurrent(), "cuCtxGetCurrent")) == int(context):
        yield context
        return
    check(cuda.cuCtxPushCurrent(context), f"making cuda:{device}'s context current")
    try:
        yield context
    finally:
        check(cuda.cuCtxPopCurrent(), "restoring the caller's context")


def ensure_context(device: int | None = None) -> int:
    """Make ``device``'s (default: the current device's) primary context current on this thread and leave it so,
    for scripts that then call the driver themselves; returns the ordinal. Library calls use :func:`activated`."""
    device = current_device() if device is None else device
    check(driver().cuCtxSetCurrent(primary_context(device)), f"making cuda:{device}'s context current")
    return device


def device_of_pointer(ptr: int) -> int:
    """The ordinal of the device whose memory ``ptr`` points into; -1 for host memory or an unknown pointer.
    Pinned host memory, which the GPU could reach over PCIe at a fraction of the speed, counts as host memory."""
    if not ptr:
        return -1
    cuda = driver()
    attributes = cuda.CUpointer_attribute
    err, kind = cuda.cuPointerGetAttribute(attributes.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
    if err != cuda.CUresult.CUDA_SUCCESS or int(kind) == int(cuda.CUmemorytype.CU_MEMORYTYPE_HOST):
        return -1
    err, ordinal = cuda.cuPointerGetAttribute(attributes.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
    return int(ordinal) if err == cuda.CUresult.CUDA_SUCCESS else -1


def stream_handle(stream) -> int:
    """None -> 0 (the legacy default stream); an int; cuda.core/Numba/torch stream objects."""
    if stream is None:
        return 0
    if isinstance(stream, numbers.Integral):  # numpy's integers too
        return int(stream)
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        return int(stream.cuda_stream)
    handle = getattr(stream, "handle", None)  # Numba: a CUstream, or a ctypes c_void_p (older bindings)
    if handle is not None:
        value = getattr(handle, "value", handle)
        return int(value or 0)
    raise TypeError(f"stream must be an int handle, a stream object or None, got {type(stream).__name__}")


def stream_device(handle: int) -> int | None:
    """The device a stream belongs to; None for the handles that mean "the current context's default stream"
    (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD), which belong to whatever device is current, and for a stream
    that is capturing a CUDA graph: the driver refuses to be asked then, and the refusal would invalidate the
    capture (a stream of another device still fails, at the launch, with the error :func:`launch_error` words)."""
    if handle in (0, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD):
        return None
    cuda = driver()
    stream = cuda.CUstream(handle)
    status = check(cuda.cuStreamIsCapturing(stream), "cuStreamIsCapturing")
    if int(status) != int(cuda.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE):
        return None
    if hasattr(cuda, "cuStreamGetDevice"):  # CUDA 12.8+
        return int(check(cuda.cuStreamGetDevice(stream), "cuStreamGetDevice"))
    context = int(check(cuda.cuStreamGetCtx(stream), "cuStreamGetCtx"))
    for device, retained in list(_contexts.items()):  # only contexts this process already holds: no new ones
        if int(retained) == context:
            return device
    raise DeviceMismatchError(f"stream {handle:#x} belongs to no primary context this process uses")


def _stream_mismatch(owner: str, device: int) -> str:
    return (f"stream: the stream belongs to {owner}, but the arguments are on cuda:{device}; pass a stream of "
            f"cuda:{device} (torch.cuda.current_stream({device}), or a stream created under "
            f"torch.cuda.device({device})), or stream=None for torch's current stream on cuda:{device}")


def check_stream_device(handle: int, device: int) -> None:
    """A clear error when stream ``handle`` is another device's than the call's (its arguments'). Without a GPU
    (the simulator's arrays) there is no stream to ask about."""
    if not has_gpu():
        return
    owner = stream_device(handle)
    if owner is not None and owner != device:
        raise DeviceMismatchError(_stream_mismatch(f"cuda:{owner}", device))


def check_stream_object(stream, device: int) -> None:
    """The same check for a stream object that knows its device (torch's ``.device``): no driver call, so it holds
    during graph capture too."""
    owner = getattr(stream, "device", None)
    index = getattr(owner, "index", None)
    if getattr(owner, "type", None) == "cuda" and index is not None and index != device:
        raise DeviceMismatchError(_stream_mismatch(f"cuda:{index}", device))


def check_stream_of(stream, device: int) -> None:
    """Either check for whatever a caller passes as ``stream=``: an object that knows its device (no driver call),
    else its handle (an int, or an object with a raw handle); None is the current device's default stream."""
    if stream is None:
        return
    if getattr(getattr(stream, "device", None), "type", None) == "cuda":
        check_stream_object(stream, device)
        return
    check_stream_device(stream_handle(stream), device)


def launch_error(what: str, device: int, result) -> RuntimeError:
    """The error of a failed launch, with the likely cause where the driver's code points at a stream or context
    of another device (the case :func:`stream_device` cannot ask about while a graph is being captured)."""
    cuda = driver()
    try:
        check(result, what)
    except RuntimeError as error:
        codes = {cuda.CUresult.CUDA_ERROR_INVALID_HANDLE, cuda.CUresult.CUDA_ERROR_INVALID_CONTEXT,
                 cuda.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED}
        if result[0] in codes:
            return DeviceMismatchError(f"{error}: is the stream one of cuda:{device}'s, where the arguments are?")
        return error
    return RuntimeError(f"{what} failed")


__all__ = ["has_gpu", "is_hopper", "device_count", "compute_capability", "primary_context", "current_device",
           "activated", "ensure_context", "device_of_pointer", "stream_device", "check_stream_device",
           "check_stream_object", "check_stream_of", "launch_error",
           "check_ordinal", "DeviceMismatchError", "driver", "check", "stream_handle"]
