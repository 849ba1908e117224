"""Launching a generated kernel, any GEMM type: the kernel cache keyed by (config, N, K), tensor maps, grid, the
kernel's arguments (named as the generator declares its parameters), and a launch or a prepared launch.

Nothing here is per device but the launch itself: a loaded kernel serves every device (ptx.runtime loads it into a
device's context on first use there), tensor maps are keyed by pointers (unique across devices under unified
addressing) and the grid by the SM count of the call's device, which the caller passes.

A kernel is generated, assembled and loaded once per (config, N, K) in a process (and its cubin cached on disk by
:mod:`ptx.compile`), so a new M costs only new tensor maps: A, sa and D are described with M rows, which is what
makes TMA zero-fill A's missing rows and clip D's. The maps are encoded by the driver on the host (a few
microseconds each) and cached per (pointers, M).
"""
from __future__ import annotations

import functools

import numpy as np

from gemm.fp8 import ceil_div
from gemm.kernel.config import BLOCK_K, POST_PASSES, KernelConfig, SharedPlan, tma_store_box_columns
from gemm.kernel.generator import KERNEL, compiled_k, generate, kernel_params
from gemm.kernel.seams import NO_SEAMS, Seams


def cubin(config: KernelConfig, n: int, k: int, seams: Seams = NO_SEAMS):
    """The assembled kernel of ``config`` for (N, K), after its cubin passes (no GPU needed); ``seams``: see
    :mod:`gemm.kernel.seams` (its ``ffma_rule`` replaces the pass's rule).

    ``FP8LADDER_DUMP_DIR``: write its PTX and SASS there (DeepGEMM's DG_JIT_DUMP_*); ``FP8LADDER_PTXAS_VERBOSE=1``:
    print ptxas's report (registers, spills) when it is built (DG_JIT_PTXAS_VERBOSE)."""
    import dataclasses
    import os
    from ptx.compile import compile_ptx
    from ptx.passes import interleave_ffma
    ptx = generate(config, n, k, seams)
    image = compile_ptx(ptx)
    for name in config.post_passes:
        patched, _ = interleave_ffma(image, KERNEL, rule=seams.ffma_rule or POST_PASSES[name])
        image = dataclasses.replace(image, image=patched, from_cache=False)  # a new Cubin: a new key (sha256)
    if os.environ.get("FP8LADDER_PTXAS_VERBOSE") == "1":
        print(f"{config.describe()} N={n} K={k}:\n{image.info_log.strip()}")
    if os.environ.get("FP8LADDER_DUMP_DIR"):
        _dump(os.environ["FP8LADDER_DUMP_DIR"], config, n, k, ptx, image)
    return image


def _dump(folder: str, config: KernelConfig, n: int, k: int, ptx: str, image) -> None:
    from pathlib import Path
    from ptx.sass import disassemble
    stem = f"fp8_gemm_n{n}_k{k}_{config.block_m}x{config.block_n}_{image.key[:12]}"
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"{stem}.ptx").write_text(ptx)
    (Path(folder) / f"{stem}.sass").write_text("\n".join(f"/*{i.offset:04x}*/ {i.text}" for i in disassemble(image)))


@functools.lru_cache(maxsize=None)
def kernel(config: KernelConfig, n: int, k: int, seams: Seams = NO_SEAMS):
    """The loaded kernel of ``config`` for (N, K) (generated, assembled and passed on first use)."""
    from ptx.runtime import load_kernel
    return load_kernel(cubin(config, n, k, seams), KERNEL)


def tensor_map_specs(config: KernelConfig, m: int, n: int, k: int, sa_stride: int, groups: int = 1,
                     sb_stride: int | None = None, row_strides: tuple[int, int] | None = None) -> dict[str, dict]:
    """What each tensor map describes: keyword arguments of ptx.tensor_maps.tensor_map_2d (minus the pointer).

    Grouped GEMMs (``groups`` = G): B is the (G*N, K) stack of the experts' weights; for the masked one M is
    M_max, A and D are the (G*M_max) rows of all groups, and sa (G, M_max, Kb) stored M-major per group
    (``sa_stride`` = M_max, a multiple of 4) is one (G*Kb, M_max) map. 1x128 B scales (wgrad): sb (N, Kb) stored
    N-major, ``sb_stride`` floats per K group, is a (Kb, N) map read BLOCK_N at a time, like sa. K need not be a
    multiple of 128 (nor anywhere in production: any multiple of 16): A's and B's maps end at K, so TMA zero-fills
    the last K block's missing columns. ``row_strides``: bytes between rows of A and of B when they are views of
    wider storage (default K: contiguous)."""
    a_stride, b_stride = row_strides or (k, k)
    masked = config.gemm_type == "masked"
    rows = groups * m if masked else m
    k_blocks = ceil_div(k, BLOCK_K)
    specs = {
        "tmap_a": dict(dtype=np.uint8, shape=(rows, k), row_stride_bytes=a_stride, box=(config.block_m, BLOCK_K),
                       swizzle=128),
        "tmap_b": dict(dtype=np.uint8, shape=(groups * n if config.grouped else n, k), row_stride_bytes=b_stride,
                       box=(config.block_n, BLOCK_K), swizzle=128),
        # sa is (Kb, M) floats in memory (M-major, rows padded to sa_stride): a box is one K group's BLOCK_M
        "tmap_sa": dict(dtype=np.float32, shape=((groups if masked else 1) * k_blocks, m),
                        row_stride_bytes=4 * sa_stride, box=(1, config.block_m), swizzle=0),
    }
    if config.b_scales == "1x128":
        specs["tmap_sb"] = dict(dtype=np.float32, shape=(k_blocks, n), row_stride_bytes=4 * sb_stride,
                                box=(1, config.block_n), swizzle=0)
    if config.epilogue == "tma":
        item = config.out_bytes
        columns = tma_store_box_columns(config.block_n, item)
        specs["tmap_d"] = dict(dtype=np.float32 if config.out_dtype == "f32" else np.uint16, shape=(rows, n),
                               row_stride_bytes=item * n, box=(config.d_buffer_shape[0], columns),
                               swizzle=128 if columns * item == 128 else 0)
    return specs


@functools.lru_cache(maxsize=1024)
def tensor_maps(config: KernelConfig, pointers: tuple[int, ...], m: int, n: int, k: int,
                sa_stride: int, groups: int = 1, sb_stride: int | None = None,
                row_strides: tuple[int, int] | None = None) -> dict:
    """The encoded maps of one call by parameter name (host-side only; cached per pointers and shape):
    ``pointers`` are A, B, sa, D (and sb, 1x128)."""
    from ptx.tensor_maps import tensor_map_2d
    specs = tensor_map_specs(config, m, n, k, sa_stride, groups, sb_stride, row_strides)
    by_name = dict(zip(("tmap_a", "tmap_b", "tmap_sa", "tmap_d", "tmap_sb"), pointers))
    return {name: tensor_map_2d(by_name[name], **spec) for name, spec in specs.items()}


def grid(config: KernelConfig, m: int, n: int, sm_count: int, groups: int = 1) -> int:
    """CTAs to launch: one per tile (split-K: split_k per tile), or (persistent) one per SM, never more than there
    are tiles (``even_waves``: the fewest CTAs that take as many waves, :func:`even_wave_ctas`); a multiple of the
    cluster size (a pair's second CTA may find no tile: the kernel handles a lone CTA). Masked grouped GEMMs: at
    most the tiles of G full groups of M (= M_max) rows (the counts in use are known on the device only)."""
    tiles = (groups if config.gemm_type == "masked" else 1) * ceil_div(m, config.block_m) * ceil_div(n, config.block_n)
    count = min(tiles, sm_count) if config.persistent else tiles * config.split_k
    if config.even_waves:
        count = even_wave_ctas(tiles, sm_count, config.multicast)
    return max(config.multicast, count - count % config.multicast) if count % config.multicast else count


def even_wave_ctas(tiles: int, sm_count: int, cluster: int = 1) -> int:
    """The fewest CTAs of a persistent walk that take as many waves as one CTA per SM (``KernelConfig.even_waves``):
    each walks ceil(tiles / sm_count) tiles or one fewer, none more. Rounded up to whole clusters (rounding down
    would add a wave), within the SMs. 512 tiles on 132 SMs: 4 waves, so 128 CTAs of 4 tiles, not 116 of 4 and 16
    of 3."""
    count = ceil_div(tiles, ceil_div(tiles, sm_count))
    return min(ceil_div(count, cluster) * cluster, sm_count)


@functools.lru_cache(maxsize=4096)
def _launch_shape(config: KernelConfig, m: int, n: int, k: int, sm_count: int, groups: int) -> tuple:
    """(grid, shared bytes, cluster) of one call: pure functions of the config and shape, so computed once."""
    cluster = (config.cluster_size, 1, 1) if config.cluster_size > 1 else None
    return grid(config, m, n, sm_count, groups), SharedPlan(config, n, compiled_k(config, k)).shared_bytes, cluster


def kernel_arguments(config: KernelConfig, args) -> list:
    """The values of the kernel's parameters for validated arguments (gemm.validate.GemmArgs, any gemm_type), in
    the order and by the names the generator declares them (:func:`gemm.kernel.generator.kernel_params`)."""
    row_scales = config.b_scales == "1x128"
    pointers = (args.a.ptr, args.b.ptr, args.sa.ptr, args.d.ptr) + ((args.sb.ptr,) if row_scales else ())
    row_strides = (_row_stride(args.a), _row_stride(args.b))
    maps = tensor_maps(config, pointers, args.m, args.n, args.k, args.sa_stride, args.groups,
                       args.sb_stride if row_scales else None, row_strides if row_strides != (args.k, args.k) else None)
    values = {**maps, "sb": args.sb.ptr, "d": args.d.ptr, "m": args.m, "k_blocks": ceil_div(args.k, BLOCK_K),
              "grouped_layout": args.layout.ptr if args.layout is not None else 0, "groups": args.groups}
    return [values[name] for _, name in kernel_params(config)]


def _row_stride(view) -> int:
    """Bytes between an e4m3 operand's rows (a 2-D view; a grouped 3-D one is contiguous: K)."""
    return view.strides[0] * view.itemsize if len(view.shape) == 2 and view.shape[0] > 1 else view.shape[-1]


def launch(config: KernelConfig, args, *, sm_count: int, stream=None) -> None:
    """Run ``config``'s kernel on validated arguments (gemm.validate.GemmArgs) on their device."""
    blocks, shared_bytes, cluster = _launch_shape(config, args.m, args.n, args.k, sm_count, args.groups)
    kernel(config, args.n, compiled_k(config, args.k)).launch(blocks, config.threads, kernel_arguments(config, args),
                                          shared_bytes=shared_bytes, cluster=cluster, stream=stream,
                                          device=args.device, programmatic=config.pdl)


def prepare(config: KernelConfig, args, *, sm_count: int):
    """``launch`` with everything but the stream done: a ptx.runtime.PreparedLaunch for the host hot path."""
    blocks, shared_bytes, cluster = _launch_shape(config, args.m, args.n, args.k, sm_count, args.groups)
    return kernel(config, args.n, compiled_k(config, args.k)).prepare(blocks, config.threads, kernel_arguments(config, args),
                                                  shared_bytes=shared_bytes, cluster=cluster, device=args.device,
                                                  programmatic=config.pdl)


__all__ = ["even_wave_ctas", "cubin", "kernel", "tensor_map_specs", "tensor_maps", "kernel_arguments", "grid", "launch",
           "prepare"]
