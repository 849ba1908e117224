"""The peers a benchmark times beside ours, on the same inputs and with the same timer.

:class:`CublasBlockwise`: cuBLAS's DeepSeek-style blockwise FP8 GEMM through ``torch._scaled_mm`` (1x128 activation
and 128x128 weight scales). A peer is a comparison, not the thing under test: :func:`time_peer` turns its failure
into a row field, never an exception.
"""
from __future__ import annotations

import numpy as np

from gemm.fp8 import align
from gemm.testing.problems import (Reference, check_output, flops, gemm_bytes, poison_torch, torch_bits, torch_fp8,
                                   torch_m_major)
from gemm.testing.timer import bench_kernel, torch_launch


class CublasBlockwise:
    """torch._scaled_mm with 1x128 activation and 128x128 weight scales: cuBLAS's DeepSeek-style FP8 GEMM.

    torch's layout rules (ScaledBlas.cpp): mat2 is B^T, (K, N) column-major; scale_a is (M, K/128) with
    strides (1, M) exactly (unpadded, unlike ours); scale_b is (K/128, N/128) column-major, i.e. sB^T, whose
    leading dimension some torch versions want padded to a multiple of 4. We try both and keep what works.
    All tensors, the output included, are allocated here, so a launch allocates nothing (graph-safe).
    """

    name = "cuBLAS blockwise (torch._scaled_mm)"

    def __init__(self, a, sa, b, sb, device="cuda"):
        import torch
        self.torch = torch
        m, n = a.shape[0], b.shape[0]
        self.a = torch_fp8(a, device)
        self.mat2 = torch_fp8(b, device).t()
        self.scale_a = torch_m_major(sa, device, m)
        nb, kb = np.asarray(sb).shape
        padded_kb = torch_m_major(np.asarray(sb).T, device, align(kb, 4))  # (Kb, Nb), strides (1, align(Kb, 4))
        plain_kb = torch_m_major(np.asarray(sb).T, device, kb)
        self.out = torch.empty((m, n), dtype=torch.bfloat16, device=device)
        self._launch = torch_launch(self._scaled_mm)
        errors = []
        for scale_b in (padded_kb, plain_kb):
            self.scale_b = scale_b
            try:
                self.launch(torch.cuda.current_stream().cuda_stream)
                torch.cuda.synchronize()
                return
            except RuntimeError as error:
                errors.append(str(error).splitlines()[0])
        raise RuntimeError("torch._scaled_mm refused both blockwise scale layouts: " + " | ".join(errors))

    def launch(self, stream: int) -> None:
        self._launch(stream)

    def _scaled_mm(self) -> None:
        torch = self.torch
        torch._scaled_mm(self.a, self.mat2, self.scale_a, self.scale_b, out_dtype=torch.bfloat16, out=self.out)

    def checked_run(self, reference: Reference) -> dict:
        poison_torch(self.out)
        self.launch(self.torch.cuda.current_stream().cuda_stream)
        self.torch.cuda.synchronize()
        return check_output(torch_bits(self.out), reference)


def time_peer(a, sa, b, sb, reference: Reference) -> dict:
    """Checked + timed cuBLAS row fields (peer_*); an error becomes peer_error, never an exception."""
    try:
        peer = CublasBlockwise(a, sa, b, sb)
        check = peer.checked_run(reference)
        timing = bench_kernel(peer.launch)
    except Exception as error:  # the peer is a comparison, not the thing under test
        return {"peer_error": f"{type(error).__name__}: {error}"}
    m, n, k = a.shape[0], b.shape[0], a.shape[1]
    return {"peer_us": timing.median_us, "peer_tflops": timing.tflops(flops(m, n, k)),
            "peer_gbps": timing.gbps(gemm_bytes(m, n, k)), "peer_diff": check["diff"],
            "peer_correct": check["correct"]}


__all__ = ["CublasBlockwise", "time_peer"]
