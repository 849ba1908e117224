"""Stage 05 — warpgroup tensor cores: one ``wgmma`` multiplies a 64x128x32 e4m3 slice for 128 threads,
reading both operands straight from shared memory.

Stage 04 (= 03 + mma.sync) fed the tensor cores per warp: ldmatrix moved every fragment from shared
memory into registers, and on Hopper each e4m3 ``mma.sync`` was unpacked to f16 and run as two HMMAs at
half of FP8's rate. Hopper's native FP8 instruction is ``wgmma.mma_async``: a *warpgroup* (4 warps)
issues it, the operands stay in shared memory and are described by 64-bit *matrix descriptors* (start
address, row-group stride, swizzle mode), and it runs asynchronously until ``wgmma.wait_group``. What
changed vs stage 04:

* no ldmatrix and no A/B registers: per K block, each of the two math warpgroups issues four
  ``wgmma.m64n128k32.f32.e4m3.e4m3`` (SASS: ``QGMMA.64x128x32.F32.E4M3.E4M3``) over its 64 rows of the
  128x128 tile; 64 FP32 accumulators per thread;
* the tiles are stored in wgmma's canonical 128-byte-swizzle layout (16-byte chunk c of row r at chunk
  c ^ (r % 8), 1024-byte aligned): the same XOR as stage 04's, now also the layout the descriptor names;
* because wgmma reads shared memory through the *async proxy*, the threads that wrote a tile with
  cp.async execute ``fence.proxy.async`` before the barrier that publishes it;
* the epilogue stages the BF16 tile through shared memory and writes it row-contiguously (coalesced).
Loads are still issued by all 256 threads with 16-byte ``cp.async`` into a 4-stage ring (as in stage 04);
the K-block loop is a counted PTX loop (its body — four wgmmas, 64 FFMAs, the loads — is unrolled by
Python), so the code stays small for K = 16384. The math warpgroup body is shared with stage 06
(:mod:`gemm.kernel.math_warpgroups`, which every later stage shares).

Speed of light: the FP8 tensor cores, 132 SMs x 8192 flop/clk x 1.83 GHz = 1979 TFLOP/s, twice stage 04's bound.
HBM is far: A, B and D once are 93 MB, 28 us at 3.35 TB/s, against 122 us of FP8 math at 4096 x 4096 x 7168.
What stands between this kernel and the bound is what the next stages remove: the promotion (one FFMA per
accumulator per K block on CUDA cores 30x slower than the tensor cores, about 23% of the tensor time unless it
overlaps), loads issued by the math threads with a CTA barrier per K block, and per-tile prologue and epilogue.
Tiles: 1024 of 128 x 128 on 132 SMs are 7.76 waves, so even a perfect kernel of this tiling reaches 97%.

Measured: 837 TFLOP/s at M=4096 N=4096 K=7168 on NVIDIA H100 80GB HBM3, 2.72x stage 04; 42% of its speed of light
(FP8 QGMMA, 1,979 TFLOP/s), 42% of the FP8 peak (results/ladder.json, `python -m lessons ladder`).

Ablations: wgmma itself cannot be turned off (without it this is stage 04), but what comes with it can, each alone
(:class:`Options`; every variant is still a correct kernel, checked in the emulator by tests/test_ablations.py).
``swizzle=False`` uses wgmma's layout without a swizzle (8-row x 16-byte core matrices, LBO 128 and SBO 1024 in the
descriptors): one row's eight 16-byte cp.async writes then land 128 bytes apart, in the same four banks (8-way
conflicts). ``stages=3`` is stage 04's ring depth and ``stages=1`` no ring at all (load, wait, compute, barrier).
``staged_epilogue=False`` is stage 04's epilogue: 4-byte BF16-pair stores straight from the accumulators.
``wgmma_n=64`` issues two m64n64k32 per k32 step instead of one m64n128k32, each reading the A slice again. Not
switchable: fence.proxy.async (without it the kernel is wrong; see ptx.emulate.breaks.drop_proxy_fence), and wgmma's
asynchrony, which this stage does not use yet: it waits (wait_group 0) right after each commit.
`python -m lessons ablate 5` times the variants against the full stage on a GPU (on a CPU it prints their registers,
spills and SASS counts); docs/ladder.md shows the committed run.

Ablations measured: the full stage, 865 TFLOP/s at M=4096 N=4096 K=7168 on NVIDIA H100 80GB HBM3; with one idea off,
its speed as a share of that: without the 128B swizzle 0.31x (266 TFLOP/s); 3-stage ring (stage 04's) 0.96x (829
TFLOP/s); without the ring (1 stage) 0.52x (453 TFLOP/s); without the staged epilogue 0.97x (840 TFLOP/s); m64n64k32
wgmma (half width) 0.97x (837 TFLOP/s) (results/ablation_05.json, `python -m lessons ablate 5`).
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from gemm.fp8 import ceil_div
from gemm.kernel.math_warpgroups import BLOCK_K, K_STEPS, MathWarpgroups, staging_bytes
from ptx.builder import KernelBuilder, module
from ptx.vocab import async_copies, barriers, core, shared_memory
from ptx.vocab import wgmma as w

IDEA = "warpgroup tensor cores: wgmma reads e4m3 tiles from shared memory through matrix descriptors"
KIND = "ptx"
KERNEL = "fp8_gemm_wgmma"

BLOCK_M, BLOCK_N = 128, 128  # two math warpgroups of 64 rows each
THREADS = 2 * 128
STAGES = 4
A_TILE, B_TILE, SA_TILE = BLOCK_M * BLOCK_K, BLOCK_N * BLOCK_K, 4 * BLOCK_M
B_REGION = STAGES * A_TILE  # tiles of one kind are contiguous so every A/B tile stays 1024-byte aligned
SA_REGION = B_REGION + STAGES * B_TILE
OPERAND_BYTES = SA_REGION + STAGES * SA_TILE
SHARED_BYTES = OPERAND_BYTES + 1024  # slack to align the dynamic shared base to 1024 bytes (128B swizzle)
LOAD_ROWS_PER_PASS = THREADS // 8  # 8 threads x 16 bytes = one 128-byte row
SMEM = "smem"
assert staging_bytes(BLOCK_M, BLOCK_N) <= OPERAND_BYTES
# wgmma's layout without a swizzle (ablation): 8-row x 16-byte "core matrices" of 128 contiguous bytes; a tile
# row-group (8 rows) holds its 8 K chunks one after the other, LBO = 128 bytes apart along K, SBO = 1024 along M/N
CORE_LBO, CORE_SBO = 128, 1024


# -- the stage's ideas as switches (python -m lessons ablate 5) ------------------------------------------
@dataclasses.dataclass(frozen=True)
class Options:
    """Each idea this stage bundles, as a switch of the generator; the defaults are the stage as taught (and
    generate the same PTX, byte for byte). Every combination is a correct kernel (tests/test_ablations.py)."""

    swizzle: bool = True  # 128B swizzle; off: no-swizzle core matrices, the cp.async writes 8-way bank-conflicted
    stages: int = STAGES  # K blocks in the shared ring; 1: load, wait, compute, barrier (nothing overlaps)
    staged_epilogue: bool = True  # off: stage 04's epilogue, 4-byte BF16-pair stores straight from registers
    wgmma_n: int = BLOCK_N  # N of one wgmma; 64: two m64n64k32 per k32 step, each reading the A slice again

    def __post_init__(self):
        if self.stages < 1:
            raise ValueError(f"stage 05 needs at least one stage in its ring, got {self.stages}")
        if self.wgmma_n not in (64, 128):
            raise ValueError(f"stage 05's wgmma is m64n128k32 or (ablation) two m64n64k32, got N={self.wgmma_n}")
        if self.shared_bytes > 227 * 1024:  # Hopper's most dynamic shared memory per block
            raise ValueError(f"stage 05: {self.stages} stages need {self.shared_bytes} bytes of shared memory, "
                             "more than the 227 KiB a block may have")

    @property
    def threads(self) -> int:
        return THREADS

    @property
    def operand_bytes(self) -> int:
        return self.stages * (A_TILE + B_TILE + SA_TILE)

    @property
    def shared_bytes(self) -> int:
        staging = staging_bytes(BLOCK_M, BLOCK_N) if self.staged_epilogue else 0  # the epilogue reuses the ring
        return max(self.operand_bytes, staging) + 1024

    def describe(self) -> str:
        ring = f"{self.stages}-stage cp.async ring" if self.stages > 1 else "1 stage (cp.async, synchronous)"
        return (f"{ring}, m64n{self.wgmma_n}k32, {'128B swizzle' if self.swizzle else 'no swizzle'}, "
                f"{'staged' if self.staged_epilogue else 'direct'} epilogue")


DEFAULT = Options()
# Each idea of this stage turned off on its own (python -m lessons ablate 5): Options fields to change.
ABLATIONS = {"without the 128B swizzle": {"swizzle": False},
             "3-stage ring (stage 04's)": {"stages": 3},
             "without the ring (1 stage)": {"stages": 1},
             "without the staged epilogue": {"staged_epilogue": False},
             "m64n64k32 wgmma (half width)": {"wgmma_n": 64}}


def load_slot(tid: int, load_pass: int) -> tuple[int, int]:
    """(tile row, logical 16-byte chunk) thread ``tid`` copies in pass ``load_pass`` (A and B alike)."""
    return tid // 8 + LOAD_ROWS_PER_PASS * load_pass, tid % 8


def core_matrix_offset(row: int, k_byte: int) -> int:
    """Byte offset of (row, K byte) in a tile without the swizzle (ablation): the layout its descriptor names."""
    return (row // 8) * CORE_SBO + (k_byte // 16) * CORE_LBO + (row % 8) * 16 + k_byte % 16


def descriptor_constant_part(options: Options = DEFAULT, descriptor_bits=w.descriptor_bits) -> int:
    """Every field of the tiles' wgmma descriptors but the start address (which the PTX ORs in at run time), packed
    by ``descriptor_bits(start_address, leading_byte_offset, stride_byte_offset, swizzle)``: the 128B-swizzled
    K-major layout (stride 1024 bytes between 8-row groups), or the ablation's unswizzled core matrices. The hole
    of exercise 05 (lessons/exercises) is ``descriptor_bits``; with the default this is
    ``ptx.vocab.wgmma.descriptor_constant_part()``, the value the stage bakes into its PTX."""
    if options.swizzle:
        return descriptor_bits(0, w.LEADING_BYTE_OFFSET, w.SW128_ATOM_BYTES, 128)
    return descriptor_bits(0, CORE_LBO, CORE_SBO, 0)


class _Math(MathWarpgroups):
    """The math warpgroups of :mod:`gemm.kernel.math_warpgroups`, plus the two ablations that change a K block: tiles
    without the swizzle (the descriptor's layout type 0 with CORE_LBO / CORE_SBO; a k32 step is then two core
    matrices, 256 bytes, not 32) and narrower wgmmas (the B descriptor advances 128 bytes a row per part).
    With the defaults it is MathWarpgroups, unchanged."""

    def __init__(self, b: KernelBuilder, tid: str, options: Options, descriptor_bits=None):
        super().__init__(b, BLOCK_M, BLOCK_N, tid)
        self.options = options
        if not options.swizzle:
            self.constant_desc = w.descriptor_constant_part(CORE_LBO, CORE_SBO, swizzle=0)
        if descriptor_bits is not None:  # exercise 05: the student's packing of the same fields
            self.constant_desc = descriptor_constant_part(options, descriptor_bits)

    def k_block(self, a_tile: str, b_tile: str, sa_tile: str, sb_value: str, release=None, former_groups=None):
        o = self.options
        if o.swizzle and o.wgmma_n == self.block_n:
            return super().k_block(a_tile, b_tile, sa_tile, sb_value, release, former_groups)
        assert self.waves == 1 and release is None and former_groups is None  # stage 05's 128 x 128 tile
        e, r = self.b.emit, self.b.reg
        step_bytes = w.K32_STEP_BYTES if o.swizzle else 2 * CORE_LBO
        scratch, b_desc, a_addr, a_desc = r("u32"), r("u64", "bdesc"), r("u32"), r("u64", "adesc")
        e(w.wgmma_descriptor(b_desc, b_tile, scratch, self.constant_desc),
          f"add.u32 {a_addr}, {a_tile}, {self.wg_a_offset};",
          w.wgmma_descriptor(a_desc, a_addr, scratch, self.constant_desc))
        sa_addr, sa_lo, sa_hi = r("u32"), r("f32", "sa"), r("f32", "sa")
        e(f"shl.b32 {sa_addr}, {self.row}, 2;", f"add.u32 {sa_addr}, {sa_addr}, {sa_tile};",
          f"ld.shared.f32 {sa_lo}, [{sa_addr}];", f"ld.shared.f32 {sa_hi}, [{sa_addr}+32];")
        e(w.wgmma_fence())
        parts = self.block_n // o.wgmma_n
        for step in range(K_STEPS):
            a_k = a_desc
            if step:  # descriptors count 16-byte units
                a_k = r("u64", "adesc")
                e(f"add.s64 {a_k}, {a_desc}, {step * step_bytes >> 4};")
            for part in range(parts):  # B rows 64*part..: 8 row groups of 1024 bytes further, in both layouts
                b_k, advance = b_desc, step * step_bytes + part * o.wgmma_n * BLOCK_K
                if advance:
                    b_k = r("u64", "bdesc")
                    e(f"add.s64 {b_k}, {b_desc}, {advance >> 4};")
                acc = self.acc[part * o.wgmma_n // 2:(part + 1) * o.wgmma_n // 2]  # columns 64*part..: see store
                e(w.wgmma_e4m3(acc, a_k, b_k, self.fresh if step == 0 else self.accumulate))
        e(w.wgmma_commit_group(), w.wgmma_wait_group(0))
        scale_lo, scale_hi = r("f32", "scale"), r("f32", "scale")
        e(f"mul.f32 {scale_lo}, {sa_lo}, {sb_value};", f"mul.f32 {scale_hi}, {sa_hi}, {sb_value};")
        for i, (running, partial) in enumerate(zip(self.totals[0], self.acc)):
            e(core.promote(running, partial, (scale_lo, scale_hi)[(i // 2) % 2]))


class _Gen:
    def __init__(self, m: int, n: int, k: int, options: Options = DEFAULT, descriptor_bits=None):
        self.descriptor_bits = descriptor_bits
        self.m, self.n, self.k, self.kb = m, n, k, k // BLOCK_K
        self.o, self.stages = options, options.stages
        self.b_region = self.stages * A_TILE
        self.sa_region = self.b_region + self.stages * B_TILE
        self.b = KernelBuilder(KERNEL, params=[("u64", "a"), ("u64", "sa"), ("u64", "b"), ("u64", "sb"),
                                               ("u64", "d"), ("u32", "sa_stride")],
                               max_threads=THREADS, min_blocks_per_sm=1)

    def r(self, t="u32", hint=None):
        return self.b.reg(t, hint)

    def emit(self, *lines):
        self.b.emit(*lines)

    def global_param(self, name):
        ptr = self.r("u64", "ptr_" + name)
        self.emit(f"ld.param.u64 {ptr}, [{self.b.param(name)}];", f"cvta.to.global.u64 {ptr}, {ptr};")
        return ptr

    def setup(self):
        e, r = self.emit, self.r
        self.tid, self.m0, self.n0, self.n_block, self.smem = (r(hint=h) for h in ("tid", "m0", "n0", "nblk", "smem"))
        e(f"mov.u32 {self.tid}, %tid.x;", f"mov.u32 {self.n_block}, %ctaid.x;",
          f"mul.lo.u32 {self.n0}, {self.n_block}, {BLOCK_N};",
          f"mov.u32 {self.m0}, %ctaid.y;", f"mul.lo.u32 {self.m0}, {self.m0}, {BLOCK_M};",
          shared_memory.shared_address_of(self.smem, SMEM),
          # 128B-swizzled operands must start on a 1024-byte boundary; dynamic smem only promises 16
          f"add.u32 {self.smem}, {self.smem}, 1023;", f"and.b32 {self.smem}, {self.smem}, -1024;")
        self.a, self.sa, self.bp = self.global_param("a"), self.global_param("sa"), self.global_param("b")
        self.sb, self.d = self.global_param("sb"), self.global_param("d")
        self.sa_stride = r(hint="sa_stride")
        e(f"ld.param.u32 {self.sa_stride}, [{self.b.param('sa_stride')}];")
        self.math = _Math(self.b, self.tid, self.o, self.descriptor_bits)

    # -- loads (threads, cp.async) -----------------------------------------------------------------------
    def row_sources(self, base: str, first_row: str, rows_total: int) -> list[str]:
        """Per-pass pointers to this thread's 16-byte chunk; rows past the end are clamped to the last row
        (their products only reach rows/columns of D that are never stored)."""
        e, r = self.emit, self.r
        row, chunk, wide = r(), r(), r("u64")
        e(f"shr.u32 {row}, {self.tid}, 3;", f"add.u32 {row}, {row}, {first_row};",
          f"and.b32 {chunk}, {self.tid}, 7;", f"shl.b32 {chunk}, {chunk}, 4;")
        pointers = []
        for p in range(BLOCK_M // LOAD_ROWS_PER_PASS):
            this_row, ptr = r(), r("u64", "src")
            e(f"add.u32 {this_row}, {row}, {p * LOAD_ROWS_PER_PASS};",
              f"min.u32 {this_row}, {this_row}, {rows_total - 1};",
              f"mul.wide.u32 {ptr}, {this_row}, {self.k};", f"add.u64 {ptr}, {ptr}, {base};",
              f"cvt.u64.u32 {wide}, {chunk};", f"add.u64 {ptr}, {ptr}, {wide};")
            pointers.append(ptr)
        return pointers

    def load_setup(self):
        e, r = self.emit, self.r
        # destination of this thread's chunk in every pass: row*128 + ((chunk ^ row%8) * 16); passes add
        # 32 rows (4096 bytes), which keeps row % 8, so one register serves all passes (see sw128_offset).
        # Without the swizzle: core_matrix_offset, (row/8)*1024 + chunk*128 + (row%8)*16; passes add 4096 too.
        row, chunk, x = r(), r(), r()
        self.load_dst = r(hint="ld_dst")
        if self.o.swizzle:
            e(f"shr.u32 {row}, {self.tid}, 3;", f"and.b32 {chunk}, {self.tid}, 7;", f"and.b32 {x}, {row}, 7;",
              f"xor.b32 {chunk}, {chunk}, {x};", f"shl.b32 {chunk}, {chunk}, 4;",
              f"shl.b32 {self.load_dst}, {row}, 7;", f"add.u32 {self.load_dst}, {self.load_dst}, {chunk};")
        else:
            e(f"shr.u32 {row}, {self.tid}, 3;", f"and.b32 {chunk}, {self.tid}, 7;", f"and.b32 {x}, {row}, 7;",
              f"shl.b32 {chunk}, {chunk}, 7;", f"shl.b32 {x}, {x}, 4;",
              f"shr.u32 {self.load_dst}, {row}, 3;", f"shl.b32 {self.load_dst}, {self.load_dst}, 10;",
              f"add.u32 {self.load_dst}, {self.load_dst}, {chunk};", f"add.u32 {self.load_dst}, {self.load_dst}, {x};")
        self.a_src = self.row_sources(self.a, self.m0, self.m)
        self.b_src = self.row_sources(self.bp, self.n0, self.n)
        # activation scales: warp 0 copies the block's 128 scales of a K group (M-major: contiguous), 16 bytes
        # a lane; cp.async's src-size zero-fills the chunks past M and reads nothing there
        self.is_scale_loader = r("pred", "p_sa")
        first, remaining, wide = r(), r("s32"), r("u64")
        self.sa_bytes, self.sa_src, self.sa_step = r(hint="sa_bytes"), r("u64", "sa_src"), r("u64", "sa_step")
        e(f"setp.lt.u32 {self.is_scale_loader}, {self.tid}, 32;",
          f"shl.b32 {first}, {self.tid}, 2;", f"add.u32 {first}, {first}, {self.m0};",
          f"sub.s32 {remaining}, {self.m}, {first};", f"max.s32 {remaining}, {remaining}, 0;",
          f"min.s32 {remaining}, {remaining}, 4;", f"shl.b32 {self.sa_bytes}, {remaining}, 2;",
          f"min.u32 {first}, {first}, {(self.m - 1) // 4 * 4};",
          f"mul.wide.u32 {wide}, {first}, 4;", f"add.u64 {self.sa_src}, {self.sa}, {wide};",
          f"mul.wide.u32 {self.sa_step}, {self.sa_stride}, 4;")
        self.sa_dst = r(hint="sa_dst")
        e(f"shl.b32 {self.sa_dst}, {self.tid}, 4;")
        # sb[n_block, g]: one float per K block for the whole CTA (BLOCK_N = 128 = the weights' block)
        self.sb_src = r("u64", "sb_src")
        e(f"mul.wide.u32 {wide}, {self.n_block}, {self.kb * 4};", f"add.u64 {self.sb_src}, {self.sb}, {wide};")

    def stage_addresses(self, stage: str | int) -> tuple[str, str, str]:
        """u32 shared addresses of stage ``stage``'s A tile, B tile and scale tile."""
        e, r = self.emit, self.r
        a, b_, s = r(hint="a_tile"), r(hint="b_tile"), r(hint="sa_tile")
        if isinstance(stage, int):
            e(f"add.u32 {a}, {self.smem}, {stage * A_TILE};",
              f"add.u32 {b_}, {self.smem}, {self.b_region + stage * B_TILE};",
              f"add.u32 {s}, {self.smem}, {self.sa_region + stage * SA_TILE};")
            return a, b_, s
        e(f"mad.lo.u32 {a}, {stage}, {A_TILE}, {self.smem};",
          f"mad.lo.u32 {b_}, {stage}, {B_TILE}, {self.smem};", f"add.u32 {b_}, {b_}, {self.b_region};",
          f"mad.lo.u32 {s}, {stage}, {SA_TILE}, {self.smem};", f"add.u32 {s}, {s}, {self.sa_region};")
        return a, b_, s

    def issue_loads(self, stage: str | int, predicate: str | None, scale_predicate: str):
        """cp.async this thread's share of the next K block into ``stage``; advance the sources."""
        e, r = self.emit, self.r
        a_tile, b_tile, sa_tile = self.stage_addresses(stage)
        for tile, sources in ((a_tile, self.a_src), (b_tile, self.b_src)):
            dst = r(hint="dst")
            e(f"add.u32 {dst}, {tile}, {self.load_dst};")
            for p, ptr in enumerate(sources):
                e(async_copies.cp_async_16(dst, ptr, p * LOAD_ROWS_PER_PASS * BLOCK_K, predicate=predicate))
        sa_dst = r(hint="sa_dst_stage")
        e(f"add.u32 {sa_dst}, {sa_tile}, {self.sa_dst};",
          async_copies.cp_async_16(sa_dst, self.sa_src, 0, src_size=self.sa_bytes, predicate=scale_predicate))
        for ptr in self.a_src + self.b_src:
            e(f"add.u64 {ptr}, {ptr}, {BLOCK_K};")
        e(f"add.u64 {self.sa_src}, {self.sa_src}, {self.sa_step};")

    # -- the K loop ------------------------------------------------------------------------------------------
    def main_loop(self):
        e, r, b = self.emit, self.r, self.b
        if self.stages == 1:
            return self.synchronous_loop()
        b.comment(f"prologue: the first {self.stages - 1} K blocks in flight (empty groups keep the count uniform)")
        for s in range(self.stages - 1):
            if s < self.kb:
                self.issue_loads(s, None, self.is_scale_loader)
            e(async_copies.cp_async_commit())
        kb, ahead, rd, wr = r(hint="kb"), r(hint="ahead"), r(hint="rd"), r(hint="wr")
        load, load_scales, more, wrap = r("pred"), r("pred"), r("pred"), r("pred")
        e(f"mov.u32 {kb}, 0;", f"mov.u32 {rd}, 0;", f"mov.u32 {wr}, {self.stages - 1};")
        top = b.label("k_block")
        b.place(top)
        b.comment("block kb has landed (this thread's copies), is visible to wgmma's async proxy (fence) and to "
                  "every thread (barrier); the stage refilled next was read in iteration kb-1, finished by all")
        e(async_copies.cp_async_wait(self.stages - 2), barriers.fence_proxy_async(), core.bar_sync(0))
        e(f"add.u32 {ahead}, {kb}, {self.stages - 1};", f"setp.lt.u32 {load}, {ahead}, {self.kb};",
          f"and.pred {load_scales}, {load}, {self.is_scale_loader};")
        self.issue_loads(wr, load, load_scales)
        e(async_copies.cp_async_commit())
        sb_value = r("f32", "sb")
        e(f"ld.global.nc.f32 {sb_value}, [{self.sb_src}];", f"add.u64 {self.sb_src}, {self.sb_src}, 4;")
        self.math.k_block(*self.stage_addresses(rd), sb_value)
        for stage in (rd, wr):
            e(f"add.u32 {stage}, {stage}, 1;", f"setp.eq.u32 {wrap}, {stage}, {self.stages};",
              f"selp.u32 {stage}, 0, {stage}, {wrap};")
        e(f"add.u32 {kb}, {kb}, 1;", f"setp.lt.u32 {more}, {kb}, {self.kb};", f"@{more} bra {top};")

    def synchronous_loop(self):
        """One stage (ablation): load block kb, wait for it, compute it, and let both warpgroups finish reading
        it before the next block overwrites it; loads and math never overlap."""
        e, r, b = self.emit, self.r, self.b
        kb, more = r(hint="kb"), r("pred")
        e(f"mov.u32 {kb}, 0;")
        top = b.label("k_block")
        b.place(top)
        self.issue_loads(0, None, self.is_scale_loader)
        b.comment("block kb has landed (everyone's copies) and is visible to wgmma's async proxy")
        e(async_copies.cp_async_commit(), async_copies.cp_async_wait(0), barriers.fence_proxy_async(), core.bar_sync(0))
        sb_value = r("f32", "sb")
        e(f"ld.global.nc.f32 {sb_value}, [{self.sb_src}];", f"add.u64 {self.sb_src}, {self.sb_src}, 4;")
        self.math.k_block(*self.stage_addresses(0), sb_value)
        b.comment("both warpgroups' wgmmas are done with the stage before it is refilled")
        e(core.bar_sync(0))
        e(f"add.u32 {kb}, {kb}, 1;", f"setp.lt.u32 {more}, {kb}, {self.kb};", f"@{more} bra {top};")

    # -- epilogue --------------------------------------------------------------------------------------------
    def store_direct(self):
        """Stage 04's epilogue (ablation): each thread rounds its accumulator pairs to BF16 and stores them from
        registers, 4 bytes at a time (2 when N is odd); a warp's 32 stores cover 8 rows x 16 bytes."""
        e, r, math = self.emit, self.r, self.math
        row, col, t, wide, ptr = r(hint="row"), r(hint="col"), r(), r("u64"), r("u64", "dst")
        e(f"add.u32 {row}, {math.row}, {self.m0};", f"and.b32 {t}, {math.lane}, 3;", f"shl.b32 {t}, {t}, 1;",
          f"add.u32 {col}, {t}, {self.n0};",
          f"mul.wide.u32 {ptr}, {row}, {2 * self.n};", f"mul.wide.u32 {wide}, {col}, 2;",
          f"add.u64 {ptr}, {ptr}, {wide};", f"add.u64 {ptr}, {ptr}, {self.d};")
        ragged_m, ragged_n, odd = self.m % BLOCK_M != 0, self.n % BLOCK_N != 0, self.n % 2 != 0
        col_ok = []  # per 8-column group j: the predicate of its first column (and of its second when N is odd)
        for j in range(BLOCK_N // 8):
            preds = []
            for extra in ((0, 1) if odd else (0,)):
                p = None
                if ragged_n:
                    p = r("pred")
                    e(f"setp.lt.u32 {p}, {col}, {max(self.n - 8 * j - extra, 0)};")
                preds.append(p)
            col_ok.append(preds)
        total = math.totals[0]
        for half in range(2):  # accumulators 4j + 2*half (+1): row l/4 + 8*half, columns 8j + 2(l%4) (+1)
            row_ok = None
            if ragged_m:
                row_ok = r("pred")
                e(f"setp.lt.u32 {row_ok}, {row}, {max(self.m - 8 * half, 0)};")
            for j in range(BLOCK_N // 8):
                lo, hi = total[4 * j + 2 * half], total[4 * j + 2 * half + 1]
                offset = 8 * half * 2 * self.n + 2 * 8 * j
                if not odd:
                    packed = r("b32")
                    e(core.cvt_f32x2_to_bf16x2(packed, hi, lo),
                      self._guard(row_ok, col_ok[j][0]) + core.st_global("b32", ptr, packed, offset))
                    continue
                for value, extra in ((lo, 0), (hi, 1)):
                    h = r("b16")
                    e(f"cvt.rn.bf16.f32 {h}, {value};",
                      self._guard(row_ok, col_ok[j][extra]) + core.st_global("b16", ptr, h, offset + 2 * extra))

    def _guard(self, *preds):
        return core.guard_prefix(preds, lambda: self.r("pred"), self.emit)

    def build(self) -> str:
        self.setup()
        self.load_setup()
        self.main_loop()
        if self.o.staged_epilogue:
            self.b.comment("epilogue: every warpgroup is done with the operand tiles, so they become the staging tile")
            self.emit(async_copies.cp_async_wait(0), core.bar_sync(0))
            self.math.store(self.smem, self.d, self.m0, self.n0, self.m, self.n)
        else:
            self.b.comment("epilogue: straight from the accumulator registers to global memory")
            self.emit(async_copies.cp_async_wait(0))
            self.store_direct()
        return module([self.b], extra_globals=shared_memory.dynamic_shared_declaration(SMEM, align=1024))


def _check_shape(m: int, n: int, k: int) -> None:
    if min(m, n, k) <= 0 or k % BLOCK_K:
        raise ValueError(f"stage 05 needs M, N > 0 and K a positive multiple of {BLOCK_K}, got {m}x{n}x{k}")
    if m * k >= 2**32 or n * k >= 2**32 or 2 * m * n >= 2**32:
        raise ValueError(f"stage 05 addresses rows with 32-bit products: {m}x{n}x{k} is too large")


@functools.lru_cache(maxsize=None)
def generate(m: int, n: int, k: int, options: Options = DEFAULT, descriptor_bits=None) -> str:
    """The PTX text of the kernel specialized for (M, N, K); ``options`` turns the stage's ideas off one by one;
    ``descriptor_bits`` replaces ``ptx.vocab.wgmma.descriptor_bits`` in :func:`descriptor_constant_part`
    (exercise 05)."""
    _check_shape(m, n, k)
    return _Gen(m, n, k, options, descriptor_bits).build()


def grid(m: int, n: int) -> tuple[int, int, int]:
    return ceil_div(n, BLOCK_N), ceil_div(m, BLOCK_M), 1


@functools.lru_cache(maxsize=None)
def _kernel(m: int, n: int, k: int, options: Options = DEFAULT, descriptor_bits=None):
    from ptx.compile import compile_ptx
    from ptx.runtime import load_kernel
    return load_kernel(compile_ptx(generate(m, n, k, options, descriptor_bits)), KERNEL)


def shared_bytes(m: int, n: int, k: int, options: Options = DEFAULT) -> int:
    """Dynamic shared memory the kernel for (M, N, K) launches with."""
    return options.shared_bytes


def gemm(a, sa, b, sb, d, stream=None, options: Options = DEFAULT, descriptor_bits=None) -> None:
    """D = (A*sA)(B*sB)^T, BF16 out (contract in gemm.fp8); asynchronous on ``stream``."""
    from gemm.validate import check_gemm_args
    args = check_gemm_args(a, sa, b, sb, d)
    kernel = _kernel(args.m, args.n, args.k, options, descriptor_bits)
    kernel.launch(grid(args.m, args.n), THREADS,
                  [args.a.ptr, args.sa.ptr, args.b.ptr, args.sb.ptr, args.d.ptr, np.uint32(args.sa_stride)],
                  shared_bytes=options.shared_bytes, stream=stream)


def emulate(a, sa, b, sb, *, seed=None, options: Options = DEFAULT, descriptor_bits=None) -> np.ndarray:
    """Run this stage's generated PTX on the CPU (ptx.emulate, each CTA as cooperatively scheduled
    warpgroups) for host operands in the gemm.fp8 contract; D as float32, NaN where the kernel wrote nothing.
    ``seed``: pick the next warpgroup at random instead of round-robin. ``ptx.emulate.run_stage(stage, ...)``
    adds a report and edits."""
    from gemm.fp8 import align, bf16_to_float
    from ptx.emulate import run_kernel
    m, k = a.shape
    n = b.shape[0]
    sa_storage = np.zeros((sa.shape[1], align(m, 4)), np.float32)  # the M-major, M-padded-to-4 scale bytes
    sa_storage[:, :m] = np.asarray(sa).T
    d = np.full((m, n), 0x7FC0, np.uint16)  # BF16 NaN: what the kernel never writes stays NaN
    run_kernel(generate(m, n, k, options, descriptor_bits), KERNEL, grid(m, n), THREADS, options.shared_bytes,
               dict(a=np.ascontiguousarray(a).view(np.uint8), sa=sa_storage, b=np.ascontiguousarray(b).view(np.uint8),
                    sb=np.ascontiguousarray(sb, np.float32), d=d, sa_stride=align(m, 4)), seed=seed)
    return bf16_to_float(d)
