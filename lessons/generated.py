"""What stages 07+ share: each is a :class:`gemm.kernel.KernelConfig`, the previous stage's plus one change, run
by the production generator. Nothing here writes PTX; it only derives each stage's config for a shape.

Stage 06 itself stays hand-written (``lessons/06_tma_pipeline.py``, the teaching text); :func:`stage06_config`
is the generator configured as stage 06, which a test proves gives bit-identical output to it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from gemm.kernel import KernelConfig, SharedPlan, generate as _generate
from gemm.kernel.config import max_stages


def stage06_config(m: int, n: int, k: int) -> KernelConfig:
    """The generator configured as stage 06: its block shape and stage count, thread 0 producing inline, offsets
    per thread as %tid gives them (stage 13 makes the warpgroup's warp-uniform), the full barrier polled when the
    next K block starts."""
    import lessons
    plan = lessons.stage(6).Plan(m, n, k)
    return KernelConfig(block_m=plan.block_m, block_n=plan.block_n, stages=plan.stages, producer="inline",
                        registers=None, persistent=False, raster_group=0, epilogue="staged", uniform_offsets=False,
                        early_poll=False)


@dataclass(frozen=True)
class GeneratedStage:
    """One generator stage: ``change`` applied to ``previous``'s config (stage 06's for stage 07). The ring keeps
    the previous stage's depth, cut to what fits the new tiles; ``refill(m, n, k)``, where it gives a number,
    deepens it to as many stages as fit, up to that number (a stage whose tiles shrink has room for more)."""
    number: int
    change: dict = field(default_factory=dict)
    previous: "GeneratedStage | None" = None
    refill: Callable[[int, int, int], int | None] | None = None

    def config(self, m: int, n: int, k: int) -> KernelConfig:
        base = self.previous.config(m, n, k) if self.previous else stage06_config(m, n, k)
        changed = {key: (value(m, n, k) if callable(value) else value) for key, value in self.change.items()}
        config = base.replace(**changed, stages=2)
        deepest = self.refill(m, n, k) if self.refill else None
        if deepest is not None:
            return config.replace(stages=max_stages(config, n, k, limit=deepest))
        return config.replace(stages=min(base.stages, max_stages(config, n, k)))  # the new tiles may need room

    def generate(self, m: int, n: int, k: int) -> str:
        return _generate(self.config(m, n, k), n, k)

    def emulate(self, a, sa, b, sb, *, seed: int | None = None, sm_count: int = 3):
        """This stage's kernel for host operands on the CPU emulator (gemm.testing.emulated.run_gemm): D as float32."""
        from gemm.testing.emulated import run_gemm
        m, k = a.shape
        return run_gemm(self.config(m, b.shape[0], k), a, sa, b, sb, sm_count=sm_count, seed=seed)

    def shared_bytes(self, m: int, n: int, k: int) -> int:
        return SharedPlan(self.config(m, n, k), n, k).shared_bytes

    def gemm(self, a, sa, b, sb, d, stream=None) -> None:
        from gemm.api import gemm
        gemm(a, sa, b, sb, d, stream, config=self.config)


__all__ = ["GeneratedStage", "stage06_config"]
