"""Where the host time of one fp8_gemm_nt call goes (GPU): the hot path's pieces timed alone with timeit.

    python tools/host_profile.py [M N K]     # default 64 512 128: a kernel shorter than the host time

Prints microseconds per call for the whole call and for each piece (signature, stream lookup, the prepared
launch), so a change to the hot path can be predicted and checked piece by piece.
"""
import sys
import timeit


def main(argv=None) -> int:
    import torch

    import gemm
    from gemm import api
    from gemm.bench import TorchProblem
    from gemm.fp8 import random_problem
    m, n, k = (int(x) for x in (argv or sys.argv[1:] or (64, 512, 128)))  # a ~3 us kernel: the loop stays host-bound
    p = TorchProblem.from_host(*random_problem(m, n, k))
    lhs, rhs, out = (p.a, p.sa), (p.b, p.sb), p.out
    gemm.fp8_gemm_nt(lhs, rhs, out)
    key = api._torch_signature(p.a, p.sa, p.b, p.sb, out)
    prepared = api._PREPARED[key]
    stream = torch._C._cuda_getCurrentRawStream(0)
    pieces = {
        "fp8_gemm_nt (whole call)": lambda: gemm.fp8_gemm_nt(lhs, rhs, out),
        "signature": lambda: api._torch_signature(p.a, p.sa, p.b, p.sb, out),
        "dict lookup": lambda: api._PREPARED.get(key),
        "current raw stream": lambda: torch._C._cuda_getCurrentRawStream(0),
        "is_compiling": torch.compiler.is_compiling,
        "prepared launch": lambda: prepared(stream),
        "type check + is_compiling": lambda: type(out).__module__.startswith("torch") and torch.compiler.is_compiling(),
    }
    for name, call in pieces.items():
        for _ in range(200):
            call()
        torch.cuda.synchronize()
        number = 5000
        best = min(timeit.repeat(call, number=number, repeat=3)) / number
        torch.cuda.synchronize()
        print(f"{name:40s} {best * 1e6:8.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
