"""Problems and their checks: fresh random operands, the float64 reference, the NaN poison, and the inputs on a device.

* :func:`random_problem`: FP8 operands with per-group-varying magnitudes (host arrays in the gemm.fp8 contract);
  :func:`reference_gemm`: float64 D over the dequantized operands, what every kernel is compared with;
* :data:`BF16_NAN_BITS`: the poison every output starts as, so an element a kernel forgets to write stays NaN;
  :func:`check_output`: every element written and DeepGEMM's ``calc_diff`` < :data:`DIFF_LIMIT` on sampled rows;
* :func:`device_problem` / :func:`checked_run` (Numba device arrays) and :class:`TorchProblem` (torch tensors):
  the operands on the GPU in the kernels' layout (sa M-major, M padded to 4 floats);
* :func:`flops`, :func:`gemm_bytes`: the TFLOP/s and GB/s denominators.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from gemm.fp8 import (GROUP, align, bf16_to_float, calc_diff, ceil_div, dequantize_per_block, dequantize_per_token,
                      per_block_cast_to_fp8, per_token_cast_to_fp8, sa_to_mn_major)

BF16_NAN_BITS = 0x7FC0  # a quiet BF16 NaN: the poison outputs start as
DIFF_LIMIT = 1e-3  # DeepGEMM's bar for BF16 output
REFERENCE_ROWS = 512  # rows checked against float64; every element is still checked for being written


def random_problem(m: int, n: int, k: int, rng=None):
    """Fresh random FP8 operands with realistic, per-group-varying magnitudes: (a, sa, b, sb) on the host.

    ``sa`` is returned M-major (see :func:`sa_to_mn_major`), the layout every stage accepts.
    """
    rng = np.random.default_rng() if rng is None else rng
    # Per-row and per-column magnitudes that vary over orders of magnitude exercise the scale promotion.
    x = rng.standard_normal((m, k), dtype=np.float32) * np.exp2(rng.integers(-4, 5, (m, 1))).astype(np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32) * np.exp2(rng.integers(-4, 5, (1, k))).astype(np.float32)
    a, sa = per_token_cast_to_fp8(x)
    b, sb = per_block_cast_to_fp8(w)
    return a, sa_to_mn_major(sa), b, sb


def flops(m: int, n: int, k: int) -> int:
    return 2 * m * n * k


def gemm_bytes(m: int, n: int, k: int) -> int:
    """Bytes of A, B, both scale tensors and D, each moved once: the GB/s denominator."""
    kb = ceil_div(k, GROUP)
    return m * k + n * k + 4 * (m * kb + ceil_div(n, GROUP) * kb) + 2 * m * n


def reference_gemm(a, sa, b, sb) -> np.ndarray:
    """float64 D = (a*sa) @ (b*sb).T over the dequantized inputs: what every kernel is compared with."""
    return dequantize_per_token(a, sa) @ dequantize_per_block(b, sb).T



# -- checking ----------------------------------------------------------------------------------------------
@dataclass
class Reference:
    """float64 D on a sample of rows: the full product at M=4096 costs minutes of CPU, a sample seconds."""
    rows: np.ndarray
    values: np.ndarray  # (len(rows), N)
    sampled: bool


def reference_rows(a, sa, b, sb, rng, max_rows: int = REFERENCE_ROWS) -> Reference:
    m = a.shape[0]
    if m <= max_rows:
        rows = np.arange(m)
    else:  # random rows plus the first and last, so ragged edges are always among them
        rows = np.union1d(1 + rng.choice(m - 2, max_rows - 2, replace=False), [0, m - 1])
    sa_rows = np.asarray(sa)[rows]
    return Reference(rows, reference_gemm(np.asarray(a)[rows], sa_rows, b, sb), m > max_rows)


def check_output(d_bits: np.ndarray, reference: Reference) -> dict:
    """Every element written (no NaN left from the poison) and diff vs the reference rows."""
    unwritten = int(np.isnan(bf16_to_float(d_bits)).sum())
    return check_rows(unwritten, np.asarray(d_bits)[reference.rows], reference)


def check_rows(unwritten: int, row_bits: np.ndarray, reference: Reference) -> dict:
    """:func:`check_output` from its two parts: the NaN count over all of D, and D's BF16 bits on the reference
    rows (a large D on a GPU never needs to cross to the host whole)."""
    diff = calc_diff(bf16_to_float(row_bits), reference.values) if unwritten == 0 else float("nan")
    return {"unwritten": unwritten, "diff": diff, "correct": unwritten == 0 and diff < DIFF_LIMIT}


def torch_output_parts(out, rows) -> tuple[int, np.ndarray]:
    """(NaN count over all of ``out``, BF16 bits of ``rows`` of ``out`` seen as (rows, N)): what
    :func:`check_rows` needs, counted on the tensor's device."""
    import torch
    flat = out.reshape(-1, out.shape[-1])
    picked = flat.index_select(0, torch.as_tensor(np.asarray(rows), device=flat.device))
    return int(torch.isnan(flat).sum().item()), torch_bits(picked)


def torch_output_values(out, rows) -> tuple[int, np.ndarray]:
    """(NaN count over all of an FP32 ``out``, its ``rows`` seen as (rows, N) as float32): the FP32 outputs'
    (wgrad's) counterpart of :func:`torch_output_parts`."""
    import torch
    flat = out.reshape(-1, out.shape[-1])
    picked = flat.index_select(0, torch.as_tensor(np.asarray(rows), device=flat.device))
    return int(torch.isnan(flat).sum().item()), picked.cpu().numpy()



# -- on the device: Numba arrays ---------------------------------------------------------------------------
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
    """``gemm(a, sa, b, sb, d)`` once into a NaN-poisoned D; {unwritten, diff, correct} (:func:`check_output`)."""
    from numba import cuda
    problem.d.copy_to_device(np.full(problem.d.shape, BF16_NAN_BITS, dtype=np.uint16))
    gemm(problem.a, problem.sa, problem.b, problem.sb, problem.d)
    cuda.synchronize()
    return check_output(problem.d.copy_to_host(), reference)



# -- on the device: torch tensors --------------------------------------------------------------------------
def torch_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def torch_fp8(host, device):
    import torch
    return torch.from_numpy(np.ascontiguousarray(host).view(np.uint8)).to(device).view(torch.float8_e4m3fn)


def torch_m_major(sa, device, m_stride: int):
    """(M, Kb) values -> torch (M, Kb) view with strides (1, m_stride)."""
    import torch
    values = np.asarray(sa, dtype=np.float32)
    m, kb = values.shape
    storage = np.zeros((kb, m_stride), dtype=np.float32)
    storage[:, :m] = values.T
    return torch.from_numpy(storage).to(device)[:, :m].t()


@dataclass
class TorchProblem:
    """The inputs on the GPU as torch tensors, in our layout (sa M-major, M padded to 4)."""
    a: object
    sa: object
    b: object
    sb: object
    out: object

    @classmethod
    def from_host(cls, a, sa, b, sb, device="cuda"):
        import torch
        m, n = a.shape[0], b.shape[0]
        return cls(torch_fp8(a, device), torch_m_major(sa, device, align(m, 4)), torch_fp8(b, device),
                   torch.from_numpy(np.ascontiguousarray(sb, dtype=np.float32)).to(device),
                   torch.empty((m, n), dtype=torch.bfloat16, device=device))


def torch_bits(tensor) -> np.ndarray:
    import torch
    return tensor.view(torch.int16).cpu().numpy().view(np.uint16)


def poison_torch(tensor) -> None:
    tensor.fill_(float("nan"))


MASKED_CAPACITY = 128  # a masked slab's rows (M_max): DeepGEMM's masked kernel needs M_max % BLOCK_M == 0 (64, 128)


def masked_capacity(m: int) -> int:
    """M_max of a masked problem of ``m`` rows per group: ``m`` rounded up to MASKED_CAPACITY, as a dispatcher pads
    each expert's slab (DeepGEMM's six masked shapes are multiples already; decode's 16-32 tokens sit in 128-row
    slabs)."""
    return ceil_div(m, MASKED_CAPACITY) * MASKED_CAPACITY


def masked_rows_in_use(out, counts):
    """The rows a masked grouped GEMM defines, ``out[g, :counts[g]]`` for every group, as one (sum counts, N) tensor:
    what a check reads (rows past a group's count are not the kernel's to write)."""
    import torch
    return torch.cat([out[g, :int(count)] for g, count in enumerate(counts)])


def grouped_inputs(layout: str, groups: int, m: int, n: int, k: int, device="cuda"):
    """Quantized on the GPU (gemm's torch casts): a (G*m, K) or (G, m, K) with its scales in the kernel's layout,
    b (G, N, K), sb (G, ceil(N/128), K/128)."""
    import torch
    from gemm.grouped import masked_sa_to_mn_major
    x = torch.randn((groups * m, k), device=device)
    a, sa = per_token_cast_to_fp8(x, mn_major=layout == "contiguous")
    del x
    if layout == "masked":
        a, sa = a.view(groups, m, k), masked_sa_to_mn_major(sa.view(groups, m, -1))
    bs, sbs = zip(*(per_block_cast_to_fp8(torch.randn((n, k), device=device)) for _ in range(groups)))
    b = torch.stack([x.view(torch.uint8) for x in bs]).view(torch.float8_e4m3fn)  # stacked as bytes
    return a, sa, b, torch.stack(sbs)


__all__ = ["BF16_NAN_BITS", "DIFF_LIMIT", "random_problem", "reference_gemm", "flops", "gemm_bytes", "Reference",
           "reference_rows", "check_output", "check_rows", "torch_output_parts", "DeviceProblem", "device_problem",
           "mn_major_view", "checked_run", "TorchProblem", "grouped_inputs", "torch_available", "torch_fp8",
           "torch_m_major", "torch_bits", "poison_torch", "masked_rows_in_use",
           "masked_capacity", "MASKED_CAPACITY"]
