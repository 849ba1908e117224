"""Seams for the course exercises (:mod:`lessons.exercises`): where a student's function replaces the generator's own.

Outside a ``with hole_override(...)`` block nothing changes: every seam falls back to the generator's own code and
the PTX is byte-identical. Inside it, the named functions are read by the emitters that own them:

* ``pipeline_slot`` / ``producer_wait_parity`` (stage 06, ``lessons/06_tma_pipeline.py``): the ring's first
  (stage, parity) counters, consumer's and producer's, and the stages of the prologue loads;
* ``producer_warpgroup`` (stage 07, :meth:`gemm.kernel.generator._Kernel.warp_specialized_body`): the index of the
  producer warpgroup, first (0) or last (= the math warpgroup count, the generator's own choice);
* ``tile_coords`` with ``rows`` (stage 08, :meth:`gemm.kernel.scheduler.TileScheduler._coords`): the tile ->
  (m block, n block) map, emitted as a table for the M = ``rows`` the kernel will run at (M is a run-time value,
  a Python function is not: the table is the function evaluated on every tile);
* ``empty_arrivals`` (stage 09, :meth:`gemm.kernel.generator._Kernel.setup`): the empty barrier's arrival count,
  ``empty_arrivals(multicast, math_warps)``;
* ``ffma_rule`` (stage 10, :func:`gemm.kernel.launch.cubin`): the FFMA selection rule the cubin pass applies to
  every run (:func:`ptx.passes.choose_flips` takes a callable).

``generate``'s cache is cleared on entering and leaving the block, so no overridden kernel outlives it (and no
default one is reused inside it); :func:`gemm.kernel.launch.kernel` is cached too, so a launch with a hole goes
through :func:`gemm.kernel.launch.cubin` and ``ptx.runtime.load_kernel`` instead.
"""
from __future__ import annotations

from contextlib import contextmanager

KNOWN = ("pipeline_slot", "producer_wait_parity", "producer_warpgroup", "tile_coords", "rows", "empty_arrivals",
         "ffma_rule")
_ACTIVE: dict[str, object] = {}


def hole(name: str, default=None):
    """The function plugged into seam ``name``, or ``default`` (the generator's own) outside an override."""
    if name not in KNOWN:
        raise KeyError(f"no seam {name!r}; seams: {KNOWN}")
    return _ACTIVE.get(name, default)


@contextmanager
def hole_override(**functions):
    """``with hole_override(tile_coords=student_fn, rows=m): generate(config, n, k)``."""
    unknown = sorted(set(functions) - set(KNOWN))
    if unknown:
        raise KeyError(f"no seam {unknown}; seams: {KNOWN}")
    from gemm.kernel.generator import generate
    saved = dict(_ACTIVE)
    _ACTIVE.update(functions)
    generate.cache_clear()
    try:
        yield
    finally:
        _ACTIVE.clear()
        _ACTIVE.update(saved)
        generate.cache_clear()


__all__ = ["hole", "hole_override", "KNOWN"]


class HoledKernel:
    """A generated stage's kernel with holes plugged in, as a :class:`lessons.exercises.Candidate`.

    ``config_of(m, n, k)``: the stage's config; ``seams(m, n, k)``: the ``hole_override`` keywords for that shape
    (the student's functions); ``cpu_config_of(m, n, k)``: the config the emulator runs (e.g. fewer stages, so
    the ring wraps at small K; default ``config_of``); ``sass_shape``: the (M, N, K) whose cubin :meth:`sass` disassembles;
    ``check()``: raises when the student's functions break a rule the kernel cannot show by itself (called by
    :meth:`run_cpu` and :meth:`sass`)."""

    def __init__(self, config_of, seams, *, cpu_config_of=None, sass_shape=(1000, 2112, 512),
                 check=None, sm_count_cpu: int = 3):
        self.config_of, self.seams, self.cpu_config_of = config_of, seams, cpu_config_of or config_of
        self.sass_shape, self.check, self.sm_count_cpu = sass_shape, check or (lambda: None), sm_count_cpu
        self._kernels: dict = {}
        self._cubin = None

    def run_cpu(self, a, sa, b, sb):
        from gemm.emulated import run_gemm
        self.check()
        m, k = a.shape
        n = b.shape[0]
        config = self.cpu_config_of(m, n, k)
        with hole_override(**self.seams(m, n, k)):
            return run_gemm(config, a, sa, b, sb, sm_count=self.sm_count_cpu)

    def _kernel(self, config, m: int, n: int, k: int):
        from gemm.kernel.generator import KERNEL
        from gemm.kernel.launch import cubin
        from ptx.runtime import load_kernel
        seams = self.seams(m, n, k)
        key = (config, n, k, m if "rows" in seams else None)
        if key not in self._kernels:
            with hole_override(**seams):
                self._kernels[key] = load_kernel(cubin(config, n, k), KERNEL)
        return self._kernels[key]

    def run_gpu(self, a, sa, b, sb, d, stream=None) -> None:
        """Launch on device arrays (``gemm.harness.device_problem``), asynchronous; the kernel is built (and cached
        on this candidate) on first use of a shape."""
        from gemm.heuristics import device_facts
        from gemm.kernel.config import SharedPlan
        from gemm.kernel.launch import grid, tensor_maps
        from gemm.validate import check_gemm_args
        args = check_gemm_args(a, sa, b, sb, d)
        m, n, k = args.m, args.n, args.k
        config = self.config_of(m, n, k)
        kernel = self._kernel(config, m, n, k)
        maps = tensor_maps(config, (args.a.ptr, args.b.ptr, args.sa.ptr, args.d.ptr), m, n, k, args.sa_stride)
        kernel.launch(grid(config, m, n, device_facts(args.device).sm_count), config.threads,
                      [*maps, args.sb.ptr, args.d.ptr, m], shared_bytes=SharedPlan(config, n, k).shared_bytes,
                      cluster=(config.multicast, 1, 1) if config.multicast > 1 else None, stream=stream,
                      device=args.device)

    def cubin(self):
        """The cubin at ``sass_shape`` (built once per candidate: :meth:`sass` and :meth:`resources` share it)."""
        from gemm.kernel.launch import cubin
        if self._cubin is None:
            m, n, k = self.sass_shape
            with hole_override(**self.seams(m, n, k)):
                self._cubin = cubin(self.config_of(m, n, k), n, k)
        return self._cubin

    def resources(self):
        """Registers and spills of the kernel at ``sass_shape`` (ptxas's report): a register split that starves the
        math warpgroups shows here as spills, even where the emulator (which has no register file) computes D."""
        return next(iter(self.cubin().resources.values()))

    def sass(self):
        """The SASS of the kernel at ``sass_shape`` (assembled on the CPU: ptxas and nvdisasm, no GPU)."""
        from gemm.kernel.generator import KERNEL
        from ptx.sass import disassemble
        self.check()
        return disassemble(self.cubin(), KERNEL)


__all__ += ["HoledKernel"]
