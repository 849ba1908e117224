"""Which kernel config a problem gets: block shape, stages, schedule, epilogue; read off the device, not assumed.

DeepGEMM's April-2025 rules, on the block shapes the generator has today (BLOCK_M in {64, 128}, BLOCK_N dividing
128): fewest *waves* first (a wave = one tile per SM), then the fullest last wave, then ties as DeepGEMM breaks
them (the same tile count: the smaller block; otherwise the wider BLOCK_N). Stages: as many as the shared-memory
budget allows. The raster group minimises what one wave of tiles reads: ``g * BLOCK_N + ceil(SMs / g) * BLOCK_M``
rows for groups of ``g`` n-blocks (DeepGEMM HEAD's rule). The TMA-store epilogue needs 16-byte rows of D
(N % 8 == 0); other N take the staged one.

The device is read through the driver (SM count, opt-in shared memory per block); without a GPU the facts of an
H100 SXM stand in, so CPU tests and ``python -m lessons inspect`` see the configs the H100 gets.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from gemm.fp8 import ceil_div
from gemm.kernel.config import SHARED_LIMIT, KernelConfig, max_stages

BLOCK_M_CANDIDATES = (64, 128)
BLOCK_N_CANDIDATES = (16, 32, 64, 128)
RASTER_GROUPS = (8, 16)
MAX_STAGES = 10
REGISTERS = (40, 232)  # producer / math warpgroups (DeepGEMM's split): 128 x 40 + 256 x 232 <= 65536


@dataclass(frozen=True)
class DeviceFacts:
    sm_count: int
    shared_limit: int  # dynamic shared memory one block may opt in to
    name: str = "NVIDIA H100 80GB HBM3 (assumed: no GPU)"


H100 = DeviceFacts(132, SHARED_LIMIT)


@functools.lru_cache(maxsize=None)
def device_facts(device_id: int = 0) -> DeviceFacts:
    from ptx.device import has_gpu
    if not has_gpu():
        return H100
    from cuda.bindings import driver
    attr = driver.CUdevice_attribute

    def read(which):
        err, value = driver.cuDeviceGetAttribute(which, device_id)
        return int(value)
    sms = read(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
    shared = read(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
    err, name = driver.cuDeviceGetName(256, device_id)
    return DeviceFacts(sms, min(shared, SHARED_LIMIT), name.split(b"\0")[0].decode())


def _score(block_m: int, block_n: int, m: int, n: int, sms: int) -> tuple[int, int, int]:
    tiles = ceil_div(m, block_m) * ceil_div(n, block_n)
    waves = ceil_div(tiles, sms)
    last_wave = tiles % sms or sms
    return waves, last_wave, tiles


def choose_blocks(m: int, n: int, sms: int) -> tuple[int, int]:
    best = None
    for block_m in BLOCK_M_CANDIDATES:
        if block_m > 64 and m <= 64:
            continue
        for block_n in BLOCK_N_CANDIDATES:
            waves, last_wave, tiles = _score(block_m, block_n, m, n, sms)
            if best is None:
                best = (block_m, block_n, waves, last_wave, tiles)
                continue
            bm, bn, best_waves, best_last, best_tiles = best
            if (waves, -last_wave) < (best_waves, -best_last):
                better = True
            elif (waves, last_wave) == (best_waves, best_last):
                if tiles == best_tiles:  # the same work split: the smaller block wastes less on the edges
                    better = block_m * block_n < bm * bn
                else:
                    better = block_n > bn
            else:
                better = False
            if better:
                best = (block_m, block_n, waves, last_wave, tiles)
    return best[0], best[1]


def raster_group(block_m: int, block_n: int, sms: int) -> int:
    return min(RASTER_GROUPS, key=lambda g: (g * block_n + ceil_div(sms, g) * block_m, -g))


@functools.lru_cache(maxsize=4096)
def choose_config(m: int, n: int, k: int, device: DeviceFacts | None = None) -> KernelConfig:
    """The production config for (M, N, K) on ``device`` (default: device 0, or an H100 without a GPU).

    ``FP8LADDER_PRINT_CONFIGS=1`` prints each choice once."""
    device = device or device_facts()
    block_m, block_n = choose_blocks(m, n, device.sm_count)
    config = KernelConfig(block_m=block_m, block_n=block_n, stages=2, producer="warpgroup", registers=REGISTERS,
                          persistent=True, raster_group=raster_group(block_m, block_n, device.sm_count),
                          epilogue="tma" if n % 8 == 0 else "staged")
    stages = max_stages(config, n, k, limit=MAX_STAGES, budget=device.shared_limit)
    config = config.replace(stages=stages)
    if os.environ.get("FP8LADDER_PRINT_CONFIGS"):
        print(f"fp8_gemm_nt M={m} N={n} K={k}: {config.describe()}")
    return config


__all__ = ["choose_config", "choose_blocks", "raster_group", "device_facts", "DeviceFacts", "H100"]
