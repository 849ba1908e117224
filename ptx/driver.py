"""Does the installed NVIDIA driver accept the PTX ISA we emit? Checked once, at ``import gemm``.

Each CUDA release's driver knows the PTX ISA up to that release's version; our kernels are written for
:data:`ptx.builder.PTX_VERSION`, so a driver older than its release is below what they were built and tested for,
and would otherwise surface as an opaque CUDA error at the first kernel load. This check says so at import,
naming both versions and the fix. Without a driver (CPU-only machines) it does nothing.

The driver is asked through ctypes, not ``cuda.bindings``: importing the bindings costs ~70 ms, which a
CPU-only ``import gemm`` should not pay, and ``cuDriverGetVersion`` needs neither ``cuInit`` nor a device.
"""
from __future__ import annotations

import ctypes
import os
import sys

from ptx.builder import PTX_VERSION

# The first CUDA release whose driver loads each PTX ISA version (the PTX ISA's release-history table; the same
# as cuda.bindings.utils' table). 8.6 shipped with no public release: CUDA 12.6 still stops at 8.5.
PTX_ISA_FIRST_CUDA: dict[str, tuple[int, int]] = {
    "7.0": (11, 0), "7.1": (11, 1), "7.2": (11, 2), "7.3": (11, 3), "7.4": (11, 4), "7.5": (11, 5),
    "7.6": (11, 6), "7.7": (11, 7), "7.8": (11, 8),
    "8.0": (12, 0), "8.1": (12, 1), "8.2": (12, 2), "8.3": (12, 3), "8.4": (12, 4), "8.5": (12, 5),
    "8.6": (12, 7), "8.7": (12, 8), "8.8": (12, 9),
    "9.0": (13, 0), "9.1": (13, 1),
}

SKIP_VARIABLE = "FP8LADDER_SKIP_DRIVER_CHECK"
_LIBRARY_NAMES = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1",)  # .so.1: never the toolkit's stub


class DriverTooOldError(RuntimeError):
    """The installed driver cannot load the PTX ISA version this library emits."""


def installed_driver_version() -> tuple[int, int] | None:
    """The CUDA version the installed driver supports, as (major, minor); None when no driver can be loaded."""
    for name in _LIBRARY_NAMES:
        try:
            library = ctypes.CDLL(name)
        except OSError:
            continue
        version = ctypes.c_int(0)
        try:
            result = library.cuDriverGetVersion(ctypes.byref(version))
        except (AttributeError, OSError):
            return None
        if result != 0 or version.value <= 0:
            return None
        return version.value // 1000, version.value % 1000 // 10
    return None


def ptx_isa_supported_by(cuda: tuple[int, int]) -> str | None:
    """The newest PTX ISA a driver for CUDA ``cuda`` loads, as far as the table knows; None if older than all."""
    loadable = [isa for isa, first in PTX_ISA_FIRST_CUDA.items() if first <= cuda]
    return max(loadable, key=lambda isa: PTX_ISA_FIRST_CUDA[isa]) if loadable else None


def _text(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def check_driver(ptx_version: str = PTX_VERSION, driver: tuple[int, int] | None = None) -> None:
    """Raise :class:`DriverTooOldError` when the driver (default: the installed one) cannot load PTX ISA
    ``ptx_version``. No driver, an ISA the table does not know, or ``FP8LADDER_SKIP_DRIVER_CHECK=1``: no check."""
    if os.environ.get(SKIP_VARIABLE) == "1":
        return
    needed = PTX_ISA_FIRST_CUDA.get(ptx_version)
    driver = driver or installed_driver_version()
    if needed is None or driver is None or driver >= needed:
        return
    supported = ptx_isa_supported_by(driver)
    reach = f"PTX ISA up to {supported}" if supported else f"no PTX ISA as new as {min(PTX_ISA_FIRST_CUDA)}"
    raise DriverTooOldError(
        f"The installed NVIDIA driver is too old for fp8-ladder: it supports CUDA {_text(driver)} ({reach}), but "
        f"fp8-ladder emits PTX ISA {ptx_version}, which needs a driver for CUDA {_text(needed)} or newer. Upgrade "
        f"the NVIDIA driver to one for CUDA {_text(needed)}+ (nvidia-smi shows the CUDA version a driver supports). "
        f"{SKIP_VARIABLE}=1 skips this check (kernels may then fail to load).")


__all__ = ["check_driver", "installed_driver_version", "ptx_isa_supported_by", "DriverTooOldError",
           "PTX_ISA_FIRST_CUDA"]
