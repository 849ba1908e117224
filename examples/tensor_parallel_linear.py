"""Tensor-parallel FP8 linear layers with ``gemm.fp8_gemm_nt``, one process per GPU, checked against one device.

    NCCL_NVLS_ENABLE=0 torchrun --nproc_per_node=2 examples/tensor_parallel_linear.py
    torchrun --nproc_per_node=2 examples/tensor_parallel_linear.py --backend gloo --one-gpu   # both ranks on GPU 0

Each rank does what a serving engine's rank does (vLLM, SGLang, Megatron): ``torch.cuda.set_device(rank)``, every GPU
still visible, its own shard of the weights on its own GPU. The library needs nothing more: a call runs on the
device of its tensors.

* **Column-parallel** (QKV / gate-up projections): the weight W (N, K) is split along N into one slice of whole
  128-row blocks per rank, each with its rows of the (N/128, K/128) block scales. Rank r computes Y[:, N_r] =
  X W_r^T in BF16; an all-gather along N rebuilds Y.
* **Row-parallel** (output / down projections): W is split along K into slices of whole 128-column groups, with
  their columns of both scale tensors (sa's K groups and sb's). Rank r computes the FP32 partial X[:, K_r] W[:, K_r]^T;
  an all-reduce (sum) gives Y. The partials stay in FP32 until the sum, so the split costs no precision.

Every rank draws the same inputs (one seed), computes the single-device result on its own GPU with the whole weight,
and compares: ``diff = 1 - 2 sum(xy) / sum(x^2 + y^2)`` (DeepGEMM's measure) against that result and against the
float64 reference of the dequantized inputs. Rank 0 prints the table and, with ``--json PATH``, writes it.
The process exits non-zero when a diff is over its limit.

NVLink multicast stays off (``NCCL_NVLS_ENABLE=0`` is set here when unset): the all-reduce needs none.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import gemm  # noqa: E402
from gemm.testing.problems import reference_gemm  # noqa: E402

BLOCK = 128  # the scales' granularity: shards are cut on whole 128-row / 128-column blocks
LIMITS = {"vs_one_device": 1e-5, "vs_float64": 1e-3}


def shard_bounds(blocks: int, world: int, rank: int) -> tuple[int, int]:
    """[first, last) block of rank's share of ``blocks`` blocks, as even as whole blocks allow."""
    base, extra = divmod(blocks, world)
    first = rank * base + min(rank, extra)
    return first, first + base + (rank < extra)


def column_parallel(x, w, rank, world):
    """Y = X W^T with W split along N: this rank's BF16 slice of Y, then an all-gather of the slices."""
    a, sa = gemm.per_token_cast_to_fp8(x, mn_major=True)
    n = w.shape[0]
    rows = column_rows(n, world, rank)
    out = torch.full((x.shape[0], rows.stop - rows.start), float("nan"), dtype=torch.bfloat16, device=x.device)
    if out.shape[1]:  # more ranks than 128-row blocks: a rank may hold none
        b, sb = gemm.per_block_cast_to_fp8(w[rows])  # = the full cast's rows: the shard's blocks are whole
        gemm.fp8_gemm_nt((a, sa), (b, sb), out)
    return gather_columns(out, [len(range(n)[column_rows(n, world, r)]) for r in range(world)])


def column_rows(n: int, world: int, rank: int) -> slice:
    """Rank's rows of W (N, K): whole 128-row blocks, the last one ragged (N need not be a multiple of 128)."""
    first, last = shard_bounds(-(-n // BLOCK), world, rank)
    return slice(min(first * BLOCK, n), min(last * BLOCK, n))


def on_backend(tensor):
    """NCCL moves device memory; gloo, host memory (used with --one-gpu, where NCCL refuses two ranks a GPU)."""
    return tensor.cpu() if dist.get_backend() == "gloo" else tensor


def gather_columns(part, widths):
    """The ranks' column slices side by side: padded to the widest (all_gather wants equal sizes), then trimmed."""
    wide = torch.zeros((part.shape[0], max(widths)), dtype=part.dtype, device=part.device)
    wide[:, :part.shape[1]] = part
    wide = on_backend(wide)
    parts = [torch.empty_like(wide) for _ in widths]
    dist.all_gather(parts, wide)
    return torch.cat([piece[:, :width] for piece, width in zip(parts, widths)], dim=1).to(part.device)


def row_parallel(x, w, rank, world):
    """Y = X W^T with W split along K: this rank's FP32 partial sum over its K groups, then an all-reduce."""
    k = x.shape[1]
    first, last = shard_bounds(k // BLOCK, world, rank)
    cols = slice(first * BLOCK, last * BLOCK)
    out = torch.zeros((x.shape[0], w.shape[0]), dtype=torch.float32, device=x.device)  # a rank with no K: adds 0
    if cols.stop > cols.start:
        out.fill_(float("nan"))  # poison: every element must be written by the GEMM
        a, sa = gemm.per_token_cast_to_fp8(x[:, cols].contiguous(), mn_major=True)
        b, sb = gemm.per_block_cast_to_fp8(w[:, cols].contiguous())
        gemm.fp8_gemm_nt((a, sa), (b, sb), out)
    total = on_backend(out)
    dist.all_reduce(total)
    return total.to(out.device)


def one_device(x, w, out_dtype):
    a, sa = gemm.per_token_cast_to_fp8(x, mn_major=True)
    b, sb = gemm.per_block_cast_to_fp8(w)
    out = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=out_dtype, device=x.device)
    gemm.fp8_gemm_nt((a, sa), (b, sb), out)
    return out, (a, sa, b, sb)


def float64_reference(a, sa, b, sb):
    host = lambda t: t.cpu().numpy()  # noqa: E731
    return reference_gemm(host(a.view(torch.uint8)), host(sa), host(b.view(torch.uint8)), host(sb))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="128,7168,2048;512,2112,7168;1000,4096,1536",
                        help='M,N,K;M,N,K (default: %(default)s)')
    parser.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    parser.add_argument("--one-gpu", action="store_true",
                        help="every rank on GPU 0, to try it on one GPU (needs --backend gloo: NCCL refuses two ranks "
                             "one GPU)")
    parser.add_argument("--seed", type=int, default=None, help="default: a fresh one, shared by the ranks")
    parser.add_argument("--json", default=None, help="rank 0 writes the results here")
    args = parser.parse_args(argv)
    if args.one_gpu and args.backend != "gloo":
        parser.error("--one-gpu needs --backend gloo (NCCL refuses two ranks on one GPU)")

    device = 0 if args.one_gpu else int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(device)  # as a serving engine does, before the process group; every GPU stays visible
    if args.backend == "nccl":
        dist.init_process_group("nccl", device_id=torch.device("cuda", device))
    else:
        dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    seed = [args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")]
    dist.broadcast_object_list(seed)
    rng = np.random.default_rng(seed[0])

    rows, ok = [], True
    for text in args.shapes.split(";"):
        m, n, k = (int(v) for v in text.split(","))
        x = torch.from_numpy(rng.standard_normal((m, k), dtype=np.float32)).to(f"cuda:{device}")
        w = torch.from_numpy(rng.standard_normal((n, k), dtype=np.float32)).to(f"cuda:{device}")
        want_bf16, operands = one_device(x, w, torch.bfloat16)
        want_f32, _ = one_device(x, w, torch.float32)
        reference = float64_reference(*operands)
        for layout, got, single in (("column", column_parallel(x, w, rank, world), want_bf16),
                                    ("row", row_parallel(x, w, rank, world), want_f32)):
            torch.cuda.synchronize(device)
            got_host = got.float().cpu().numpy()
            row = {"rank": rank, "device": device, "layout": layout, "M": m, "N": n, "K": k,
                   "unwritten": int(np.isnan(got_host).sum()),
                   "vs_one_device": float(gemm.calc_diff(got_host, single.float().cpu().numpy())),
                   "vs_float64": float(gemm.calc_diff(got_host, reference))}
            row["ok"] = row["unwritten"] == 0 and all(row[key] < limit for key, limit in LIMITS.items())
            ok &= row["ok"]
            rows.append(row)
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        every = [row for part in gathered for row in part]
        print(f"world {world} ({args.backend}), seed {seed[0]}, limits {LIMITS}")
        print(f"{'rank':>4} {'gpu':>3} {'layout':>6} {'M':>5} {'N':>6} {'K':>6} {'vs one device':>14} "
              f"{'vs float64':>11}  ok")
        for row in every:
            print(f"{row['rank']:>4} {row['device']:>3} {row['layout']:>6} {row['M']:>5} {row['N']:>6} {row['K']:>6} "
                  f"{row['vs_one_device']:>14.2e} {row['vs_float64']:>11.2e}  {row['ok']}")
        if args.json:
            facts = [torch.cuda.get_device_name(d) for d in range(torch.cuda.device_count())]
            with open(args.json, "w") as handle:
                json.dump({"world": world, "backend": args.backend, "one_gpu": args.one_gpu, "seed": seed[0],
                           "devices": facts, "limits": LIMITS, "rows": every}, handle, indent=1)
    all_ok = [None] * world
    dist.all_gather_object(all_ok, ok)
    dist.destroy_process_group()
    return 0 if all(all_ok) else 1


if __name__ == "__main__":
    sys.exit(main())
