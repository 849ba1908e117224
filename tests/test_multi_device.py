"""Every GPU, not only GPU 0: a call runs on its tensors' device, in that device's context, with that device's facts.

On the CPU the driver is a fake with three devices of different SM counts (:class:`FakeDriver`): per-thread context
stacks as CUDA keeps them, pointers that say which device they belong to, streams that belong to one device, and a
launch that fails as the real driver does when the function is not of the current context. The library's own code
runs unchanged above it: validation, heuristics, the kernel cache, the packing of arguments, the launch.
"""
import threading

import numpy as np
import pytest

import gemm
from gemm import heuristics
from gemm.fp8 import align
from gemm.testing.problems import random_problem
from ptx import device as devices
from ptx import runtime
from ptx.device import DeviceMismatchError
from ptx.tensor_maps import TensorMap

SM_COUNTS = (132, 114, 78)  # three devices, so facts that came from the wrong one show
BASE = 1 << 40  # device d's memory lives at [(d + 1) * BASE, (d + 2) * BASE)


class FakeDriver:
    """Just enough of cuda.bindings.driver for devices, contexts, streams and launches; types come from the real
    module (they need no GPU)."""

    def __init__(self, real, sm_counts=SM_COUNTS):
        self._real, self.sm_counts = real, sm_counts
        self.CUresult = real.CUresult
        self._local = threading.local()
        self.launches: list[dict] = []  # what each cuLaunchKernelEx saw
        self.copies: list[dict] = []
        self.functions: dict[int, int] = {}  # function handle -> device it was loaded for
        self.streams: dict[int, int] = {}  # stream handle -> device
        self.on_launch = None  # a test's hook, called inside the launch
        self.shared_limits: dict[int, int] = {}  # function handle -> its raised dynamic shared memory limit
        self.capturing: set[int] = set()  # stream handles capturing a graph
        self.capture_broken = False

    def __getattr__(self, name):  # types and enums; any driver call not faked here fails loudly
        if name.startswith("cu"):
            raise AttributeError(f"FakeDriver has no {name}")
        return getattr(self._real, name)

    ok = property(lambda self: self._real.CUresult.CUDA_SUCCESS)

    @property
    def stack(self) -> list:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def context(self, device: int):
        return self._real.CUcontext(0x1000 + device)

    def current(self) -> int | None:
        return int(self.stack[-1]) - 0x1000 if self.stack else None

    def new_stream(self, device: int) -> int:
        handle = 0x5000 + len(self.streams)
        self.streams[handle] = device
        return handle

    # -- devices and contexts
    def cuInit(self, flags): return (self.ok,)
    def cuDeviceGetCount(self): return (self.ok, len(self.sm_counts))
    def cuDeviceGet(self, ordinal): return (self.ok, ordinal)
    def cuDevicePrimaryCtxRetain(self, device): return (self.ok, self.context(device))
    def cuGetErrorString(self, err): return (self.ok, b"fake driver error")

    def cuCtxGetCurrent(self):
        return (self.ok, self.stack[-1] if self.stack else self._real.CUcontext(0))

    def cuCtxGetDevice(self):
        if not self.stack:
            return (self.CUresult.CUDA_ERROR_INVALID_CONTEXT, 0)
        return (self.ok, self.current())

    def cuCtxSetCurrent(self, context):
        if self.stack:
            self.stack[-1] = context
        else:
            self.stack.append(context)
        return (self.ok,)

    def cuCtxPushCurrent(self, context):
        self.stack.append(context)
        return (self.ok,)

    def cuCtxPopCurrent(self):
        return (self.ok, self.stack.pop())

    def cuDeviceGetAttribute(self, attribute, device):
        attr = self._real.CUdevice_attribute
        values = {attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: self.sm_counts[device],
                  attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 232448,
                  attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: (50 + 10 * device) << 20,
                  attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 9,
                  attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 0}
        return (self.ok, values[attribute])

    def cuDeviceGetName(self, length, device):
        return (self.ok, f"Fake H100 #{device}".encode() + b"\0")

    # -- memory and streams
    def cuPointerGetAttribute(self, attribute, ptr):
        device = int(ptr) // BASE - 1
        if not 0 <= device < len(self.sm_counts):
            return (self.CUresult.CUDA_ERROR_INVALID_VALUE, 0)
        kinds = self._real.CUpointer_attribute
        if attribute == kinds.CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            return (self.ok, int(self._real.CUmemorytype.CU_MEMORYTYPE_DEVICE))
        return (self.ok, device)

    def cuStreamIsCapturing(self, stream):
        status = self._real.CUstreamCaptureStatus
        return (self.ok, status.CU_STREAM_CAPTURE_STATUS_ACTIVE if int(stream) in self.capturing
                else status.CU_STREAM_CAPTURE_STATUS_NONE)

    def cuStreamGetDevice(self, stream):
        if int(stream) in self.capturing:  # the real driver refuses, and the refusal invalidates the capture
            self.capture_broken = True
            return (self.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, 0)
        return (self.ok, self.streams[int(stream)])

    def cuMemcpyDtoDAsync(self, dst, src, size, stream):
        self.copies.append({"device": self.current(), "dst": dst, "stream": int(stream)})
        return (self.ok,)

    # -- kernels
    def cuKernelGetFunction(self, kernel):
        handle = 0x9000 + len(self.functions)
        self.functions[handle] = self.current()
        return (self.ok, self._real.CUfunction(handle))

    def cuFuncSetAttribute(self, function, attribute, value):
        self.shared_limits[int(function)] = value  # per function, so per device: each device's must be raised
        return (self.ok,)

    def cuLaunchKernelEx(self, config, function, params, extra):
        owner = self.functions[int(function)]
        if owner != self.current():  # the real driver: the function is not of the current context
            return (self.CUresult.CUDA_ERROR_INVALID_HANDLE,)
        if config.sharedMemBytes > self.shared_limits.get(int(function), 48 * 1024):
            return (self.CUresult.CUDA_ERROR_INVALID_VALUE,)
        stream = int(config.hStream)
        if stream in self.streams and self.streams[stream] != owner:
            return (self.CUresult.CUDA_ERROR_INVALID_HANDLE,)
        self.launches.append({"device": owner, "grid": config.gridDimX, "stream": stream,
                              "thread": threading.get_ident()})
        if self.on_launch:
            self.on_launch()
        return (self.ok,)


class FakeDeviceArray:
    """A host array posing as device ``device``'s memory through __cuda_array_interface__ (pointer attributes tell
    the device, as for CuPy and Numba arrays)."""
    _next = {}

    def __init__(self, host: np.ndarray, device: int):
        offset = FakeDeviceArray._next.get(device, 0)
        FakeDeviceArray._next[device] = offset + align(host.nbytes + 256, 256)
        self.host, self.ptr = host, (device + 1) * BASE + offset
        strides = None if host.flags.c_contiguous else host.strides
        self.__cuda_array_interface__ = {"shape": host.shape, "typestr": host.dtype.str, "data": (self.ptr, False),
                                         "strides": strides, "version": 3}


@pytest.fixture
def fake_driver(monkeypatch):
    from cuda.bindings import driver as real
    fake = FakeDriver(real)
    monkeypatch.setattr(devices, "_DRIVER", fake)
    monkeypatch.setattr(devices, "has_gpu", lambda: True)
    monkeypatch.setattr(devices, "_contexts", {})
    monkeypatch.setattr(runtime, "_load", lambda image, name: (real.CUkernel(0x77), None))
    monkeypatch.setattr(runtime, "_KERNELS", {})
    monkeypatch.setattr(gemm.dispatch, "PREPARED", {})
    # Tensor maps are encoded by the driver from real pointers: here they only need to be 128 bytes.
    monkeypatch.setattr("gemm.kernel.launch.tensor_maps", lambda config, pointers, *rest: {
        name: TensorMap(bytes(128), np.dtype(np.uint8), (1, 1), (1, 16), 0)
        for name in ("tmap_a", "tmap_b", "tmap_sa", "tmap_d")[:4 if config.epilogue == "tma" else 3]})
    from gemm.kernel import launch
    caches = (heuristics._device_facts, devices.is_hopper, launch.kernel)  # loaded kernels hold fake handles
    for cache in caches:
        cache.cache_clear()
    yield fake
    for cache in caches:
        cache.cache_clear()


def dense_problem(rng, device, m=200, n=256, k=512, devices_of=None):
    """fp8_gemm_nt's arguments on ``device`` (or per argument: ``devices_of`` = {name: device})."""
    a, sa, b, sb = random_problem(m, n, k, rng)
    storage = np.zeros((k // 128, align(m, 4)), np.float32)
    storage[:, :m] = sa.T
    host = {"a": a.view(np.uint8), "sa": storage[:, :m].T, "b": b.view(np.uint8), "sb": sb,
            "d": np.zeros((m, n), np.uint16)}
    where = {name: (devices_of or {}).get(name, device) for name in host}
    return {name: FakeDeviceArray(value, where[name]) for name, value in host.items()}


def call(args, **kwargs):
    gemm.fp8_gemm_nt((args["a"], args["sa"]), (args["b"], args["sb"]), args["d"], **kwargs)


def test_a_call_runs_on_its_tensors_device_and_gives_the_callers_context_back(fake_driver, rng):
    fake_driver.cuCtxSetCurrent(fake_driver.context(0))  # the caller works on cuda:0 ...
    call(dense_problem(rng, device=1))  # ... and hands us tensors on cuda:1
    (launch,) = fake_driver.launches
    assert launch["device"] == 1
    assert fake_driver.current() == 0 and len(fake_driver.stack) == 1, "the caller's context must be restored"
    assert set(fake_driver.functions.values()) == {1}, "the kernel is loaded into cuda:1's context only"


def test_heuristics_read_the_facts_of_the_calls_device(fake_driver, rng):
    """cuda:2 has 78 SMs: a problem of more tiles than that gets a persistent grid of 78 there, 132 on cuda:0."""
    for device in (0, 2):
        call(dense_problem(rng, device=device, m=4096, n=4096, k=512))
    grids = {launch["device"]: launch["grid"] for launch in fake_driver.launches}
    assert grids == {0: 132, 2: 78}
    assert heuristics.device_facts(2) == heuristics.DeviceFacts(78, 232448, "Fake H100 #2", 70 << 20)


def test_each_device_loads_the_kernel_once(fake_driver, rng):
    for device in (0, 1, 0, 1, 2):
        call(dense_problem(rng, device=device))
    assert sorted(fake_driver.functions.values()) == [0, 1, 2]
    assert len(runtime._KERNELS) == 1, "one cubin, loaded once, serves every device"


def test_no_current_context_is_left_behind(fake_driver, rng):
    call(dense_problem(rng, device=2))
    assert fake_driver.stack == [], "a thread with no current context must have none afterwards"


def test_arguments_on_two_devices_name_every_device(fake_driver, rng):
    args = dense_problem(rng, device=0, devices_of={"b": 1, "sb": 1})
    with pytest.raises(DeviceMismatchError) as info:
        call(args)
    text = str(info.value)
    for words in ("a on cuda:0", "sa on cuda:0", "b on cuda:1", "sb on cuda:1", "d on cuda:0", "one CUDA device"):
        assert words in text
    assert isinstance(info.value, ValueError) and not fake_driver.launches


def test_a_stream_of_another_device_is_refused(fake_driver, rng):
    stream = fake_driver.new_stream(0)
    with pytest.raises(DeviceMismatchError, match=r"stream: the stream belongs to cuda:0, but the arguments are on "
                                                  r"cuda:1; pass a stream of cuda:1"):
        call(dense_problem(rng, device=1), stream=stream)
    assert not fake_driver.launches
    call(dense_problem(rng, device=1), stream=fake_driver.new_stream(1))
    assert [launch["device"] for launch in fake_driver.launches] == [1]


def test_accumulate_copies_c_on_the_calls_device(fake_driver, rng):
    args = dense_problem(rng, device=1, n=256)
    d = FakeDeviceArray(np.zeros((200, 256), np.float32), 1)
    c = FakeDeviceArray(np.zeros((200, 256), np.float32), 1)
    gemm.fp8_gemm_nt((args["a"], args["sa"]), (args["b"], args["sb"]), d, c=c)
    assert [copy["device"] for copy in fake_driver.copies] == [1]
    assert [launch["device"] for launch in fake_driver.launches] == [1]


def test_grouped_gemms_follow_their_tensors(fake_driver, rng):
    groups, m, n, k = 2, 256, 256, 512
    a, sa, _, _ = random_problem(m, n, k, rng)
    storage = np.zeros((k // 128, m), np.float32)
    storage[:, :] = sa.T
    b = np.stack([random_problem(1, n, k, rng)[2] for _ in range(groups)]).view(np.uint8)
    sb = np.ones((groups, n // 128, k // 128), np.float32)
    indices = np.repeat(np.arange(groups, dtype=np.int32), m // groups)
    on = lambda x: FakeDeviceArray(x, 2)  # noqa: E731
    gemm.m_grouped_fp8_gemm_nt_contiguous((on(a.view(np.uint8)), on(storage.T)), (on(b), on(sb)),
                                          on(np.zeros((m, n), np.uint16)), on(indices))
    masked_groups, m_max, wide = 8, 512, 1024  # 8 x 4 x 8 = 256 tiles of 128 x 128: more than cuda:2's 78 SMs
    masked_sa = np.zeros((masked_groups, k // 128, m_max), np.float32).transpose(0, 2, 1)
    wide_b = np.zeros((masked_groups, wide, k), np.uint8)
    wide_sb = np.ones((masked_groups, wide // 128, k // 128), np.float32)
    gemm.m_grouped_fp8_gemm_nt_masked((on(np.zeros((masked_groups, m_max, k), np.uint8)), on(masked_sa)),
                                      (on(wide_b), on(wide_sb)), on(np.zeros((masked_groups, m_max, wide), np.uint16)),
                                      on(np.full(masked_groups, m_max, np.int32)), m_max)
    assert [launch["device"] for launch in fake_driver.launches] == [2, 2]
    assert fake_driver.launches[1]["grid"] == SM_COUNTS[2], "the persistent grid is cuda:2's SM count"


def test_prepared_launch_pushes_its_device_from_any_thread(fake_driver):
    from gemm.kernel.launch import kernel
    from gemm.heuristics import choose_config
    config = choose_config(128, 256, 512)
    prepared = kernel(config, 256, 512).prepare(1, config.threads, [bytes(128)] * 4 + [BASE, BASE, 128],
                                                shared_bytes=1024, device=1)
    fake_driver.cuCtxSetCurrent(fake_driver.context(0))
    prepared(0)
    assert fake_driver.launches[-1]["device"] == 1 and fake_driver.current() == 0
    fake_driver.cuCtxSetCurrent(fake_driver.context(1))  # already current: no push
    prepared(fake_driver.new_stream(1))
    assert fake_driver.launches[-1]["device"] == 1 and fake_driver.stack == [fake_driver.context(1)]
    with pytest.raises(DeviceMismatchError, match="belongs to cuda:2"):
        prepared(fake_driver.new_stream(2))
    stream = fake_driver.new_stream(1)  # what the host bench hands cuLaunchKernelEx alone: this stream's config
    config_of_stream, function, address = prepared.launch_arguments(stream)
    assert int(config_of_stream.hStream) == stream and fake_driver.launches[-1]["stream"] == stream
    assert address == prepared._address and function is prepared._function


def test_two_threads_on_two_devices_launch_at_once(fake_driver, rng):
    """Both launches must be inside the driver at the same moment (a barrier in the fake launch): a lock held
    across the launch would deadlock here, and the barrier's timeout fails the test instead."""
    problems = {device: dense_problem(rng, device=device) for device in (0, 1)}
    for device in (0, 1):  # first calls build and cache the kernel; the timed part is the steady state
        call(problems[device])
    inside = threading.Barrier(2, timeout=10)
    fake_driver.on_launch = inside.wait
    errors = []

    def work(device):
        try:
            fake_driver.cuCtxSetCurrent(fake_driver.context(1 - device))  # each thread has the *other* GPU current
            for _ in range(20):
                call(problems[device])
            assert fake_driver.current() == 1 - device
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
            inside.abort()

    threads = [threading.Thread(target=work, args=(device,)) for device in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    steady = fake_driver.launches[2:]
    assert len(steady) == 40
    by_thread = {}
    for launch in steady:
        by_thread.setdefault(launch["thread"], set()).add(launch["device"])
    assert sorted(map(sorted, by_thread.values())) == [[0], [1]], "a thread crossed into the other's device"


def test_set_num_sms_is_process_wide_and_caps_every_device(fake_driver):
    fake_driver.cuCtxSetCurrent(fake_driver.context(0))
    try:
        gemm.set_num_sms(100)
        assert heuristics.device_facts(0).sm_count == 100
        assert heuristics.device_facts(2).sm_count == 78, "a device with fewer SMs than the cap keeps its own"
        assert gemm.get_num_sms() == 100 and gemm.get_num_sms(2) == 78
        with pytest.raises(ValueError, match=r"count must be in 1\.\.132"):
            gemm.set_num_sms(133)
    finally:
        gemm.set_num_sms(0)
    fake_driver.cuCtxSetCurrent(fake_driver.context(1))
    assert gemm.get_num_sms() == 114, "the default device is the current one"


def test_prebuild_targets_the_named_or_current_device(fake_driver):
    from gemm.prebuild import target_device
    fake_driver.cuCtxSetCurrent(fake_driver.context(2))
    assert target_device().sm_count == 78
    assert target_device(device=1).sm_count == 114
    assert target_device(num_sms=64, device=0).sm_count == 64


def test_a_device_ordinal_out_of_range_is_named(fake_driver):
    with pytest.raises(ValueError, match=r"device must be a CUDA device ordinal in 0\.\.2 \(3 visible\), got 5"):
        heuristics.device_facts(5)


def test_pinned_host_memory_is_not_device_memory(fake_driver, monkeypatch):
    real = fake_driver.cuPointerGetAttribute
    host_type = int(fake_driver._real.CUmemorytype.CU_MEMORYTYPE_HOST)

    def pinned(attribute, ptr):
        if attribute == fake_driver._real.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            return (fake_driver.ok, host_type)
        return real(attribute, ptr)
    monkeypatch.setattr(fake_driver, "cuPointerGetAttribute", pinned)
    assert devices.device_of_pointer(BASE + 4096) == -1


def test_a_stream_object_that_knows_its_device_is_checked_without_the_driver(fake_driver, rng):
    """torch streams carry .device: checked without a driver call, so it holds while a graph is being captured."""
    class Device:
        type, index = "cuda", 0

    class TorchLikeStream:
        device = Device()
        cuda_stream = 0

    with pytest.raises(DeviceMismatchError, match="stream: the stream belongs to cuda:0, but the arguments are on "
                                                  "cuda:2"):
        call(dense_problem(rng, device=2), stream=TorchLikeStream())
    assert not fake_driver.launches


def test_a_launch_refused_for_its_stream_names_the_likely_cause(fake_driver, rng, monkeypatch):
    """While capturing, the stream's device cannot be asked: the driver's refusal at the launch is worded."""
    monkeypatch.setattr(devices, "stream_device", lambda handle: None)
    with pytest.raises(DeviceMismatchError, match="is the stream one of cuda:1's"):
        call(dense_problem(rng, device=1), stream=fake_driver.new_stream(0))


def test_each_device_gets_its_own_shared_memory_limit(fake_driver, rng):
    """The fake refuses a launch above 48 KiB unless that device's function had its limit raised: a limit kept per
    kernel instead of per device would launch the second device's kernel unraised."""
    for device in (0, 1, 2):
        call(dense_problem(rng, device=device, m=4096, n=4096, k=512))
    assert [launch["device"] for launch in fake_driver.launches] == [0, 1, 2]
    assert len(fake_driver.shared_limits) == 3 and min(fake_driver.shared_limits.values()) > 48 * 1024


def test_a_capturing_stream_is_not_asked_for_its_device(fake_driver, rng):
    """While a stream captures a graph the driver refuses cuStreamGetDevice and the refusal breaks the capture: the
    launch must not ask (it relies on the launch's own error, test above)."""
    stream = fake_driver.new_stream(1)
    fake_driver.capturing.add(stream)
    call(dense_problem(rng, device=1), stream=stream)
    assert not fake_driver.capture_broken
    assert [launch["device"] for launch in fake_driver.launches] == [1]


def test_an_int_stream_of_another_device_is_refused_before_any_copy(fake_driver, rng):
    """c is copied into d on the call's stream before the launch: a foreign stream must be refused first."""
    args = dense_problem(rng, device=1, n=256)
    d = FakeDeviceArray(np.zeros((200, 256), np.float32), 1)
    c = FakeDeviceArray(np.zeros((200, 256), np.float32), 1)
    with pytest.raises(DeviceMismatchError, match="belongs to cuda:0"):
        gemm.fp8_gemm_nt((args["a"], args["sa"]), (args["b"], args["sb"]), d, c=c, stream=fake_driver.new_stream(0))
    assert not fake_driver.copies and not fake_driver.launches
