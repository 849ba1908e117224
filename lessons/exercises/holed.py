"""A generated stage's kernel with a student's functions in its seams (:mod:`gemm.kernel.seams`): the candidate
the exercises of stages 07-10 build (:mod:`lessons.exercises`).

The generator knows nothing of the course: it takes a hashable :class:`gemm.kernel.seams.Seams` value, and every
cache on the way (``generate``, ``cubin``, ``kernel``) is keyed by it. :class:`HoledKernel` turns an exercise's
functions into that value per shape (``seams(m, n, k)`` returns its fields, e.g. ``tile_coords`` with ``rows=M``).
"""
from __future__ import annotations

from gemm.kernel.seams import Seams


class HoledKernel:
    """A generated stage's kernel with holes plugged in, as a :class:`lessons.exercises.Candidate`.

    ``config_of(m, n, k)``: the stage's config; ``seams(m, n, k)``: the :class:`gemm.kernel.seams.Seams` fields for
    that shape (the student's functions); ``cpu_config_of(m, n, k)``: the config the emulator runs (default
    ``config_of``, its ring cut to ``cpu_stages`` stages when that is given, so the ring wraps at small K); ``sass_shape``: the (M, N, K) whose cubin :meth:`sass` disassembles;
    ``check()``: raises when the student's functions break a rule the kernel cannot show by itself (called by
    :meth:`run_cpu` and :meth:`sass`)."""

    def __init__(self, config_of, seams, *, cpu_config_of=None, cpu_stages: int | None = None,
                 sass_shape=(1000, 2112, 512), check=None, sm_count_cpu: int = 3):
        if cpu_config_of is None and cpu_stages is not None:
            def cpu_config_of(m, n, k):
                config = config_of(m, n, k)
                return config.replace(stages=min(config.stages, cpu_stages))
        self.config_of, self.seams, self.cpu_config_of = config_of, seams, cpu_config_of or config_of
        self.sass_shape, self.check, self.sm_count_cpu = sass_shape, check or (lambda: None), sm_count_cpu
        self._kernels: dict = {}
        self._cubin = None

    def run_cpu(self, a, sa, b, sb):
        from gemm.testing.emulated import run_gemm
        self.check()
        m, k = a.shape
        n = b.shape[0]
        config = self.cpu_config_of(m, n, k)
        return run_gemm(config, a, sa, b, sb, sm_count=self.sm_count_cpu, seams=Seams(**self.seams(m, n, k)))

    def _kernel(self, config, m: int, n: int, k: int):
        from gemm.kernel.launch import kernel
        return kernel(config, n, k, Seams(**self.seams(m, n, k)))

    def run_gpu(self, a, sa, b, sb, d, stream=None) -> None:
        """Launch on device arrays (``gemm.testing.problems.device_problem``), asynchronous; the kernel is built (and cached
        on this candidate) on first use of a shape."""
        from gemm.heuristics import device_facts
        from gemm.kernel.config import SharedPlan
        from gemm.kernel.launch import grid, kernel_arguments
        from gemm.validate import check_gemm_args
        args = check_gemm_args(a, sa, b, sb, d)
        m, n, k = args.m, args.n, args.k
        config = self.config_of(m, n, k)
        kernel = self._kernel(config, m, n, k)
        kernel.launch(grid(config, m, n, device_facts(args.device).sm_count), config.threads,
                      kernel_arguments(config, args), shared_bytes=SharedPlan(config, n, k).shared_bytes,
                      cluster=(config.multicast, 1, 1) if config.multicast > 1 else None, stream=stream,
                      device=args.device)

    def cubin(self):
        """The cubin at ``sass_shape`` (built once per candidate: :meth:`sass` and :meth:`resources` share it)."""
        from gemm.kernel.launch import cubin
        if self._cubin is None:
            m, n, k = self.sass_shape
            self._cubin = cubin(self.config_of(m, n, k), n, k, Seams(**self.seams(m, n, k)))
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


def checked_kernel(config, cpu_config, sass_shape, check=None, sm_count_cpu: int = 4) -> HoledKernel:
    """A generated stage's own kernel for an exercise whose hole is a value the kernel is built from rather than code
    plugged into it (exercises 18, 19): ``config(m, n, k)`` the stage's configs, ``cpu_config(config)`` the
    emulator's cut-down one, and ``check(config, m, n, k)`` (the exercise's) run on both before any kernel is built,
    refusing a solution whose answer is not that kernel's own. Without ``check``: the kernel as it stands (a
    scaffold, the stage before's)."""
    def config_of(m, n, k):
        chosen = config(m, n, k)
        if check is not None:
            check(chosen, m, n, k)
        return chosen

    def cpu_config_of(m, n, k):
        chosen = cpu_config(config(m, n, k))
        if check is not None:
            check(chosen, m, n, k)
        return chosen
    return HoledKernel(config_of, lambda m, n, k: {}, cpu_config_of=cpu_config_of, sass_shape=sass_shape,
                       sm_count_cpu=sm_count_cpu)


__all__ = ["HoledKernel", "checked_kernel"]
