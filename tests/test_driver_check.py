"""The driver check at ``import gemm``: a driver too old for the PTX ISA we emit is a clear error naming both
versions; no driver (CPU-only) is no error. The driver is faked, so this runs anywhere."""
import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ptx.driver as driver_module
from ptx.builder import PTX_VERSION
from ptx.device import has_gpu
from ptx.driver import (PTX_ISA_FIRST_CUDA, DriverTooOldError, check_driver, installed_driver_version,
                        ptx_isa_supported_by)

REPO = Path(__file__).resolve().parents[1]


class FakeDriverLibrary:
    """Stands in for libcuda: cuDriverGetVersion writes ``version`` (e.g. 12040) and returns ``result``."""

    def __init__(self, version: int, result: int = 0):
        self.version, self.result = version, result

    def cuDriverGetVersion(self, pointer):
        pointer._obj.value = self.version
        return self.result


def fake_driver(monkeypatch, version: int | None, result: int = 0):
    def load(name):
        if version is None:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        return FakeDriverLibrary(version, result)
    monkeypatch.setattr(ctypes, "CDLL", load)
    monkeypatch.delenv(driver_module.SKIP_VARIABLE, raising=False)


def test_too_old_driver_names_both_versions_and_the_fix(monkeypatch):
    fake_driver(monkeypatch, 12040)
    assert installed_driver_version() == (12, 4)
    with pytest.raises(DriverTooOldError) as caught:
        check_driver("8.5")
    message = str(caught.value)
    assert "PTX ISA 8.5" in message and "CUDA 12.5" in message  # what we emit, and the release it needs
    assert "CUDA 12.4" in message and "PTX ISA up to 8.4" in message  # what the driver supports
    assert "Upgrade the NVIDIA driver" in message and driver_module.SKIP_VARIABLE in message


@pytest.mark.parametrize("version", [12050, 12060, 12080, 13000, 13020])
def test_new_enough_driver_passes(monkeypatch, version):
    fake_driver(monkeypatch, version)
    check_driver("8.5")


def test_no_driver_is_no_error(monkeypatch):
    fake_driver(monkeypatch, None)
    assert installed_driver_version() is None
    check_driver("9.1")


def test_failing_driver_call_counts_as_no_driver(monkeypatch):
    fake_driver(monkeypatch, 12040, result=34)  # CUDA_ERROR_STUB_LIBRARY
    assert installed_driver_version() is None
    check_driver("8.5")


def test_skip_variable(monkeypatch):
    fake_driver(monkeypatch, 11080)
    monkeypatch.setenv(driver_module.SKIP_VARIABLE, "1")
    check_driver("8.5")


def test_very_old_driver_still_gets_a_readable_error():
    with pytest.raises(DriverTooOldError, match=r"CUDA 10\.2 \(no PTX ISA as new as 7\.0\)"):
        check_driver("8.5", driver=(10, 2))


def test_release_table():
    assert PTX_VERSION in PTX_ISA_FIRST_CUDA, "add the new PTX ISA's first CUDA release to ptx.driver"
    assert ptx_isa_supported_by((12, 4)) == "8.4"
    assert ptx_isa_supported_by((12, 6)) == "8.5"  # CUDA 12.6 kept PTX ISA 8.5
    assert ptx_isa_supported_by((12, 8)) == "8.7"
    assert ptx_isa_supported_by((13, 0)) == "9.0"
    assert ptx_isa_supported_by((10, 2)) is None
    utils = pytest.importorskip("cuda.bindings.utils")
    if not hasattr(utils, "get_minimal_required_cuda_ver_from_ptx_ver"):
        pytest.skip("this cuda-bindings has no PTX release table to compare with")
    for isa, (major, minor) in PTX_ISA_FIRST_CUDA.items():
        assert utils.get_minimal_required_cuda_ver_from_ptx_ver(isa) == 1000 * major + 10 * minor, isa


def test_import_gemm_raises_with_an_old_driver():
    script = ("import ptx.driver as d; d.installed_driver_version = lambda: (12, 0)\n"
              "try:\n    import gemm\nexcept d.DriverTooOldError as error:\n    print('REFUSED', error)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(driver_module.SKIP_VARIABLE, None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("REFUSED") and f"PTX ISA {PTX_VERSION}" in done.stdout


def test_this_machine():
    """The real driver, or none: either way no error here (a CPU-only machine has none to ask)."""
    version = installed_driver_version()
    if has_gpu():
        assert version is not None and version >= PTX_ISA_FIRST_CUDA[PTX_VERSION]
    check_driver()
