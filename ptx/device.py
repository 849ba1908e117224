"""Is there a GPU, and what is it: used by tests (skip markers), the ladder (result files) and the CLI."""
from __future__ import annotations

import functools
import os


@functools.lru_cache(maxsize=None)
def has_gpu() -> bool:
    """True when the CUDA driver initialises and sees a device (never true under Numba's simulator)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False
    try:
        from cuda.bindings import driver
    except Exception:
        return False
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return False
        err, count = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and count > 0
    except Exception:
        return False


@functools.lru_cache(maxsize=None)
def is_hopper() -> bool:
    """True when device 0 has compute capability 9.0 (sm_90a code runs only there)."""
    if not has_gpu():
        return False
    from cuda.bindings import driver
    attr = driver.CUdevice_attribute
    _, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0)
    _, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0)
    return (major, minor) == (9, 0)
