"""CPU emulation of the PTX this project generates, on NumPy: no GPU, no CUDA, only numpy and ml_dtypes.

* :func:`run_kernel` (ptx.emulate.warpgroup_scheduling): each CTA as cooperatively scheduled warpgroups, for sm_90
  kernels: wgmma, mbarrier, TMA loads and stores, named barriers, warp specialization; with ``cluster=2``
  the CTAs of a thread-block cluster run together (mapa, remote mbarrier arrives, TMA multicast,
  barrier.cluster, ld/st.shared::cluster, st.async), and touching a peer CTA that has exited is an error.
* :func:`ptx.emulate.lockstep.run_kernel`: the whole CTA in lockstep (mma.sync, ldmatrix, cp.async kernels).
* :func:`run_stage` (ptx.emulate.report), for learners: a ladder stage (``lessons.stage(n)``, 04 and up) on
  host operands, returning D and a :class:`Report` (what ran, how it ended: completed, deadlock, missing
  fence.proxy.async, accumulator read before wgmma.wait_group, ...); ``edit=`` one of ptx.emulate.breaks
  runs the kernel with one line broken, and the report shows the lines changed.

Modules: common (program, memory, errors), lockstep (the instruction executor), matrix (ldmatrix, stmatrix,
mma.sync), warpgroup (one warpgroup: divergence, mbarrier, named and cluster barriers), async_proxy (its wgmma,
TMA and proxy fences), barriers (the barrier objects), bulk_copies (tensor maps, TMA boxes, bulk groups),
warpgroup_scheduling (CTAs and clusters of cooperatively scheduled warpgroups, run_kernel), session (edits and
records runs), report (run_stage), breaks (the "break it" PTX edits).
"""
from . import breaks
from .bulk_copies import FakeTensorMap
from .common import E4M3, EmulationError, GlobalMemory, Program
from .lockstep import CTA
from .report import Report, run_stage
from .warpgroup import Warpgroup
from .warpgroup_scheduling import Cluster, RunStats, ScheduledCTA, run_kernel

__all__ = ["run_kernel", "run_stage", "Report", "breaks", "RunStats", "FakeTensorMap", "EmulationError",
           "GlobalMemory", "Program", "CTA", "ScheduledCTA", "Cluster", "Warpgroup", "E4M3"]
