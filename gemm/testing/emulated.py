"""Run a generated kernel on the CPU: :func:`run_gemm` feeds ``generate(config, n, k)`` to the PTX emulator
(:mod:`ptx.emulate`) with the tensor maps :mod:`gemm.kernel.launch` would encode and the grid it would launch.

No GPU, no driver: the tests use it to check every config on small shapes (the ring wrapping, several tiles per
CTA, ragged M and N), and the notebooks to let a student run stages 07+ on a laptop. ``sm_count`` stands in for
the device's SM count, so a small grid walks many tiles per CTA. :func:`run_grouped_gemm` does the same for the
MoE grouped GEMMs (``config.gemm_type`` "contiguous" or "masked", :mod:`gemm.grouped`).
"""
from __future__ import annotations

import numpy as np

from gemm.fp8 import align, bf16_to_float, ceil_div
from gemm.kernel import KERNEL, KernelConfig, SharedPlan, generate
from gemm.kernel.generator import compiled_k
from gemm.kernel.launch import grid, tensor_map_specs
from gemm.kernel.seams import NO_SEAMS, Seams

from gemm.testing.problems import BF16_NAN_BITS


def run_gemm(config: KernelConfig, a, sa, b, sb, *, c=None, sm_count: int = 3, seed: int | None = None,
             preempt: bool = True, seams: Seams = NO_SEAMS, ptx: str | None = None) -> np.ndarray:
    """D = (a*sa)(b*sb)^T by ``config``'s kernel on the emulator, as float32 (host arrays in the gemm.fp8
    contract; D starts as NaN so unwritten elements show). With ``config.b_scales == "1x128"`` (wgrad) sb is
    (N, ceil(K/128)), one scale per row of b, and K any multiple of 16. With ``config.accumulate``, D starts as ``c``
    (float32 (M, N)) and the kernel adds into it: D = C + A*B. ``seams``: :mod:`gemm.kernel.seams`. ``ptx``: run this
    text instead of ``generate(config, n, k, seams)`` (an edited kernel, e.g. without its promotion), with the
    config's tensor maps, grid and shared memory."""
    from ptx.emulate import FakeTensorMap, run_kernel
    m, k = a.shape
    n = b.shape[0]
    storage = np.zeros((sa.shape[1], align(m, 4)), np.float32)  # sa M-major, M padded to 4 (TMA's layout)
    storage[:, :m] = np.asarray(sa).T
    row_scales = config.b_scales == "1x128"  # wgrad: sb is (N, Kb) values, stored N-major like sa
    sb_storage = None
    if row_scales:
        sb_storage = np.zeros((sb.shape[1], align(n, 4)), np.float32)
        sb_storage[:, :n] = np.asarray(sb).T
    if config.accumulate:
        if c is None:
            raise ValueError("config.accumulate adds into D: pass c, the (M, N) float32 C")
        d = np.array(c, np.float32, copy=True).reshape(m, n)
    elif config.out_dtype == "f32":
        d = np.full((m, n), np.nan, np.float32)
    else:
        d = np.full((m, n), BF16_NAN_BITS, np.uint16)
    data = {"tmap_a": np.ascontiguousarray(a).view(np.uint8), "tmap_b": np.ascontiguousarray(b).view(np.uint8),
            "tmap_sa": storage, "tmap_sb": sb_storage, "tmap_d": d}
    maps = {name: FakeTensorMap(data[name], np.dtype(spec["dtype"]), spec["shape"], spec["row_stride_bytes"],
                                spec["box"], spec["swizzle"])
            for name, spec in tensor_map_specs(config, m, n, k, align(m, 4), 1, align(n, 4)).items()}
    scalars = dict(m=m, k_blocks=ceil_div(k, 128)) if row_scales else dict(sb=np.ascontiguousarray(sb, np.float32), m=m)
    kernel_k = compiled_k(config, k)
    run_kernel(ptx if ptx is not None else generate(config, n, kernel_k, seams), KERNEL,
               (grid(config, m, n, sm_count),), config.threads, SharedPlan(config, n, kernel_k).shared_bytes,
               dict(**maps, d=d, **scalars), seed=seed, preempt=preempt, cluster=config.cluster_size)
    return d if d.dtype == np.float32 else bf16_to_float(d)


def run_grouped_gemm(config: KernelConfig, a, sa, b, sb, layout, *, d=None, sm_count: int = 3,
                     seed: int | None = None, preempt: bool = True) -> np.ndarray:
    """A grouped GEMM by ``config``'s kernel on the emulator; returns D as float32 (host arrays; D starts as NaN,
    or as ``d`` (BF16 bits, uint16), so untouched rows show).

    * ``config.gemm_type == "contiguous"``: a (sum M, K), sa (sum M, K/128) (values, row-major: stored M-major
      here), b (G, N, K), sb (G, ceil(N/128), K/128), ``layout`` = m_indices (sum M,) int32; D (sum M, N).
    * ``"masked"``: a (G, M_max, K), sa (G, M_max, K/128) (stored M-major per group here, M_max padded to 4), b,
      sb as above,
      ``layout`` = masked_m (G,) int32; D (G, M_max, N)."""
    from ptx.emulate import FakeTensorMap, run_kernel
    if not config.grouped:
        raise ValueError(f"run_grouped_gemm runs grouped configs; {config.describe()} is a dense one (run_gemm)")
    groups, n, k = b.shape
    kb = k // 128
    layout = np.ascontiguousarray(layout, np.int32)
    if config.gemm_type == "contiguous":
        m = a.shape[0]
        sa_stride = align(m, 4)
        storage = np.zeros((kb, sa_stride), np.float32)  # M-major, M padded to 4
        storage[:, :m] = np.asarray(sa).T
        out_shape = (m, n)
    else:
        m = a.shape[1]
        sa_stride = align(m, 4)
        storage = np.zeros((groups, kb, sa_stride), np.float32)  # M-major per group, M_max padded to 4
        storage[:, :, :m] = np.asarray(sa, np.float32).transpose(0, 2, 1)
        out_shape = (groups, m, n)
    if d is None:
        d = np.full(out_shape, BF16_NAN_BITS, np.uint16)
    d = np.ascontiguousarray(d, np.uint16).reshape(out_shape)
    data = {"tmap_a": np.ascontiguousarray(a).view(np.uint8), "tmap_b": np.ascontiguousarray(b).view(np.uint8),
            "tmap_sa": storage, "tmap_d": d}
    maps = {name: FakeTensorMap(data[name], np.dtype(spec["dtype"]), spec["shape"], spec["row_stride_bytes"],
                                spec["box"], spec["swizzle"])
            for name, spec in tensor_map_specs(config, m, n, k, sa_stride, groups).items()}
    run_kernel(generate(config, n, k), KERNEL, (grid(config, m, n, sm_count, groups),), config.threads,
               SharedPlan(config, n, k).shared_bytes,
               dict(**maps, sb=np.ascontiguousarray(sb, np.float32), d=d, m=m, grouped_layout=layout, groups=groups),
               seed=seed, preempt=preempt)
    return bf16_to_float(d)


__all__ = ["run_gemm", "run_grouped_gemm"]
