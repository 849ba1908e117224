"""Without a GPU, Numba kernels run in its CUDA simulator and `gpu`-marked tests skip with a reason."""
import os

import pytest

from ptx.device import has_gpu, is_hopper

HAS_GPU = has_gpu()
if not HAS_GPU:
    # Must be set before numba.cuda is first imported anywhere in this process.
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")


def _hopper_count() -> int:
    from ptx.device import device_count
    return sum(is_hopper(device) for device in range(device_count()))


def pytest_collection_modifyitems(config, items):
    hoppers = _hopper_count() if HAS_GPU else 0
    reason = "needs a Hopper (sm_90) GPU" if HAS_GPU else "needs a GPU (none found: CPU-only run)"
    skip_gpu = pytest.mark.skip(reason=reason)
    skip_two = pytest.mark.skip(reason=f"needs two Hopper GPUs ({hoppers} here): bash tools/gpu_run.sh multigpu")
    for item in items:
        if "multigpu" in item.keywords and hoppers < 2:
            item.add_marker(skip_two)
        elif "gpu" in item.keywords and not is_hopper():
            item.add_marker(skip_gpu)


@pytest.fixture
def rng():
    """A fresh, unseeded generator per test: inputs differ on every run (seed printed on failure)."""
    import numpy as np
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"rng seed = {seed}")
    return np.random.default_rng(seed)
