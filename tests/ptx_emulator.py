"""Moved to ptx/emulate/lockstep.py; this name stays for the stage tests that import it."""
from ptx.emulate.lockstep import (CTA, E4M3, EmulationError, GlobalMemory, _bf16_bits, _signed,  # noqa: F401
                                  _split_operands, _vector, run_kernel)
