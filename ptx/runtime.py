"""Load a cubin and launch its kernels through cuda-python: grid, block, cluster, big dynamic smem, tensor maps.

Loading uses cuda.core (``ObjectCode.from_cubin`` + ``get_kernel``). Launching goes straight to the
driver's ``cuLaunchKernelEx`` with a ``void*[]`` of parameter pointers built with ctypes: one path for every
launch, which passes a 128-byte CUtensorMap by value, sets the cluster-dimension attribute, and is legal
inside CUDA-graph stream capture. Each argument is packed by the PTX type of its parameter, as the
:class:`ptx.builder.PtxModule` the cubin was assembled from records it, so a Python int for a ``.u32`` parameter is
packed as 4 bytes.

Grid is counted in blocks (as in CUDA C's ``<<<grid, block>>>``), also with a cluster: it must then be a
multiple of the cluster shape. Nothing here touches the GPU at import time.

Devices: a cubin is loaded once per process as a context-independent library (``cuLibraryLoadData``), and each
device gets its own function handle (and raised shared-memory limit) the first time a launch there needs it. Every
launch names its device (``device=``; default: the calling thread's current device) and runs with that device's
primary context current, restoring the caller's afterwards (:func:`ptx.device.activated`); a stream of another
device is a :class:`ptx.device.DeviceMismatchError`, not a driver fault.
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from ptx.arrays import is_torch_tensor
from ptx import device as devices
from ptx.arrays import as_device_view
from ptx.compile import Cubin
from ptx.device import (activated, check_stream_device, current_device, ensure_context,  # noqa: F401 (re-exported)
                        stream_handle)
from ptx.tensor_maps import TENSOR_MAP_BYTES, TensorMap

DEFAULT_SHARED_LIMIT = 48 * 1024  # dynamic smem above this needs the kernel attribute raised first


def _check(result, what: str):
    return devices.check(result, what)


# -- parameters --------------------------------------------------------------------------------------
_CTYPES = {
    "u64": ctypes.c_uint64, "s64": ctypes.c_int64, "b64": ctypes.c_uint64,
    "u32": ctypes.c_uint32, "s32": ctypes.c_int32, "b32": ctypes.c_uint32,
    "u16": ctypes.c_uint16, "s16": ctypes.c_int16, "b16": ctypes.c_uint16,
    "u8": ctypes.c_uint8, "s8": ctypes.c_int8, "b8": ctypes.c_uint8,
    "f32": ctypes.c_float, "f64": ctypes.c_double,
}


def kernel_params(ptx: str, name: str) -> list[tuple[str, int]]:
    """[(ptx type, array length or 0)] of kernel ``name``'s parameters, in order, as the builder recorded them."""
    kernels = getattr(ptx, "kernels", None)
    if kernels is None:
        raise TypeError(f"kernel {name}: its PTX is plain text, not a ptx.builder.PtxModule, so its parameter types "
                        "are unknown: build it with ptx.builder.module, or wrap it in PtxModule(text, kernels={name: "
                        "[(ptx type, array length or 0), ...]}) before compile_ptx")
    if name not in kernels:
        raise KeyError(f"no .entry {name} in the PTX (it has {', '.join(sorted(kernels)) or 'none'})")
    return list(kernels[name])


def device_pointer(obj) -> int:
    """The device address of ``obj``: an int, a TensorMap-free array object (torch, CAI, DLPack), a Buffer."""
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if hasattr(obj, "data_ptr") and is_torch_tensor(obj):
        if not obj.is_cuda:
            raise TypeError("kernel argument: a torch tensor on the CPU; move it to the GPU first")
        return int(obj.data_ptr())
    if hasattr(obj, "__cuda_array_interface__"):
        return int(obj.__cuda_array_interface__["data"][0])
    if isinstance(obj, np.ndarray):
        raise TypeError("kernel argument: a NumPy array lives in host memory; copy it to the GPU first")
    handle = getattr(obj, "handle", None)  # cuda.core Buffer
    if handle is not None and hasattr(obj, "size"):
        return int(handle)
    view = as_device_view(obj)
    if not view.on_device:
        raise TypeError(f"kernel argument: {type(obj).__name__} is not in device memory")
    return view.ptr


def pack_args(params: list[tuple[str, int]] | None, args) -> tuple[list, ctypes.Array]:
    """ctypes storage for each argument and the ``void*[]`` of their addresses that cuLaunchKernelEx reads."""
    args = list(args)
    if params is not None and len(params) != len(args):
        raise TypeError(f"the kernel takes {len(params)} arguments, got {len(args)}")
    storage = []
    for index, value in enumerate(args):
        ptx_type, length = params[index] if params is not None else (_guess_type(value), 0)
        if isinstance(value, TensorMap) or length:
            data = value.data if isinstance(value, TensorMap) else bytes(value)
            expected = length or TENSOR_MAP_BYTES
            if len(data) != expected:
                raise TypeError(f"argument {index}: expected {expected} bytes, got {len(data)}")
            storage.append((ctypes.c_ubyte * expected).from_buffer_copy(data))
            continue
        if ptx_type not in _CTYPES:
            raise TypeError(f"argument {index}: unsupported PTX parameter type .{ptx_type}")
        if ptx_type.startswith("f"):
            storage.append(_CTYPES[ptx_type](float(value)))
        else:
            number = device_pointer(value) if ptx_type in ("u64", "b64", "s64") else int(value)
            storage.append(_CTYPES[ptx_type](number))
    pointers = (ctypes.c_void_p * max(len(storage), 1))(*[ctypes.addressof(s) for s in storage])
    return storage, pointers


class ArgumentPacker:
    """pack_args for one kernel signature, with the ctypes storage built once per thread and refilled per call:
    a launch then costs a few memmoves and integer stores instead of allocating every argument anew (the driver
    copies the values during cuLaunchKernelEx, so reusing the buffers after it returns is safe)."""

    def __init__(self, params: list[tuple[str, int]]):
        self.params = params
        self._local = threading.local()

    def _buffers(self):
        buffers = getattr(self._local, "buffers", None)
        if buffers is None:
            storage = [(ctypes.c_ubyte * (length or TENSOR_MAP_BYTES))() if length else _CTYPES[kind]()
                       for kind, length in self.params]
            pointers = (ctypes.c_void_p * max(len(storage), 1))(*[ctypes.addressof(x) for x in storage])
            buffers = self._local.buffers = (storage, pointers)
        return buffers

    def pack(self, args) -> ctypes.Array:
        if len(args) != len(self.params):
            raise TypeError(f"the kernel takes {len(self.params)} arguments, got {len(args)}")
        storage, pointers = self._buffers()
        for slot, (kind, length), value in zip(storage, self.params, args):
            if length:
                data = value.data if isinstance(value, TensorMap) else bytes(value)
                if len(data) != length:
                    raise TypeError(f"a {length}-byte parameter got {len(data)} bytes")
                ctypes.memmove(ctypes.addressof(slot), data, length)
            elif kind.startswith("f"):
                slot.value = float(value)
            elif kind in ("u64", "b64", "s64") and not isinstance(value, (int, np.integer)):
                slot.value = device_pointer(value)
            else:
                slot.value = int(value)
        return pointers


def _guess_type(value) -> str:
    """Without PTX, infer the parameter type from the Python value (numpy scalars keep their width)."""
    if isinstance(value, np.generic):
        return {"f": "f", "u": "u", "i": "s"}[value.dtype.kind] + str(value.dtype.itemsize * 8)
    if isinstance(value, float):
        return "f32"
    return "u64"


def _hashable(value):
    """A launch dimension (an int, a sequence of ints, or None) as a dict key."""
    return value if value is None or isinstance(value, (int, np.integer)) else tuple(value)


def _dims(value, what: str) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if not 1 <= len(dims) <= 3 or any(int(d) < 1 for d in dims):
        raise ValueError(f"{what} must be a positive int or a tuple of 1-3 positive ints, got {value!r}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


def launch_config(grid, block, *, shared_bytes: int = 0, cluster=None, stream=None, programmatic: bool = False):
    """The driver's CUlaunchConfig: grid in blocks, block in threads, dynamic smem, cluster attribute, stream.
    ``programmatic``: programmatic dependent launch (CUDA driver API, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_
    SERIALIZATION): this grid may start while the previous one on the stream finishes; the kernel itself must
    ``griddepcontrol.wait`` before touching memory that grid writes (ptx.vocab.barriers.grid_dependency_wait)."""
    driver = devices.driver()
    grid, block = _dims(grid, "grid"), _dims(block, "block")
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = int(shared_bytes)
    config.hStream = driver.CUstream(stream_handle(stream))
    attributes = []
    if cluster is not None:
        cluster = _dims(cluster, "cluster")
        if any(g % c for g, c in zip(grid, cluster)):
            raise ValueError(f"grid {grid} (in blocks) must be a multiple of the cluster shape {cluster}")
        attribute = driver.CUlaunchAttribute()
        attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attribute.value.clusterDim.x, attribute.value.clusterDim.y, attribute.value.clusterDim.z = cluster
        attributes.append(attribute)
    if programmatic:
        attribute = driver.CUlaunchAttribute()
        attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attribute.value.programmaticStreamSerializationAllowed = 1
        attributes.append(attribute)
    if attributes:
        config.attrs = attributes
        config.numAttrs = len(attributes)
    return config


# -- kernels -----------------------------------------------------------------------------------------
def _load(image: bytes, name: str):
    """(CUkernel, the object keeping its library loaded): through cuda.core; the driver's cuLibrary* calls
    if that fails. Both load a context-independent library: no device is chosen here."""
    driver = devices.driver()
    try:
        from cuda.core import ObjectCode
        code = ObjectCode.from_cubin(image)
        kernel = code.get_kernel(name)
        return driver.CUkernel(int(kernel.handle)), (code, kernel)
    except Exception as core_error:
        try:
            library = _check(driver.cuLibraryLoadData(image, None, None, 0, None, None, 0), "cuLibraryLoadData")
            kernel = _check(driver.cuLibraryGetKernel(library, name.encode()), f"cuLibraryGetKernel({name})")
        except Exception as driver_error:
            raise RuntimeError(f"could not load kernel {name!r}: cuda.core said {core_error!r}; "
                               f"the driver said {driver_error!r}") from driver_error
        return kernel, library


class Kernel:
    """One kernel of a loaded cubin, launchable on any device. Launch with :meth:`launch`."""

    def __init__(self, cubin: Cubin, name: str):
        self.name = name
        self.cubin = cubin
        self.params = kernel_params(cubin.ptx, name)
        self._packer = ArgumentPacker(self.params) if self.params and all(
            length or kind in _CTYPES for kind, length in self.params) else None
        devices.check(devices.driver().cuInit(0), "cuInit")
        self._kernel_handle, self._owner = _load(cubin.image, name)
        self._functions: dict[int, object] = {}  # device -> CUfunction in its primary context
        self._shared_limits: dict[int, int] = {}  # device -> dynamic shared memory the function is allowed
        self._limit_lock = threading.Lock()  # held only while raising that limit (once per device and size)
        self._configs: dict = {}  # CUlaunchConfig by (device, grid, block, smem, cluster, stream): built once

    def function(self, device: int, shared_bytes: int = 0):
        """This kernel's function handle on ``device`` (loaded into that device's context on first use), allowed
        ``shared_bytes`` of dynamic shared memory. Call with ``device``'s context current."""
        driver = devices.driver()
        function = self._functions.get(device)
        if function is None:  # two threads may both get here: the driver returns the same handle to both
            function = _check(driver.cuKernelGetFunction(self._kernel_handle), f"loading {self.name} on cuda:{device}")
            self._functions[device] = function
        if shared_bytes > self._shared_limits.get(device, DEFAULT_SHARED_LIMIT):
            with self._limit_lock:  # two threads raising it at once must leave the larger limit set and recorded
                if shared_bytes > self._shared_limits.get(device, DEFAULT_SHARED_LIMIT):
                    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                    _check(driver.cuFuncSetAttribute(function, attribute, shared_bytes),
                           f"raising {self.name}'s dynamic shared memory to {shared_bytes} bytes on cuda:{device}")
                    self._shared_limits[device] = shared_bytes
        return function

    def launch(self, grid, block, args, *, shared_bytes: int = 0, cluster=None, stream=None,
               device: int | None = None, programmatic: bool = False) -> None:
        """Launch on ``device`` (default: the calling thread's current device), on ``stream`` (of that device)."""
        driver = devices.driver()
        device = current_device() if device is None else device
        handle = stream_handle(stream)
        key = (device, _hashable(grid), _hashable(block), int(shared_bytes), _hashable(cluster), handle, programmatic)
        config = self._configs.get(key)
        if config is None:
            check_stream_device(handle, device)
            if len(self._configs) > 256:  # a long-running process with ever new shapes or streams
                self._configs.clear()
            config = self._configs[key] = launch_config(grid, block, shared_bytes=shared_bytes, cluster=cluster,
                                                        stream=handle, programmatic=programmatic)
        storage = None
        if self._packer is not None:
            pointers = self._packer.pack(list(args))
        else:
            storage, pointers = pack_args(self.params, args)
        with activated(device):
            function = self.function(device, int(shared_bytes))
            result = driver.cuLaunchKernelEx(config, function, ctypes.addressof(pointers), 0)
        if result[0] != driver.CUresult.CUDA_SUCCESS:
            raise devices.launch_error(f"launching {self.name} on cuda:{device}", device, result)
        del storage  # the driver has copied the parameter values by now

    def prepare(self, grid, block, args, *, shared_bytes: int = 0, cluster=None,
                device: int | None = None, programmatic: bool = False) -> "PreparedLaunch":
        """A launch on ``device`` with every argument fixed, to be issued on any of that device's streams: the
        serving hot path (see :class:`PreparedLaunch`)."""
        device = current_device() if device is None else device
        storage, pointers = pack_args(self.params, args)
        with activated(device) as context:
            function = self.function(device, int(shared_bytes))
        return PreparedLaunch(self, function, storage, pointers,
                              (grid, block, int(shared_bytes), cluster, programmatic), device, context)

    def __repr__(self):
        return f"Kernel({self.name!r}, params={self.params})"


class PreparedLaunch:
    """One kernel with its arguments packed once (tensor maps included), bound to one device, its CUlaunchConfig
    built once per stream: calling it is one ``cuLaunchKernelEx``, 3.2-5.3 us of host time on H200 machines
    (python -m gemm bench host; through ctypes with every argument a prebuilt pointer it measured the same, 3.31
    against 3.24 us on one), plus a ``cuCtxGetCurrent`` (and a push/pop when the caller's current context is another
    device's). :meth:`launch_arguments` gives what it passes the driver, for timing that call alone.
    Arguments and shape are frozen, so a caller keys these by everything the arguments were derived from
    (device, pointers, shapes, strides, dtypes). Safe to share between threads: nothing is written after
    construction except the per-stream config cache (a dict insert); contexts are per thread."""

    def __init__(self, kernel: Kernel, function, storage, pointers, shape, device: int, context):
        driver = devices.driver()
        self.kernel, self._function, self._storage, self._pointers = kernel, function, storage, pointers
        self.device = device
        self._context, self._context_id = context, int(context)
        self._address = ctypes.addressof(pointers)
        self._shape = shape
        self._configs: dict[int, object] = {}
        self._launch, self._success = driver.cuLaunchKernelEx, driver.CUresult.CUDA_SUCCESS
        self._current, self._push, self._pop = driver.cuCtxGetCurrent, driver.cuCtxPushCurrent, driver.cuCtxPopCurrent

    def launch_arguments(self, stream: int = 0) -> tuple:
        """(CUlaunchConfig, CUfunction, address of the packed kernel parameters) for ``stream``: what
        ``cuLaunchKernelEx`` receives (``python -m gemm bench host`` times the driver call alone with them)."""
        self(stream)  # builds the stream's config (and launches once)
        return self._configs[stream], self._function, self._address

    def __call__(self, stream: int = 0) -> None:
        config = self._configs.get(stream)
        if config is None:
            check_stream_device(stream, self.device)
            grid, block, shared_bytes, cluster, programmatic = self._shape
            config = self._configs[stream] = launch_config(grid, block, shared_bytes=shared_bytes, cluster=cluster,
                                                           stream=stream, programmatic=programmatic)
        if int(self._current()[1]) == self._context_id:
            result = self._launch(config, self._function, self._address, 0)
        else:  # the caller's thread has another device (or none) current: run in ours, then give it back
            _check(self._push(self._context), f"making cuda:{self.device}'s context current")
            try:
                result = self._launch(config, self._function, self._address, 0)
            finally:
                _check(self._pop(), "restoring the caller's context")
        if result[0] != self._success:
            raise devices.launch_error(f"launching {self.kernel.name} on cuda:{self.device}", self.device, result)


def copy_device_async(dst: int, src: int, nbytes: int, stream=None, *, device: int | None = None) -> None:
    """Device-to-device copy of ``nbytes`` on ``stream`` (cuMemcpyDtoDAsync) in ``device``'s context (default: the
    device of ``dst``): no host sync, graph-capturable."""
    driver = devices.driver()
    device = devices.device_of_pointer(int(dst)) if device is None else device
    handle = stream_handle(stream)
    check_stream_device(handle, device)
    with activated(device):
        _check(driver.cuMemcpyDtoDAsync(int(dst), int(src), int(nbytes), driver.CUstream(handle)),
               "cuMemcpyDtoDAsync")


_KERNELS: dict[tuple[str, str], Kernel] = {}
_KERNELS_LOCK = threading.Lock()


def load_kernel(cubin: Cubin, name: str) -> Kernel:
    """The kernel ``name`` from ``cubin`` (loaded once per cubin image and name, for every device)."""
    key = (cubin.key, name)
    kernel = _KERNELS.get(key)
    if kernel is None:
        kernel = Kernel(cubin, name)  # outside the lock: loading takes a while; a racing duplicate is dropped
        with _KERNELS_LOCK:
            kernel = _KERNELS.setdefault(key, kernel)
    return kernel


def synchronize(stream=None, *, device: int | None = None) -> None:
    """Wait for ``stream`` (None: all of ``device``'s work; default device: the current one)."""
    driver = devices.driver()
    device = current_device() if device is None else device
    handle = stream_handle(stream)
    with activated(device):
        if handle:
            _check(driver.cuStreamSynchronize(driver.CUstream(handle)), "cuStreamSynchronize")
        else:
            _check(driver.cuCtxSynchronize(), "cuCtxSynchronize")


__all__ = ["load_kernel", "Kernel", "PreparedLaunch", "copy_device_async", "ensure_context", "synchronize",
           "kernel_params", "pack_args", "ArgumentPacker", "launch_config", "device_pointer", "stream_handle"]
