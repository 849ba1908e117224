"""DeepGEMM as a benchmark peer: one release tree per process, fed the same inputs and timed with the same timer.

Both DeepGEMM releases we compare against (``../shared/peers/``: 2504 and 2507) are packages named ``deep_gemm``,
so each runs in its own child process (:class:`DeepGemmProcess`), with its tree first on ``PYTHONPATH`` and its
own JIT cache. The parent keeps the order: it sends a problem's operands (host arrays: the same bytes ours and
cuBLAS get), asks for a checked call, then for timings one at a time, interleaved with ours and cuBLAS; only one
process uses the GPU at a time. The child times with :func:`gemm.testing.timer.bench_kernel`, the one timer.

DeepGEMM compiles each kernel on first use (nvcc, 10-20 s): :func:`warm` compiles a run's kernels first, in
parallel processes that fill the same caches, so the timing children only load them.

    python -m gemm.testing.deepgemm_peer serve FD     # the child (started by DeepGemmProcess)
    python -m gemm.testing.deepgemm_peer warm JOBS    # a warm-up child (started by warm)
    PYTHONPATH=/tmp/peers/deepgemm-2504:. python -m gemm.testing.deepgemm_peer once M N K   # ncu's target:
        # compile, then one more call (profile it with ncu --launch-skip 1 -k regex:fp8_gemm)
    PYTHONPATH=/tmp/peers/deepgemm-2507:. python -m gemm.testing.deepgemm_peer graph M N K  # the same call in the
        # timer's graph, after its flushes (ncu --graph-profiling node --cache-control none -k regex:fp8_gemm)
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from gemm.testing.timer import torch_launch

REPLY_TIMEOUT_S = 900  # a first call may JIT-compile (nvcc: 10-20 s; more with many warm-ups sharing the CPUs)
API = {"dense": "gemm_fp8_fp8_bf16_nt", "contiguous": "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
       "masked": "m_grouped_gemm_fp8_fp8_bf16_nt_masked", "wgrad": "wgrad_gemm_fp8_fp8_fp32_nt",
       "k_grouped_wgrad": "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt"}  # the last two: DeepGEMM 2507 on


@dataclass(frozen=True)
class DeepGemmTree:
    """A DeepGEMM source tree (the folder holding ``deep_gemm/``) and the name its columns get."""
    name: str
    path: Path


def parse_deepgemm(text: str) -> DeepGemmTree:
    """ "deepgemm-2504=/tmp/peers/deepgemm-2504" (or just the path: the folder's name is the name)."""
    name, _, path = text.rpartition("=") if "=" in text else ("", "", text)
    path = Path(path).expanduser().resolve()
    if not (path / "deep_gemm" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(
            f"--deepgemm {text!r}: expected NAME=FOLDER where FOLDER holds deep_gemm/__init__.py (a DeepGEMM release "
            "tree, e.g. deepgemm-2504=/tmp/peers/deepgemm-2504 after `tar xzf ../shared/peers/deepgemm-v1.tgz -C "
            "/tmp/peers`)")
    return DeepGemmTree(name or path.name, path)


def _child_environment(tree: DeepGemmTree, cache_root: Path | None) -> dict:
    """The tree first on PYTHONPATH (then the folder holding ``gemm``), its own JIT cache (2504 and 2507 name the
    variable differently)."""
    env = dict(os.environ)
    library_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree.path), library_root, env.get("PYTHONPATH", "")) if p)
    root = cache_root or Path(os.environ.get("FP8LADDER_CACHE_DIR", Path.home() / ".cache" / "fp8-ladder"))
    cache = Path(root) / "deepgemm" / tree.name
    cache.mkdir(parents=True, exist_ok=True)
    env["DG_CACHE_DIR"] = env["DG_JIT_CACHE_DIR"] = str(cache)
    return env


class DeepGemmProcess:
    """One DeepGEMM tree served by a child process over a private socket pair.

    ``load(key, problem)`` sends a problem (:func:`dense_payload`, :func:`grouped_payload`); ``check(key, rows)``
    runs it once into a NaN-poisoned output and returns (NaN count, BF16 bits of ``rows``); ``time(key, flush)``
    returns the timer's fields. A child's failure comes back as a RuntimeError naming the tree, never as a hang.
    """

    def __init__(self, tree: DeepGemmTree, *, device: int | str = 0, cache_root: Path | None = None):
        self.tree = tree
        parent_end, child_end = socket.socketpair()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "gemm.testing.deepgemm_peer", "serve", str(child_end.fileno()), str(device)],
            env=_child_environment(tree, cache_root), pass_fds=(child_end.fileno(),))
        child_end.close()
        self._connection = Connection(parent_end.detach())
        try:
            self.version = self._request("hello")
        except RuntimeError:
            self.close()
            raise

    def _request(self, *message):
        try:
            self._connection.send(message)
            if not self._connection.poll(REPLY_TIMEOUT_S):
                raise TimeoutError(f"no reply in {REPLY_TIMEOUT_S} s")
            status, value = self._connection.recv()
        except (EOFError, OSError, TimeoutError) as error:
            try:
                code = self._process.wait(5)
            except subprocess.TimeoutExpired:
                code = None
            raise RuntimeError(f"{self.tree.name} ({self.tree.path}): the DeepGEMM process "
                               f"{'exited with ' + str(code) if code is not None else 'stopped answering'} "
                               f"({type(error).__name__})") from error
        if status != "ok":
            raise RuntimeError(f"{self.tree.name}: {value}")
        return value

    def load(self, key, problem: dict) -> None:
        self._request("load", key, problem)

    def check(self, key, rows) -> tuple[int, np.ndarray]:
        return self._request("check", key, np.asarray(rows))

    def time(self, key, flush: str = "memset") -> dict:
        return self._request("time", key, flush)

    def drop(self, key) -> None:
        self._request("drop", key)

    def close(self) -> None:
        if self._process.poll() is None:
            try:
                self._request("quit")
            except RuntimeError:
                pass
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                self._process.kill()
        self._connection.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -------------------------------------------------------------------------------------------- payloads
def dense_payload(a, sa, b, sb) -> dict:
    """Host operands in the gemm.fp8 contract -> what a DeepGEMM child builds its tensors from."""
    return {"kind": "dense", "a": np.ascontiguousarray(a).view(np.uint8), "sa": np.ascontiguousarray(sa, np.float32),
            "b": np.ascontiguousarray(b).view(np.uint8), "sb": np.ascontiguousarray(sb, np.float32)}


def grouped_payload(layout: str, a, sa, b, sb, layout_array, expected_m: int | None = None) -> dict:
    """Grouped operands as host arrays: a (G*m, K) or (G, m, K) bytes, sa its (rows, K/128) values row-major,
    b (G, N, K) bytes, sb (G, N/128, K/128), and m_indices (contiguous) or masked_m + expected_m (masked)."""
    payload = {"kind": layout, "a": np.ascontiguousarray(a).view(np.uint8), "sa": np.ascontiguousarray(sa, np.float32),
               "b": np.ascontiguousarray(b).view(np.uint8), "sb": np.ascontiguousarray(sb, np.float32),
               "layout_array": np.ascontiguousarray(layout_array, np.int32)}
    if layout == "masked":
        payload["expected_m"] = int(expected_m)
    return payload


def wgrad_payload(a, sa_t, b, sb_t, k_sizes: list[int] | None = None, groups: int = 1) -> dict:
    """A weight-gradient problem as host arrays: a, b e4m3 bytes ((M, K), or flat for k-grouped), and their 1x128
    scales transposed, (Kb, M) and (Kb, N) (sum of the groups' Kb rows, k-grouped): DeepGEMM 2507's k-grouped
    layout, which both its wgrad functions read without a conversion kernel. D starts as :func:`wgrad_residual`."""
    payload = {"kind": "wgrad" if k_sizes is None else "k_grouped_wgrad",
               "a": np.ascontiguousarray(a).view(np.uint8), "sa": np.ascontiguousarray(sa_t, np.float32),
               "b": np.ascontiguousarray(b).view(np.uint8), "sb": np.ascontiguousarray(sb_t, np.float32),
               "m": int(sa_t.shape[1]), "n": int(sb_t.shape[1]), "groups": groups}
    if k_sizes is not None:
        payload["k_sizes"] = [int(k) for k in k_sizes]
    return payload


def wgrad_residual(torch, shape, device):
    """What a wgrad check's D holds before the call, made alike in every process without sending it: small
    integers that vary along both axes (an element the kernel never adds into keeps a value the check rejects)."""
    rows, cols = shape[-2], shape[-1]
    base = (torch.arange(rows, device=device)[:, None] * 7 + torch.arange(cols, device=device)[None, :] * 13) % 17
    return (base.float() - 8).expand(*shape).contiguous()


# -------------------------------------------------------------------------------------------- the child
class _Loaded:
    """A problem on the child's GPU in DeepGEMM's layouts (sa transposed for TMA outside the timed call, as its
    README asks), with the one call it times."""

    def __init__(self, deep_gemm, torch, payload: dict, device: str):
        self.torch = torch
        self.counts = None  # masked: each group's count of rows in use
        kind = payload["kind"]

        def fp8(host):
            return torch.from_numpy(host).to(device).view(torch.float8_e4m3fn)

        a, b = fp8(payload["a"]), fp8(payload["b"])
        if kind in ("wgrad", "k_grouped_wgrad"):
            self._wgrad(deep_gemm, torch, payload, device, a, b)
            return
        sa = deep_gemm.get_col_major_tma_aligned_tensor(torch.from_numpy(payload["sa"]).to(device))
        sb = torch.from_numpy(payload["sb"]).to(device)
        n = b.shape[-2]
        self.out = torch.empty((*a.shape[:-1], n), dtype=torch.bfloat16, device=device)
        function = getattr(deep_gemm, API[kind])
        if kind == "dense":
            self._call = lambda: function((a, sa), (b, sb), self.out)
        elif kind == "contiguous":
            m_indices = torch.from_numpy(payload["layout_array"]).to(device)
            self._call = lambda: function((a, sa), (b, sb), self.out, m_indices)
        else:
            masked_m, expected_m = torch.from_numpy(payload["layout_array"]).to(device), payload["expected_m"]
            self._call = lambda: function((a, sa), (b, sb), self.out, masked_m, expected_m)
            self.counts = payload["layout_array"]  # rows past a group's count are not the kernel's to write
        self._launch = torch_launch(lambda: self._call())

    def _wgrad(self, deep_gemm, torch, payload: dict, device: str, a, b) -> None:
        sa, sb = (torch.from_numpy(payload[name]).to(device) for name in ("sa", "sb"))
        groups, m, n = payload["groups"], payload["m"], payload["n"]
        shape = (groups, m, n) if payload["kind"] == "k_grouped_wgrad" else (m, n)
        self.reset = lambda: self.out.copy_(wgrad_residual(torch, shape, device))
        self.out = torch.empty(shape, dtype=torch.float32, device=device)
        function = getattr(deep_gemm, API[payload["kind"]])
        if payload["kind"] == "wgrad":
            self._call = lambda: function((a, sa), (b, sb), self.out)
        else:
            sizes = payload["k_sizes"]
            self._call = lambda: function((a, sa), (b, sb), self.out, sizes)
        self._launch = torch_launch(lambda: self._call())

    def launch(self, stream: int) -> None:
        self._launch(stream)

    def check(self, rows):
        from gemm.testing.problems import poison_torch, torch_output_parts, torch_output_values
        if self.out.dtype == self.torch.float32:  # wgrad: D += A*B^T from the residual; the rows' FP32 values
            self.reset()
            self.launch(self.torch.cuda.current_stream().cuda_stream)
            self.torch.cuda.synchronize()
            return torch_output_values(self.out, rows)
        poison_torch(self.out)
        if self.out.is_cuda:
            self.launch(self.torch.cuda.current_stream().cuda_stream)
            self.torch.cuda.synchronize()
        else:  # a CPU stand-in for DeepGEMM (the tests' fake tree): nothing to enqueue on
            self._call()
        if self.counts is not None:
            from gemm.testing.problems import masked_rows_in_use
            return torch_output_parts(masked_rows_in_use(self.out, self.counts), rows)
        return torch_output_parts(self.out, rows)


def serve(fd: int, device: str) -> int:
    """The child's loop: one request at a time until "quit"; every failure is a reply, never an exit.
    ``device``: a CUDA ordinal, or "cpu" for a CPU stand-in tree (loads and checks; it cannot be timed)."""
    connection = Connection(fd)
    try:
        import torch
        on_cpu = device == "cpu"
        if not on_cpu:
            device = int(device)
            torch.cuda.set_device(device)
        import deep_gemm
    except Exception as error:  # every request gets the reason, so the parent can say it
        reason = f"importing deep_gemm failed: {type(error).__name__}: {error}"
        while True:
            try:
                op, *_ = connection.recv()
            except EOFError:
                return 1
            connection.send(("error", reason))
            if op == "quit":
                return 1
    from gemm.testing.timer import bench_kernel
    loaded: dict = {}

    def drop(key) -> None:
        loaded.pop(key, None)
        if not on_cpu:
            torch.cuda.empty_cache()

    handlers = {
        "hello": lambda: f"deep_gemm from {Path(deep_gemm.__file__).parent}",
        "load": lambda key, payload: loaded.__setitem__(
            key, _Loaded(deep_gemm, torch, payload, "cpu" if on_cpu else f"cuda:{device}")),
        "check": lambda key, rows: loaded[key].check(rows),
        "time": lambda key, flush="memset": asdict(bench_kernel(loaded[key].launch, device=device, flush=flush)),
        "drop": drop,
        "quit": lambda: None,
    }
    while True:
        try:
            op, *args = connection.recv()
        except EOFError:  # the parent is gone
            return 0
        try:
            connection.send(("ok", handlers[op](*args)))
        except Exception as error:  # a reply, so the parent can name the tree and go on
            connection.send(("error", f"{type(error).__name__}: {error}"))
        if op == "quit":
            return 0


# -------------------------------------------------------------------------------------------- warm-up
def _warm_jobs(jobs: list[list], calls: int = 1) -> int:
    """Compile the kernels of ``jobs`` ([kind, G, M, N, K], G = 1 for dense) by calling each ``calls`` times on
    random data."""
    import torch
    import deep_gemm
    from gemm.testing.problems import masked_capacity
    failures = 0
    for kind, groups, m, n, k in jobs:
        if kind == "wgrad":  # one kernel per (M, N, K) in DeepGEMM 2507 (its K is a template argument)
            failures += _warm_wgrad(deep_gemm, torch, m, n, k, calls)
            continue
        try:
            rows = m * groups if kind == "contiguous" else m
            a_shape = (groups, masked_capacity(m), k) if kind == "masked" else (rows, k)
            a = torch.randn(a_shape, device="cuda").to(torch.float8_e4m3fn)
            sa = deep_gemm.get_col_major_tma_aligned_tensor(torch.ones((*a_shape[:-1], k // 128), device="cuda"))
            b_shape = (n, k) if kind == "dense" else (groups, n, k)
            b = torch.randn(b_shape, device="cuda").to(torch.float8_e4m3fn)
            sb = torch.ones((*b_shape[:-2], (n + 127) // 128, k // 128), device="cuda")
            out = torch.empty((*a_shape[:-1], n), dtype=torch.bfloat16, device="cuda")
            function = getattr(deep_gemm, API[kind])
            for _ in range(calls):
                if kind == "dense":
                    function((a, sa), (b, sb), out)
                elif kind == "contiguous":
                    function((a, sa), (b, sb), out,
                             torch.arange(groups, device="cuda", dtype=torch.int32).repeat_interleave(m))
                else:
                    function((a, sa), (b, sb), out, torch.full((groups,), m, device="cuda", dtype=torch.int32), m)
                torch.cuda.synchronize()
        except Exception as error:  # the timing child will meet (and report) the same failure
            print(f"warm {kind} {groups}x{m}x{n}x{k}: {type(error).__name__}: {error}", file=sys.stderr)
            failures += 1
    return failures


def _warm_wgrad(deep_gemm, torch, m: int, n: int, k: int, calls: int) -> int:
    try:
        kb = (k + 127) // 128
        a = torch.randn((m, k), device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn((n, k), device="cuda").to(torch.float8_e4m3fn)
        sa, sb = torch.ones((kb, m), device="cuda"), torch.ones((kb, n), device="cuda")
        out = torch.zeros((m, n), device="cuda")
        for _ in range(calls):
            getattr(deep_gemm, API["wgrad"])((a, sa), (b, sb), out)
            torch.cuda.synchronize()
        return 0
    except Exception as error:
        print(f"warm wgrad {m}x{n}x{k}: {type(error).__name__}: {error}", file=sys.stderr)
        return 1


def warm(trees: list[DeepGemmTree], jobs: list[tuple], *, processes: int | None = None,
         cache_root: Path | None = None, timeout_s: float = 900) -> list[str]:
    """Compile every job's kernel for every tree ahead of timing, ``processes`` children at once (default: the
    CPU count); returns a line per child that failed or timed out (the timing children then compile and report)."""
    if not trees or not jobs:
        return []
    processes = max(1, processes or os.cpu_count() or 1)
    per_tree = max(1, processes // len(trees))
    children = []
    for tree in trees:
        for part in range(min(per_tree, len(jobs))):
            share = [list(job) for job in jobs[part::per_tree]]
            children.append((tree, subprocess.Popen(
                [sys.executable, "-m", "gemm.testing.deepgemm_peer", "warm", json.dumps(share)],
                env=_child_environment(tree, cache_root))))
    problems = []
    for tree, child in children:
        try:
            if child.wait(timeout_s):
                problems.append(f"{tree.name}: a warm-up child exited with {child.returncode}")
        except subprocess.TimeoutExpired:
            child.kill()
            problems.append(f"{tree.name}: a warm-up child ran past {timeout_s:.0f} s")
    return problems


def start_peers(trees: list[DeepGemmTree], jobs: list[tuple], *, warm_processes: int | None = None) -> list:
    """Compile ``jobs``' kernels for every tree (:func:`warm`), then start one :class:`DeepGemmProcess` per tree; a
    tree that cannot start is reported and left out (the run goes on without it)."""
    import time
    if trees:
        started = time.perf_counter()
        for problem in warm(trees, jobs, processes=warm_processes):
            print(f"warm-up: {problem}")
        print(f"DeepGEMM kernels compiled in {time.perf_counter() - started:.0f} s")
    processes = []
    for tree in trees:
        try:
            processes.append(DeepGemmProcess(tree))
        except RuntimeError as error:
            print(f"{tree.name}: not timed: {error}")
    return processes


def time_in_graph(m: int, n: int, k: int) -> int:
    """This tree's dense call on fresh inputs, timed once by the bench's timer (4 pairs of memset flush and call):
    ncu's target when the kernel is to be profiled where the timer runs it, right after a flush inside the graph
    (``ncu --graph-profiling node --cache-control none``). Prints the timer's result."""
    from ptx.device import is_hopper
    if not is_hopper():
        print("deepgemm_peer graph times DeepGEMM's sm_90a kernels: it needs a Hopper GPU (none found)",
              file=sys.stderr)
        return 2
    import torch
    import deep_gemm
    from gemm.testing.problems import random_problem
    from gemm.testing.timer import bench_kernel
    a, sa, b, sb = random_problem(m, n, k)
    loaded = _Loaded(deep_gemm, torch, dense_payload(a, sa, b, sb), f"cuda:{torch.cuda.current_device()}")
    print(f"{m}x{n}x{k}: {bench_kernel(loaded.launch, pairs=4, reps=1)}")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        return serve(int(argv[1]), argv[2])
    if argv[:1] == ["warm"]:
        return 1 if _warm_jobs(json.loads(argv[1])) else 0
    if argv[:1] == ["once"]:
        m, n, k = map(int, argv[1:4])
        return 1 if _warm_jobs([["dense", 1, m, n, k]], calls=2) else 0
    if argv[:1] == ["graph"]:
        return time_in_graph(*map(int, argv[1:4]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["DeepGemmTree", "DeepGemmProcess", "parse_deepgemm", "dense_payload", "grouped_payload", "wgrad_payload",
           "wgrad_residual", "warm", "start_peers"]
