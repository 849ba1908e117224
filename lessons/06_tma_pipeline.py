"""Stage 06 — TMA + mbarrier pipeline: one thread asks the copy engine for whole tiles; barriers count bytes.

Stage 05 (= 04 + wgmma) still moved every operand byte with the math threads: 256 threads computed
addresses and issued 16-byte cp.async copies, then all met at a CTA barrier each K block. Hopper's Tensor
Memory Accelerator copies a whole box of a tensor (here 128 rows x 128 bytes, 128B-swizzled exactly as
wgmma wants, rows past M or N zero-filled) from one instruction, ``cp.async.bulk.tensor``, described by a
128-byte tensor map built once on the host. What changed vs stage 05:

* A and B tiles and A's scales (a box of BLOCK_M floats of the M-major scale array) arrive by TMA into a
  ring of S stages; S is as large as the 227 KiB shared-memory budget allows (up to 8);
* each stage has a *full* mbarrier (the producer arrives once with ``expect_tx`` = the stage's bytes; the
  TMA engine completes the transaction) and an *empty* mbarrier (one arrival per math warp once its
  wgmmas on the stage are finished); waits poll the phase parity (bookkeeping in :mod:`ptx.vocab.barriers`);
* no CTA-wide barrier in the K loop at all: warpgroups wait only for the bytes they need;
* the block shape follows the problem (as DeepGEMM's heuristics do, without autotuning): BLOCK_M = 64
  (one math warpgroup) when M <= 64, else 128 (two); BLOCK_N = 64 when 128-wide blocks would leave SMs
  idle, else 128 (and 64 x 64 when even 128 x 64 blocks would fill fewer than half the SMs).

The simplest correct producer, chosen on purpose: thread 0 is both a math thread and the producer. Before
computing iteration i it refills the stage of iteration j = i + S - 2 (waiting for that stage's empty barrier,
i.e. for every warp to have finished iteration j - S = i - 2); the one stage of slack means thread 0 almost never
waits for the other warpgroup. The math warpgroup body (wgmma issue, promotion, coalesced BF16 epilogue) is stage
05's, unchanged (:mod:`gemm.kernel.math_warpgroups`). Stage 07 (``lessons/07_warp_specialization.py``) then gives the
producer a warpgroup of its own, so the ring runs a full ``stages`` blocks ahead and no math warp issues a copy.

Speed of light: stage 05's, the FP8 tensor cores at 1979 TFLOP/s. This stage takes the loads and the K-loop
barrier off the math threads; the promotion and thread 0's double role remain.

Measured: 943 TFLOP/s at M=4096 N=4096 K=7168 on NVIDIA H100 80GB HBM3, 1.13x stage 05; 48% of its speed of light
(FP8 QGMMA, 1,979 TFLOP/s), 48% of the FP8 peak (results/ladder.json, `python -m lessons ladder`).
"""
from __future__ import annotations

import functools

import numpy as np

from gemm.fp8 import ceil_div
from gemm.kernel.math_warpgroups import BLOCK_K, MathWarpgroups, staging_bytes
from ptx.builder import KernelBuilder, module
from ptx.vocab import barriers, bulk_copies, core, shared_memory

IDEA = "TMA + mbarrier pipeline: one thread fetches whole swizzled tiles into a ring of stages"
KIND = "ptx"
KERNEL = "fp8_gemm_tma"

SHARED_LIMIT = 227 * 1024  # H100: the most dynamic shared memory one block may have
ALIGN_SLACK = 1024  # the dynamic shared base is aligned up to 1024 bytes at run time
MAX_STAGES = 8
SM_COUNT = 132  # H100 SXM; only used by the block-shape heuristic
SMEM = "smem"
# The tensorMap operand of cp.async.bulk.tensor is a generic address: cvta.param of the parameter's address
# (what nvcc emits for a __grid_constant__ CUtensorMap). False uses the parameter symbol's address as is.
TENSORMAP_CVTA = True


# -- shape heuristics and the shared-memory plan (pure Python) -----------------------------------------------
def choose_blocks(m: int, n: int, sm_count: int = SM_COUNT) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): one warpgroup for M <= 64, else two; narrower blocks only when the grid of 128-wide
    ones would leave SMs idle (halve BLOCK_N; and BLOCK_M too if that still fills fewer than half the SMs)."""
    def blocks(block_m: int, block_n: int) -> int:
        return ceil_div(m, block_m) * ceil_div(n, block_n)
    block_m = 64 if m <= 64 else 128
    if blocks(block_m, 128) >= sm_count:
        return block_m, 128
    if block_m == 128 and blocks(128, 64) < sm_count // 2:
        return 64, 64
    return block_m, 64


class Plan:
    """Block shape, stage count and the byte offsets of everything in dynamic shared memory."""

    def __init__(self, m: int, n: int, k: int, blocks: tuple[int, int] | None = None):
        self.m, self.n, self.k, self.kb = m, n, k, k // BLOCK_K
        self.block_m, self.block_n = blocks or choose_blocks(m, n)
        self.threads = 128 * (self.block_m // 64)
        self.math_warps = self.threads // 32
        self.a_tile, self.b_tile, self.sa_tile = self.block_m * BLOCK_K, self.block_n * BLOCK_K, 4 * self.block_m
        self.stage_bytes = self.a_tile + self.b_tile + self.sa_tile
        barrier_bytes = 2 * 8  # a full and an empty mbarrier per stage
        self.stages = min(MAX_STAGES, (SHARED_LIMIT - ALIGN_SLACK) // (self.stage_bytes + barrier_bytes))
        # tiles of one kind are contiguous: every A/B tile 1024-byte aligned, every scale tile 128-byte aligned
        self.b_region = self.stages * self.a_tile
        self.sa_region = self.b_region + self.stages * self.b_tile
        self.full_region = self.sa_region + self.stages * self.sa_tile
        self.empty_region = self.full_region + 8 * self.stages
        self.shared_bytes = self.empty_region + 8 * self.stages + ALIGN_SLACK
        self.ahead = self.stages - 2  # K blocks in flight ahead of the one being computed (one stage of slack)
        assert self.shared_bytes <= SHARED_LIMIT and self.ahead >= 1
        assert staging_bytes(self.block_m, self.block_n) <= self.b_region  # the epilogue reuses the A tiles

    @property
    def grid(self) -> tuple[int, int, int]:
        return ceil_div(self.n, self.block_n), ceil_div(self.m, self.block_m), 1


class _Gen:
    def __init__(self, plan: Plan, bookkeeping=None):
        self.p, self.bookkeeping = plan, bookkeeping
        self.b = KernelBuilder(KERNEL, params=[("tmap", "tmap_a"), ("tmap", "tmap_b"), ("tmap", "tmap_sa"),
                                               ("u64", "sb"), ("u64", "d")],
                               max_threads=plan.threads, min_blocks_per_sm=1)

    def r(self, t_="u32", hint=None):
        return self.b.reg(t_, hint)

    def emit(self, *lines):
        self.b.emit(*lines)

    def setup(self):
        e, r, p = self.emit, self.r, self.p
        self.tid, self.m0, self.n0, self.smem = (r(hint=h) for h in ("tid", "m0", "n0", "smem"))
        n_block = r(hint="nblk")
        e(f"mov.u32 {self.tid}, %tid.x;", f"mov.u32 {n_block}, %ctaid.x;",
          f"mul.lo.u32 {self.n0}, {n_block}, {p.block_n};",
          f"mov.u32 {self.m0}, %ctaid.y;", f"mul.lo.u32 {self.m0}, {self.m0}, {p.block_m};",
          shared_memory.shared_address_of(self.smem, SMEM),
          # TMA's 128B swizzle and wgmma's descriptors both assume 1024-byte aligned tiles
          f"add.u32 {self.smem}, {self.smem}, 1023;", f"and.b32 {self.smem}, {self.smem}, -1024;")
        self.tmaps = {}
        for name in ("tmap_a", "tmap_b", "tmap_sa"):
            self.tmaps[name] = r("u64", name)
            e(bulk_copies.tensormap_address(self.tmaps[name], self.b.param(name), TENSORMAP_CVTA))
        self.sb, self.d = r("u64", "ptr_sb"), r("u64", "ptr_d")
        e(f"ld.param.u64 {self.sb}, [{self.b.param('sb')}];", f"cvta.to.global.u64 {self.sb}, {self.sb};",
          f"ld.param.u64 {self.d}, [{self.b.param('d')}];", f"cvta.to.global.u64 {self.d}, {self.d};")
        # sb[n0 // 128, g]: BLOCK_N divides 128, so the whole block shares one weight-scale row
        wide, sb_row = r("u64"), r()
        e(f"shr.u32 {sb_row}, {self.n0}, 7;", f"mul.wide.u32 {wide}, {sb_row}, {p.kb * 4};",
          f"add.u64 {self.sb}, {self.sb}, {wide};")
        self.is_producer = r("pred", "p_producer")
        e(f"setp.eq.u32 {self.is_producer}, {self.tid}, 0;")
        self.math = MathWarpgroups(self.b, p.block_m, p.block_n, self.tid)

    def stage_addresses(self, stage: str | int) -> tuple[str, str, str, str, str]:
        """u32 shared addresses of ``stage``'s A tile, B tile, scale tile, full and empty barrier."""
        e, p = self.emit, self.p
        names = ("a_tile", "b_tile", "sa_tile", "full", "empty")
        regions = (0, p.b_region, p.sa_region, p.full_region, p.empty_region)
        sizes = (p.a_tile, p.b_tile, p.sa_tile, 8, 8)
        out = []
        for name, region, size in zip(names, regions, sizes):
            reg = self.r(hint=name)
            if isinstance(stage, int):
                e(f"add.u32 {reg}, {self.smem}, {region + stage * size};")
            else:
                e(f"mad.lo.u32 {reg}, {stage}, {size}, {self.smem};")
                if region:
                    e(f"add.u32 {reg}, {reg}, {region};")
            out.append(reg)
        return tuple(out)

    def init_barriers(self):
        e, p = self.emit, self.p
        skip = self.b.label("init_done")
        e(f"@!{self.is_producer} bra {skip};")
        for s in range(p.stages):
            _, _, _, full, empty = self.stage_addresses(s)
            e(barriers.mbarrier_init(full, 1),  # the producer's one arrive.expect_tx; TMA brings the bytes
              barriers.mbarrier_init(empty, p.math_warps))  # one arrival per math warp
        e(barriers.fence_mbarrier_init(), barriers.fence_proxy_async(),  # initialised barriers visible to the TMA unit
          *(bulk_copies.prefetch_tensormap(x) for x in self.tmaps.values()))
        self.b.place(skip)
        e(core.bar_sync(0))

    def issue_tma(self, addresses: tuple[str, ...], k_block: str | int):
        """Producer: expect the stage's bytes on its full barrier, then three TMA copies for K block ``k_block``."""
        e, r, p = self.emit, self.r, self.p
        a_tile, b_tile, sa_tile, full, _ = addresses
        k_byte = r(hint="kx")
        e(f"shl.b32 {k_byte}, {k_block}, 7;" if isinstance(k_block, str) else f"mov.u32 {k_byte}, {k_block * BLOCK_K};")
        e(barriers.mbarrier_arrive_expect_tx(full, p.stage_bytes),
          bulk_copies.tma_load_2d(a_tile, self.tmaps["tmap_a"], k_byte, self.m0, full),
          bulk_copies.tma_load_2d(b_tile, self.tmaps["tmap_b"], k_byte, self.n0, full),
          bulk_copies.tma_load_2d(sa_tile, self.tmaps["tmap_sa"], self.m0, k_block, full))

    def main_loop(self):
        e, r, b, p = self.emit, self.r, self.b, self.p
        b.comment(f"prologue: the producer starts K blocks 0..{min(p.ahead, p.kb) - 1} (fresh stages: no waits)")
        skip = b.label("prologue_done")
        e(f"@!{self.is_producer} bra {skip};")
        # the bookkeeping of ptx.vocab.barriers, or a caller's (the stage 06 exercise: generate_for(..., bookkeeping=))
        slot, wait_parity = self.bookkeeping or (barriers.pipeline_slot, barriers.producer_wait_parity)
        for j in range(min(p.ahead, p.kb)):
            self.issue_tma(self.stage_addresses(_bit_or_stage(slot(j, p.stages)[0], p.stages)), j)
        b.place(skip)

        kb, c_stage, c_parity = r(hint="kb"), r(hint="c_stage"), r(hint="c_parity")
        j, p_stage, p_parity = r(hint="j"), r(hint="p_stage"), r(hint="p_parity")
        # pipeline_slot(0) = (0, 0); the producer's first j = ahead: stage ahead, producer_wait_parity = 1
        first_stage, first_parity = (_bit_or_stage(x, p.stages) for x in slot(0, p.stages))
        e(f"mov.u32 {kb}, 0;", f"mov.u32 {c_stage}, {first_stage};", f"mov.u32 {c_parity}, {first_parity};",
          f"mov.u32 {j}, {p.ahead};", f"mov.u32 {p_stage}, {_bit_or_stage(slot(p.ahead, p.stages)[0], p.stages)};",
          f"mov.u32 {p_parity}, {_bit_or_stage(wait_parity(p.ahead, p.stages), 2)};")
        top = b.label("k_block")
        b.place(top)

        b.comment("producer (thread 0): refill the stage of K block j = kb + ahead once every warp released it")
        no_load, ready, more, wrap = r("pred"), r("pred"), r("pred"), r("pred")
        produced = b.label("produced")
        e(f"setp.ge.or.u32 {no_load}, {j}, {p.kb}, !{self.is_producer};", f"@{no_load} bra {produced};")
        refill = self.stage_addresses(p_stage)
        e(barriers.mbarrier_wait_parity(refill[4], p_parity, ready, b.label("wait_empty")))
        self.issue_tma(refill, j)
        b.place(produced)

        b.comment("consumers: this K block's bytes have landed (full barrier phase), multiply, release the stage")
        sb_value = r("f32", "sb")
        e(f"ld.global.nc.f32 {sb_value}, [{self.sb}];", f"add.u64 {self.sb}, {self.sb}, 4;")
        a_tile, b_tile, sa_tile, full, empty = self.stage_addresses(c_stage)
        e(barriers.mbarrier_wait_parity(full, c_parity, ready, b.label("wait_full")))
        self.math.k_block(a_tile, b_tile, sa_tile, sb_value)
        lane0 = r("pred")
        e("bar.warp.sync 0xffffffff;",  # every lane's reads of the stage (wgmma, scales) precede lane 0's release
          f"setp.eq.u32 {lane0}, {self.math.lane}, 0;", f"@{lane0} {barriers.mbarrier_arrive(empty)}")

        # advance(): stage wraps at S, parity flips on the wrap (consumer and producer alike)
        for stage, parity in ((c_stage, c_parity), (p_stage, p_parity)):
            flipped = r()
            e(f"add.u32 {stage}, {stage}, 1;", f"setp.eq.u32 {wrap}, {stage}, {p.stages};",
              f"selp.u32 {stage}, 0, {stage}, {wrap};", f"xor.b32 {flipped}, {parity}, 1;",
              f"selp.u32 {parity}, {flipped}, {parity}, {wrap};")
        e(f"add.u32 {j}, {j}, 1;", f"add.u32 {kb}, {kb}, 1;",
          f"setp.lt.u32 {more}, {kb}, {p.kb};", f"@{more} bra {top};")

    def build(self) -> str:
        self.setup()
        self.init_barriers()
        self.main_loop()
        self.b.comment("epilogue: every warp is done with the stages, so the A tiles become the staging tile")
        self.emit(core.bar_sync(0))
        self.math.store(self.smem, self.d, self.m0, self.n0, self.p.m, self.p.n)
        return module([self.b], extra_globals=shared_memory.dynamic_shared_declaration(SMEM, align=1024))


def _bit_or_stage(value, bound: int) -> int:
    """A stage index (0..stages-1) or a parity (bound 2) from the bookkeeping functions, checked."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < bound:
        raise ValueError(f"expected an int in 0..{bound - 1} from the pipeline bookkeeping, got {value!r}")
    return value


def _check_shape(m: int, n: int, k: int) -> None:
    if min(m, n, k) <= 0 or k % BLOCK_K:
        raise ValueError(f"stage 06 needs M, N > 0 and K a positive multiple of {BLOCK_K}, got {m}x{n}x{k}")
    if 2 * m * n >= 2**32 or k >= 2**31:
        raise ValueError(f"stage 06 addresses D with 32-bit products: {m}x{n}x{k} is too large")


@functools.lru_cache(maxsize=None)
def generate(m: int, n: int, k: int) -> str:
    """The PTX text of the kernel specialized for (M, N, K)."""
    _check_shape(m, n, k)
    return generate_for(Plan(m, n, k))


def generate_for(plan: Plan, bookkeeping=None) -> str:
    """The PTX text for an explicit plan (tests use it to force a block shape). ``bookkeeping``: a pair
    (pipeline_slot, producer_wait_parity) like ptx.vocab.barriers's, in their place (the stage 06 exercise)."""
    return _Gen(plan, bookkeeping).build()


@functools.lru_cache(maxsize=None)
def _kernel(m: int, n: int, k: int):
    from ptx.compile import compile_ptx
    from ptx.runtime import load_kernel
    return load_kernel(compile_ptx(generate(m, n, k)), KERNEL), Plan(m, n, k)


def tensor_map_specs(plan: Plan, sa_stride: int) -> dict[str, dict]:
    """What each tensor map describes: keyword arguments of ptx.tensor_maps.tensor_map_2d (minus the pointer)."""
    m, n, k = plan.m, plan.n, plan.k
    return {
        "tmap_a": dict(dtype=np.uint8, shape=(m, k), row_stride_bytes=k, box=(plan.block_m, BLOCK_K), swizzle=128),
        "tmap_b": dict(dtype=np.uint8, shape=(n, k), row_stride_bytes=k, box=(plan.block_n, BLOCK_K), swizzle=128),
        # sa is (Kb, M) floats in memory (M-major, rows padded to sa_stride): a box is one K group's BLOCK_M
        "tmap_sa": dict(dtype=np.float32, shape=(plan.kb, m), row_stride_bytes=4 * sa_stride,
                        box=(1, plan.block_m), swizzle=0),
    }


@functools.lru_cache(maxsize=256)
def _tensor_maps(a_ptr: int, b_ptr: int, sa_ptr: int, m: int, n: int, k: int, sa_stride: int):
    """The three tensor maps of one call (host-side encoding only; cached per pointers and shape)."""
    from ptx.tensor_maps import tensor_map_2d
    specs = tensor_map_specs(Plan(m, n, k), sa_stride)
    return tuple(tensor_map_2d(ptr, **specs[name])
                 for name, ptr in (("tmap_a", a_ptr), ("tmap_b", b_ptr), ("tmap_sa", sa_ptr)))


def shared_bytes(m: int, n: int, k: int) -> int:
    """Dynamic shared memory the kernel for (M, N, K) launches with."""
    return Plan(m, n, k).shared_bytes


def gemm(a, sa, b, sb, d, stream=None) -> None:
    """D = (A*sA)(B*sB)^T, BF16 out (contract in gemm.fp8); asynchronous on ``stream``."""
    from gemm.validate import check_gemm_args
    args = check_gemm_args(a, sa, b, sb, d)
    kernel, plan = _kernel(args.m, args.n, args.k)
    maps = _tensor_maps(args.a.ptr, args.b.ptr, args.sa.ptr, args.m, args.n, args.k, args.sa_stride)
    kernel.launch(plan.grid, plan.threads, [*maps, args.sb.ptr, args.d.ptr],
                  shared_bytes=plan.shared_bytes, stream=stream)


def emulate(a, sa, b, sb, *, seed=None, blocks: tuple[int, int] | None = None, bookkeeping=None) -> np.ndarray:
    """Run this stage's generated PTX on the CPU (ptx.emulate, each CTA as cooperatively scheduled
    warpgroups, TMA through the tensor maps :func:`tensor_map_specs` describes) for host operands in the
    gemm.fp8 contract; D as float32, NaN where the kernel wrote nothing. ``seed``: pick the next warpgroup at
    random instead of round-robin; ``blocks``: force a block shape (as Plan takes it); ``bookkeeping``: as
    :func:`generate_for` takes it.
    ``ptx.emulate.run_stage(stage, ...)`` adds a report and edits."""
    from gemm.fp8 import align, bf16_to_float
    from ptx.emulate import FakeTensorMap, run_kernel
    m, k = a.shape
    n = b.shape[0]
    plan = Plan(m, n, k, blocks)
    sa_storage = np.zeros((sa.shape[1], align(m, 4)), np.float32)  # the M-major, M-padded-to-4 scale bytes
    sa_storage[:, :m] = np.asarray(sa).T
    data = {"tmap_a": np.ascontiguousarray(a).view(np.uint8), "tmap_b": np.ascontiguousarray(b).view(np.uint8),
            "tmap_sa": sa_storage}
    maps = {name: FakeTensorMap(data[name], np.dtype(spec["dtype"]), spec["shape"], spec["row_stride_bytes"],
                                spec["box"], spec["swizzle"])
            for name, spec in tensor_map_specs(plan, align(m, 4)).items()}
    d = np.full((m, n), 0x7FC0, np.uint16)  # BF16 NaN: what the kernel never writes stays NaN
    run_kernel(generate_for(plan, bookkeeping), KERNEL, plan.grid, plan.threads, plan.shared_bytes,
               dict(**maps, sb=np.ascontiguousarray(sb, np.float32), d=d), seed=seed)
    return bf16_to_float(d)
