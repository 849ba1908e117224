"""Run a generated kernel on the CPU: :func:`run_gemm` feeds ``generate(config, n, k)`` to the PTX emulator
(:mod:`ptx.emulate`) with the tensor maps :mod:`gemm.kernel.launch` would encode and the grid it would launch.

No GPU, no driver: the tests use it to check every config on small shapes (the ring wrapping, several tiles per
CTA, ragged M and N), and the notebooks to let a student run stages 07+ on a laptop. ``sm_count`` stands in for
the device's SM count, so a small grid walks many tiles per CTA.
"""
from __future__ import annotations

import numpy as np

from gemm.fp8 import align, bf16_to_float
from gemm.kernel import KERNEL, KernelConfig, SharedPlan, generate
from gemm.kernel.launch import grid, tensor_map_specs

BF16_NAN_BITS = 0x7FC0


def run_gemm(config: KernelConfig, a, sa, b, sb, *, c=None, sm_count: int = 3, seed: int | None = None,
             preempt: bool = True) -> np.ndarray:
    """D = (a*sa)(b*sb)^T by ``config``'s kernel on the emulator, as float32 (host arrays in the gemm.fp8
    contract; D starts as NaN so unwritten elements show). With ``config.accumulate``, D starts as ``c``
    (float32 (M, N)) and the kernel adds into it: D = C + A*B."""
    from ptx.emulate import FakeTensorMap, run_kernel
    m, k = a.shape
    n = b.shape[0]
    storage = np.zeros((sa.shape[1], align(m, 4)), np.float32)  # sa M-major, M padded to 4 (TMA's layout)
    storage[:, :m] = np.asarray(sa).T
    if config.accumulate:
        if c is None:
            raise ValueError("config.accumulate adds into D: pass c, the (M, N) float32 C")
        d = np.array(c, np.float32, copy=True).reshape(m, n)
    elif config.out_dtype == "f32":
        d = np.full((m, n), np.nan, np.float32)
    else:
        d = np.full((m, n), BF16_NAN_BITS, np.uint16)
    data = {"tmap_a": np.ascontiguousarray(a).view(np.uint8), "tmap_b": np.ascontiguousarray(b).view(np.uint8),
            "tmap_sa": storage, "tmap_d": d}
    maps = {name: FakeTensorMap(data[name], np.dtype(spec["dtype"]), spec["shape"], spec["row_stride_bytes"],
                                spec["box"], spec["swizzle"])
            for name, spec in tensor_map_specs(config, m, n, k, align(m, 4)).items()}
    run_kernel(generate(config, n, k), KERNEL, (grid(config, m, n, sm_count),), config.threads,
               SharedPlan(config, n, k).shared_bytes,
               dict(**maps, sb=np.ascontiguousarray(sb, np.float32), d=d, m=m), seed=seed, preempt=preempt,
               cluster=config.multicast)
    return d if d.dtype == np.float32 else bf16_to_float(d)


__all__ = ["run_gemm"]
