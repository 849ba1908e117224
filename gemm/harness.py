"""Device-side problems for tests, tools, notebooks and the ladder: one home, in the library (nothing imports
``lessons``).

:func:`device_problem` puts host operands on the GPU (Numba device arrays) in the kernels' layout: e4m3 as
bytes, sa M-major with M padded to 4 floats, D as BF16 bits. :func:`checked_run` poisons D with NaN, runs a
GEMM once and checks it (every element written; diff against a float64 reference, :mod:`gemm.bench`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from gemm.bench import BF16_NAN_BITS
from gemm.fp8 import align


@dataclass
class DeviceProblem:
    a: object
    sa: object
    b: object
    sb: object
    d: object


def mn_major_view(storage, m: int):
    """The (M, Kb) M-major view of a (Kb, align(M, 4)) Numba device array, without copying.

    Not ``storage[:, :m].T``: on a real GPU Numba's ``.T`` of a device array launches a transpose kernel and
    returns a row-major copy (the simulator's returns a view), which is exactly the layout we must not pass.
    """
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return storage[:, :m].T
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    itemsize = storage.dtype.itemsize
    return DeviceNDArray(shape=(m, storage.shape[0]), strides=(itemsize, storage.shape[1] * itemsize),
                         dtype=storage.dtype, gpu_data=storage.gpu_data)


def device_problem(a, sa, b, sb) -> DeviceProblem:
    """Host operands -> Numba device arrays in the contract's layout (e4m3 as uint8, BF16 D as uint16)."""
    from numba import cuda
    m, n = a.shape[0], b.shape[0]
    values = np.asarray(sa, dtype=np.float32)
    storage = np.zeros((values.shape[1], align(m, 4)), dtype=np.float32)  # M-major, M padded to 4
    storage[:, :m] = values.T
    return DeviceProblem(cuda.to_device(np.ascontiguousarray(a).view(np.uint8)),
                         mn_major_view(cuda.to_device(storage), m),
                         cuda.to_device(np.ascontiguousarray(b).view(np.uint8)),
                         cuda.to_device(np.ascontiguousarray(sb, dtype=np.float32)),
                         cuda.device_array((m, n), dtype=np.uint16))


def checked_run(gemm, problem: DeviceProblem, reference) -> dict:
    """``gemm(a, sa, b, sb, d)`` once into a NaN-poisoned D; {unwritten, diff, correct} (gemm.bench.check_output)."""
    from numba import cuda

    from gemm.bench import check_output
    problem.d.copy_to_device(np.full(problem.d.shape, BF16_NAN_BITS, dtype=np.uint16))
    gemm(problem.a, problem.sa, problem.b, problem.sb, problem.d)
    cuda.synchronize()
    return check_output(problem.d.copy_to_host(), reference)


__all__ = ["DeviceProblem", "device_problem", "mn_major_view", "checked_run", "BF16_NAN_BITS"]
