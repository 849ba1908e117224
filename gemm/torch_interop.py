"""What the call path does with torch tensors on the device: the stream a launch is ordered with, and the scale
conversions that run on it (no host sync, safe under CUDA-graph capture). torch is imported only here, and only
when a caller passed torch tensors."""
from __future__ import annotations

from gemm.fp8 import align


def torch_stream_of(handle, device):
    """The torch stream whose work is ordered with a launch on ``handle`` (None: the legacy default stream)."""
    import torch
    from ptx.runtime import stream_handle
    default = torch.cuda.default_stream(device)
    if handle is None:
        return default
    handle = stream_handle(handle)
    current = torch.cuda.current_stream(device)
    # torch's own stream objects where they match, so that its allocator sees the stream it already knows.
    for known in (current, default):
        if handle == known.cuda_stream:
            return known
    return torch.cuda.ExternalStream(handle, device=device)


def current_raw_stream(tensor) -> int:
    """torch's current stream on ``tensor``'s device, as a handle (what a launch with no stream runs on)."""
    import torch
    return torch._C._cuda_getCurrentRawStream(tensor.get_device())


def sa_to_m_major(sa, stream=None):
    """A row-major (M, Kb) torch sa, or (G, M, Kb) for the masked layout, -> a new view of the same values stored
    M-major (per group), the K-group stride align(M, 4): one allocation and one strided copy, both on the stream the
    GEMM is launched on (``stream``: a handle or stream object; None: the legacy default stream). No host sync.

    Safe under CUDA-graph capture: the storage comes from torch's caching allocator (the graph's private pool while
    capturing) and the copy is captured with the GEMM, so each replay converts the sa then at its address. The
    storage is released when the caller drops the view; the allocator only hands that block to later work on the
    same stream, which runs after the GEMM has read it. The padding columns (M..align(M, 4)) are left unwritten:
    the kernel's sa tensor map is M wide, so TMA never reads them.
    """
    import torch
    *groups, m, kb = sa.shape
    with torch.cuda.stream(torch_stream_of(stream, sa.device)):
        storage = torch.empty((*groups, kb, align(m, 4)), dtype=torch.float32, device=sa.device)
        view = storage[..., :m].transpose(-1, -2)
        view.copy_(sa)
    return view


def copy_into(destination, source, stream) -> None:
    """destination <- source on the launch's stream (D = C + A*B starts from C)."""
    import torch
    with torch.cuda.stream(torch_stream_of(stream, destination.device)):
        destination.copy_(source)


__all__ = ["torch_stream_of", "current_raw_stream", "sa_to_m_major", "copy_into"]
