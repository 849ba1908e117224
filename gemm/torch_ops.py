"""``torch.ops.fp8_ladder.fp8_gemm_nt``: the GEMM as a PyTorch custom op, so ``torch.compile`` can keep it in a graph.

``gemm.fp8_gemm_nt`` calls this op itself when torch.compile traces it, so user code needs no change; the op can
also be called directly::

    torch.ops.fp8_ladder.fp8_gemm_nt(a, sa, b, sb, out, c, in_place)   # out = c + (a*sa)(b*sb)^T

It mutates ``out`` and returns nothing (as vLLM's DeepGEMM op does). ``c`` is None or an FP32 (M, N) addend that
is not ``out``; ``in_place=True`` adds into ``out`` itself (D += A*B), which a custom op cannot express by
passing ``out`` twice. The fake implementation only checks devices, shapes and dtypes: nothing is allocated,
``out`` already exists. The real one runs on the tensors' device (the call path of :mod:`gemm.dispatch`), under any current device. Importing this module registers the op (``import gemm`` does it when torch is already imported).
"""
from __future__ import annotations

from typing import Optional

import torch

from gemm.fp8 import ceil_div
from gemm.dispatch import run_dense

NAMESPACE = "fp8_ladder"



@torch.library.custom_op(f"{NAMESPACE}::fp8_gemm_nt", mutates_args=("out",), device_types="cuda")
def fp8_gemm_nt(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor, out: torch.Tensor,
                c: Optional[torch.Tensor] = None, in_place: bool = False) -> None:
    from gemm.torch_interop import current_raw_stream
    run_dense(a, sa, b, sb, out, out if in_place else c, current_raw_stream(out))


@fp8_gemm_nt.register_fake
def _(a, sa, b, sb, out, c=None, in_place=False) -> None:
    m, k = a.shape
    n = b.shape[0]
    named = {"a": a, "sa": sa, "b": b, "sb": sb, "out": out, **({"c": c} if c is not None else {})}
    torch._check(len({t.device for t in named.values()}) == 1, lambda: "all arguments must be on one CUDA device "
                 "(the call runs on its tensors' device), got " + ", ".join(f"{name} on {t.device}"
                                                                         for name, t in named.items()))
    torch._check(b.shape[1] == k, lambda: f"b must be (N, K) with the K of a ({k}), got {tuple(b.shape)}")
    torch._check(tuple(out.shape) == (m, n), lambda: f"out must be (M, N) = {(m, n)}, got {tuple(out.shape)}")
    torch._check(tuple(sa.shape) == (m, ceil_div(k, 128)), lambda: f"sa must be (M, K/128), got {tuple(sa.shape)}")
    torch._check(tuple(sb.shape) == (ceil_div(n, 128), ceil_div(k, 128)),
                 lambda: f"sb must be (N/128, K/128), got {tuple(sb.shape)}")
    if c is not None or in_place:
        torch._check(out.dtype == torch.float32, lambda: "out must be float32 when c is given (D = C + A*B)")
    return None


__all__ = ["fp8_gemm_nt", "NAMESPACE"]
