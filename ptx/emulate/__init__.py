"""CPU emulation of the PTX this project generates, on NumPy: no GPU, no CUDA, only numpy and ml_dtypes.

* :func:`run_kernel` (ptx.emulate.scheduler): each CTA as cooperatively scheduled warpgroups, for sm_90
  kernels: wgmma, mbarrier, TMA loads and stores, named barriers, warp specialization; with ``cluster=2``
  the CTAs of a thread-block cluster run together (mapa, remote mbarrier arrives, TMA multicast,
  barrier.cluster, ld/st.shared::cluster), and touching a peer CTA that has exited is an error.
* :func:`ptx.emulate.lockstep.run_kernel`: the whole CTA in lockstep (mma.sync, ldmatrix, cp.async kernels).

Modules: common (program, memory, errors), lockstep (the instruction executor), matrix (ldmatrix, stmatrix,
mma.sync), warpgroup (one warpgroup: divergence, wgmma, mbarrier, TMA), barriers, tma, scheduler.
"""
from .common import E4M3, EmulationError, GlobalMemory, Program
from .lockstep import CTA
from .scheduler import Cluster, RunStats, ScheduledCTA, run_kernel
from .tma import FakeTensorMap
from .warpgroup import Warpgroup

__all__ = ["run_kernel", "RunStats", "FakeTensorMap", "EmulationError", "GlobalMemory", "Program", "CTA",
           "ScheduledCTA", "Cluster", "Warpgroup", "E4M3"]
