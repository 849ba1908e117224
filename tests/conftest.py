"""Without a GPU, Numba kernels run in its CUDA simulator and `gpu`-marked tests skip with a reason."""
import os

import pytest

from ptx.device import has_gpu, is_hopper

HAS_GPU = has_gpu()
if not HAS_GPU:
    # Must be set before numba.cuda is first imported anywhere in this process.
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")


def pytest_collection_modifyitems(config, items):
    if is_hopper():
        return
    reason = "needs a Hopper (sm_90) GPU" if HAS_GPU else "needs a GPU (none found: CPU-only run)"
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    """A fresh, unseeded generator per test: inputs differ on every run (seed printed on failure)."""
    import numpy as np
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"rng seed = {seed}")
    return np.random.default_rng(seed)
