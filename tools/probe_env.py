"""Probe the GPU machine: versions, nvJitLink/nvdisasm presence, a PTX launch via cuda.core, numba, torch peer."""
import importlib.metadata as md, os, subprocess, sys, time, traceback
import gemm  # numba shim
for pkg in ["numba-cuda", "numba", "cuda-core", "cuda-bindings", "cuda-pathfinder", "nvidia-nvjitlink", "nvidia-cuda-nvdisasm",
            "ml_dtypes", "torch", "numpy", "pytest", "pytest-timeout", "tqdm", "matplotlib", "nbclient", "ipykernel", "nbmake", "cupy-cuda13x"]:
    try: print(pkg, md.version(pkg))
    except Exception as e: print(pkg, "MISSING")
def step(name, fn):
    try: print("PASS", name, fn())
    except Exception: print("FAIL", name); traceback.print_exc()
def nvj():
    from cuda.bindings import nvjitlink
    return nvjitlink.version()
step("nvjitlink", nvj)
step("nvdisasm", lambda: subprocess.run("which nvdisasm; ls /usr/local/cuda/bin | head -50", shell=True, capture_output=True, text=True).stdout)
def core_launch():
    import numpy as np
    from cuda.core import Device, Program, ProgramOptions, LaunchConfig, launch
    dev = Device(0); dev.set_current(); s = dev.create_stream()
    ptx = """.version 8.5
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 p, .param .u32 v){ .reg .b64 %rd<4>; .reg .b32 %r<4>;
 ld.param.u64 %rd1, [p]; ld.param.u32 %r1, [v]; cvta.to.global.u64 %rd2, %rd1; mov.u32 %r2, %tid.x;
 mul.wide.u32 %rd3, %r2, 4; add.s64 %rd2, %rd2, %rd3; st.global.u32 [%rd2], %r1; ret; }"""
    mod = Program(ptx, code_type="ptx", options=ProgramOptions(arch="sm_90a")).compile("cubin")
    k = mod.get_kernel("k")
    from numba import cuda
    arr = cuda.device_array(32, dtype=np.uint32)
    launch(s, LaunchConfig(grid=1, block=32), k, arr.__cuda_array_interface__["data"][0], np.uint32(7))
    s.sync(); return arr.copy_to_host()[:4], dev.name, dev.compute_capability
step("cuda.core launch", core_launch)
def numba_kernel():
    from numba import cuda; import numpy as np
    @cuda.jit
    def f(x): x[cuda.grid(1)] += 1
    a = cuda.to_device(np.zeros(64, np.float32)); f[2,32](a); return a.copy_to_host().sum()
# numba without the shim fails on NumPy 2.5 (np.row_stack removed)
def scaled_mm():
    import torch
    M, N, K = 256, 512, 1024
    a = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn); b = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn)
    sa = torch.rand(K // 128, M, device="cuda").t()  # (M, K/128) column-major
    sb = torch.rand(K // 128, N // 128, device="cuda")  # (K/128, N/128)
    out = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    ref = (a.float() * sa.repeat_interleave(128, 1)) @ (b.float() * sb.t().repeat_interleave(128, 0).repeat_interleave(128, 1)).t()
    return out.shape, float(((out.float() - ref).norm() / ref.norm()))
step("torch._scaled_mm blockwise", scaled_mm)
print(subprocess.run("nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,driver_version --format=csv", shell=True, capture_output=True, text=True).stdout)
def peer():
    import numpy as np, torch
    from gemm.peer import cublas_blockwise
    from gemm.fp8 import random_problem, reference_gemm, calc_diff
    m, n, k = 200, 2112, 512
    a, sa, b, sb = random_problem(m, n, k)
    t = lambda x: torch.from_numpy(np.ascontiguousarray(x)).cuda()
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    f = cublas_blockwise(t(a.view(np.uint8)).view(torch.float8_e4m3fn), t(sa), t(b.view(np.uint8)).view(torch.float8_e4m3fn), t(sb), out)
    f(); torch.cuda.synchronize()
    return calc_diff(out.float().cpu().numpy(), reference_gemm(a, sa, b, sb))
step("peer", peer)
def numba_again():
    import gemm  # compat shim
    return numba_kernel()
step("numba with shim", numba_again)
