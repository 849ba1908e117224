"""Test and benchmark support for the library: nothing here is imported by ``import gemm``.

* :mod:`gemm.testing.problems`: fresh random problems, the float64 reference, the NaN poison, the output check, the
  operands on a device (Numba arrays or torch tensors);
* :mod:`gemm.testing.timer`: the one kernel timer (CUDA-graph replay of (L2 flush; call) minus the flushes);
* :mod:`gemm.testing.records`: the device a run was taken on, result files, tables;
* :mod:`gemm.testing.peers`: cuBLAS's blockwise FP8 GEMM, timed beside ours;
* :mod:`gemm.testing.emulated`: any config's kernel on the CPU PTX emulator;
* the benchmarks behind ``python -m gemm bench dense | grouped | configs | host | new-m``
  (:mod:`~gemm.testing.bench_dense`, :mod:`~gemm.testing.bench_grouped`, :mod:`~gemm.testing.bench_configs`,
  :mod:`~gemm.testing.bench_host`) and ``python -m gemm sanitize`` (:mod:`gemm.testing.sanitize`).
"""
