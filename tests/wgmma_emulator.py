"""Moved to ptx/emulate/ (warpgroup scheduling, wgmma, mbarrier, TMA); this name stays for the stage tests."""
from ptx.emulate import CTA, E4M3, EmulationError, FakeTensorMap, GlobalMemory, Warpgroup, run_kernel  # noqa: F401
from ptx.emulate.barriers import Barrier  # noqa: F401
from ptx.emulate.common import _split_operands, _vector  # noqa: F401
