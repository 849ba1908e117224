"""The production kernel generator: one configurable core (DeepGEMM's "one kernel + GemmType + scheduler").

``generate(config, n, k)`` (:mod:`.generator`) writes the PTX of a :class:`KernelConfig` (:mod:`.config`) from four
emitters: :mod:`.producer` (TMA ring), :mod:`.math` (wgmma + promotion), :mod:`.scheduler` (tile walk),
:mod:`.epilogue` (BF16 out); :mod:`.launch` caches and runs it.
"""
from .config import KernelConfig, SharedPlan  # noqa: F401
from .generator import KERNEL, generate  # noqa: F401
