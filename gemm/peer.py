"""The peer every benchmark compares with: cuBLAS's blockwise FP8 GEMM through ``torch._scaled_mm``.

Same quantized inputs, same scales: 1x128 activation scales and 128x128 weight scales. cuBLAS wants them
in its own layouts (checked by torch): scale_a (M, K/128) "outer-dim-major" (M contiguous), scale_b
(K/128, N/128) for B seen as a (K, N) column-major matrix, K contiguous with its stride padded to 4.
The re-layout happens once, outside the timed region.
"""
from __future__ import annotations


def cublas_blockwise(a, sa, b, sb, out):
    """Return ``launch(stream_handle)`` computing out = (a*sa)(b*sb)^T with cuBLAS; torch tensors in.

    a (M, K), b (N, K) float8_e4m3fn; sa (M, K/128), sb (N/128, K/128) float32 (any layout); out (M, N)
    bfloat16. ``launch`` allocates nothing, so it can be captured in a CUDA graph.
    """
    import torch

    m, kb = sa.shape
    scale_a = torch.empty((kb, m), dtype=torch.float32, device=sa.device).t()
    scale_a.copy_(sa)
    nb = sb.shape[0]
    kb_padded = -(-kb // 4) * 4
    scale_b = torch.zeros((nb, kb_padded), dtype=torch.float32, device=sb.device)[:, :kb].t()
    scale_b.copy_(sb.t())
    b_t = b.t()  # (K, N) column-major: the NT product cuBLAS expects

    def launch(stream_handle=None):
        stream = torch.cuda.ExternalStream(stream_handle) if stream_handle else torch.cuda.current_stream()
        with torch.cuda.stream(stream):
            torch._scaled_mm(a, b_t, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16, out=out)

    return launch
