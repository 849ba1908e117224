"""Stage 04 — tensor cores: one ``mma.sync`` instruction does a 16x8x32 e4m3 product for a whole warp.

Stage 03 (Numba, register tiling) computed D on the CUDA cores: each thread a small register patch of FFMAs,
every e4m3 byte decoded in software. Here the multiply-accumulate leaves the CUDA cores: 32 threads hand
the tensor core a 16x32 slice of A and a 32x8 slice of B (bytes, as they are in memory) and get a 16x8 FP32
product back, 8192 flops per instruction. What changes to feed it:

* the kernel is raw PTX written by Python (shapes, block sizes and loop bounds baked into the text, inner
  loops unrolled by Python), assembled by nvJitLink, launched with cuda-python;
* tiles travel global -> shared with ``cp.async`` (16 bytes per thread, no registers in between) in a
  3-stage ring, so the next K blocks load while this one computes;
* ``ldmatrix`` pulls each warp's fragments out of shared memory in the exact register layout mma.sync
  wants. It knows only 16-bit elements, but that is enough: an 8x8 .b16 matrix is 8 rows of 16 bytes and
  lane L receives bytes 4(L%4)..4(L%4)+3 of row L/4, which are exactly the four consecutive K bytes of
  row g the e4m3 fragment holds. One ``.x4`` fills a whole A fragment (or two B fragments) where plain
  ``ld.shared.b32`` would take four loads. The tile's 16-byte chunks are XOR-swizzled (chunk c of row r
  sits at c ^ (r % 8)) so these reads, and the cp.async writes, are free of bank conflicts;
* promotion is unchanged in spirit: each 128-wide K block's tensor-core sum is scaled by sA*sB and added
  into a second set of FP32 registers with one FFMA per element.

Block tile 128x128 (x 128 of K, one scale group), 8 warps as 2 (M) x 4 (N), each warp 64x32 = 4x4 mma tiles.
Hopper has no FP8 ``mma.sync`` datapath: ptxas turns each m16n8k32 e4m3 mma into F2FP unpacks (e4m3 -> f16),
two ``HMMA.16816.F32`` and one FADD per accumulator (see ``python -m lessons inspect 4``: per warp and K block
128 HMMA, ~220 F2FP, 256 FADD, 64 FFMA). FP8 at full rate on Hopper needs the warpgroup instruction, wgmma
(stage 05).

Speed of light: FP16 tensor cores, not FP8 ones. Each e4m3 mma.sync runs as two HMMA.16816.F32, so the bound is
the dense FP16 rate, 132 SMs x 4096 flop/clk x 1.83 GHz = 989 TFLOP/s, half the FP8 peak. The shared-memory port
is close behind: per 128-wide K block the eight warps of a 128 x 128 tile read 96 KiB with ldmatrix and cp.async
writes 32 KiB, 0.031 B per flop, which allows 1,071 TFLOP/s. The F2FP unpacks and the FADDs that merge each HMMA
pair take issue slots beside them.

Measured: 308 TFLOP/s at M=4096 N=4096 K=7168 on NVIDIA H100 80GB HBM3, 12.86x stage 03; 31% of its speed of light
(FP16 HMMA, 989 TFLOP/s), 16% of the FP8 peak (results/ladder.json, `python -m lessons ladder`).

Ablations: this stage bundles five ideas, so each can be turned off alone (:class:`Options`, switches of the
generator; every variant is still a correct kernel, checked in the emulator by tests/test_ablations.py).
``swizzle=False`` stores the tiles row-major: the eight 16-byte rows each ldmatrix matrix reads then share four
banks (8-way conflicts), while the cp.async writes stay conflict-free. ``ldmatrix=False`` loads every fragment
register with its own ld.shared.b32 (96 LDS per warp and K block for 24 LDSM; conflict-free under the swizzle).
``cp_async=False`` copies through registers, ld.global.v4 then st.shared.v4 at the same point of the loop, so each
thread waits for its loads before it computes. ``stages=1`` drops the ring: load a K block, wait, compute, barrier.
``warp_m=32`` halves the warp tile to 32 x 32 (16 warps): each B fragment feeds 2 mma instead of 4, a third more
ldmatrix per CTA. ptxas keeps this kernel at its register ceiling, so some variants spill a few registers; the table
says how many bytes. The honest surprise of the measurement below: ldmatrix buys nothing here, plain loads are 7%
faster. Under the swizzle they are conflict-free too; why four times the load instructions cost less has not been
profiled yet. ldmatrix stays in the stage as the fragment idiom that wgmma then removes.
`python -m lessons ablate 4` times them all against the full stage on a GPU (on a CPU it prints each variant's
registers, spills and SASS counts), and docs/ladder.md shows the committed run.

Ablations measured: the full stage, 303 TFLOP/s at M=4096 N=4096 K=7168 on NVIDIA H100 80GB HBM3; with one idea off,
its speed as a share of that: without the XOR swizzle 0.47x (143 TFLOP/s); without ldmatrix 1.07x (323 TFLOP/s);
without cp.async 0.74x (224 TFLOP/s); without the ring (1 stage) 0.75x (227 TFLOP/s); 32x32 warp tiles (16 warps)
1.01x (306 TFLOP/s) (results/ablation_04.json, `python -m lessons ablate 4`).
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from gemm.fp8 import ceil_div
from ptx.builder import KernelBuilder, module
from ptx.vocab import async_copies, mma_sync, shared_memory
from ptx.vocab import core as c

IDEA = "tensor cores: one mma.sync instruction does a 16x8x32 e4m3 product per warp"
KIND = "ptx"
KERNEL = "fp8_gemm_mma_sync"

BLOCK_M = BLOCK_N = 128
BLOCK_K = 128  # one scale group: promotion happens once per block
WARPS_M, WARPS_N = 2, 4
WARP_M, WARP_N = BLOCK_M // WARPS_M, BLOCK_N // WARPS_N  # 64 x 32 per warp
M_TILES, N_TILES, K_STEPS = WARP_M // 16, WARP_N // 8, BLOCK_K // 32  # mma tiles per warp, k32 steps per block
THREADS = 32 * WARPS_M * WARPS_N
STAGES = 3
TILE_BYTES = BLOCK_M * BLOCK_K  # e4m3: one byte per element; A and B tiles are both 128 rows of 128 bytes
B_OFFSET = TILE_BYTES
SA_OFFSET = 2 * TILE_BYTES  # the block's 128 activation scales of this K block
STAGE_BYTES = 2 * TILE_BYTES + 4 * BLOCK_M
SHARED_BYTES = STAGES * STAGE_BYTES
LOAD_ROWS_PER_PASS = THREADS // 8  # 8 threads x 16 bytes cover one 128-byte row
LOAD_PASSES = BLOCK_M // LOAD_ROWS_PER_PASS
SMEM = "smem"


# -- the stage's ideas as switches (python -m lessons ablate 4) ------------------------------------------
@dataclasses.dataclass(frozen=True)
class Options:
    """Each idea this stage bundles, as a switch of the generator; the defaults are the stage as taught (and
    generate the same PTX, byte for byte). Every combination is a correct kernel (tests/test_ablations.py)."""

    swizzle: bool = True  # chunk c of row r at c ^ (r % 8); off: row-major tiles, ldmatrix rows in 4 banks
    ldmatrix: bool = True  # off: each fragment register by its own ld.shared.b32 (6 per k32 step a warp: 24)
    cp_async: bool = True  # off: ld.global.v4 into registers, then st.shared.v4: the thread waits for its loads
    stages: int = STAGES  # K blocks in the shared ring; 1: load, wait, compute, barrier (nothing overlaps)
    warp_m: int = WARP_M  # rows of a warp's tile (x 32 columns); 32: 16 warps, each fragment reused half as often

    def __post_init__(self):
        if self.stages < 1:
            raise ValueError(f"stage 04 needs at least one stage in its ring, got {self.stages}")
        if self.warp_m not in (32, 64):
            raise ValueError(f"stage 04's warp tile is 64 or 32 rows (x 32 columns), got {self.warp_m}")
        if self.shared_bytes > 227 * 1024:  # Hopper's most dynamic shared memory per block
            raise ValueError(f"stage 04: {self.stages} stages need {self.shared_bytes} bytes of shared memory, "
                             "more than the 227 KiB a block may have")

    @property
    def threads(self) -> int:
        return 32 * (BLOCK_M // self.warp_m) * WARPS_N

    @property
    def shared_bytes(self) -> int:
        return self.stages * STAGE_BYTES

    def describe(self) -> str:
        ring = f"{self.stages}-stage {'cp.async' if self.cp_async else 'ld.global+st.shared'} ring" \
            if self.stages > 1 else f"1 stage ({'cp.async' if self.cp_async else 'ld.global+st.shared'}, synchronous)"
        return (f"{self.threads // 32} warps of {self.warp_m}x{WARP_N}, {ring}, "
                f"{'ldmatrix' if self.ldmatrix else 'ld.shared.b32'}, {'XOR swizzle' if self.swizzle else 'row-major'}")


DEFAULT = Options()
# Each idea of this stage turned off on its own (python -m lessons ablate 4): Options fields to change.
ABLATIONS = {"without the XOR swizzle": {"swizzle": False},
             "without ldmatrix": {"ldmatrix": False},
             "without cp.async": {"cp_async": False},
             "without the ring (1 stage)": {"stages": 1},
             "32x32 warp tiles (16 warps)": {"warp_m": 32}}


# -- the address arithmetic the PTX performs, mirrored in Python for the tests ---------------------------
def load_slot(tid: int, load_pass: int) -> tuple[int, int]:
    """(tile row, 16-byte chunk) that thread ``tid`` copies with cp.async in pass ``load_pass``."""
    return tid // 8 + LOAD_ROWS_PER_PASS * load_pass, tid % 8


def load_shared_offset(tid: int, load_pass: int) -> int:
    """Where that chunk lands: the PTX computes (tid//8)*128 + ((tid%8) ^ (tid//8 % 8))*16 + pass*4096."""
    row, chunk = tid // 8, tid % 8
    return row * 128 + ((chunk ^ (row % 8)) << 4) + load_pass * LOAD_ROWS_PER_PASS * 128


def a_fragment_offset(warp_m: int, lane: int, m_tile: int, k_step: int) -> int:
    """Byte offset in the A tile that ``lane`` gives ldmatrix for (m_tile, k_step), as the PTX computes it."""
    row = warp_m * WARP_M + (lane & 15)
    return row * 128 + ((((lane >> 4) ^ (lane & 7)) ^ (2 * k_step)) << 4) + m_tile * 16 * 128


def b_fragment_offset(warp_n: int, lane: int, n_pair: int, k_step: int) -> int:
    """Byte offset in the B tile that ``lane`` gives ldmatrix for n tiles (2*n_pair, 2*n_pair+1) at k_step."""
    row = warp_n * WARP_N + ((lane >> 4) & 1) * 8 + (lane & 7)
    return row * 128 + (((((lane >> 3) & 1) ^ (lane & 7)) ^ (2 * k_step)) << 4) + n_pair * 16 * 128


# -- exercise 04 (lessons/exercises): the fragment offsets above, as Python the generator turns into PTX ----
class Traced:
    """A u32 value in a register of the kernel being generated, for running a plain-Python offset function
    (``a_fragment_offset(warp_m, lane, m_tile, k_step)``) on registers: each operator (+ - * // % & | ^ << >>)
    with a register operand emits one PTX instruction; constants fold in Python; equal subexpressions share one
    register. Powers of two turn * // % into shl / shr / and, as the stage writes them by hand."""

    def __init__(self, gen: "_Gen", register: str):
        self.gen, self.register = gen, register

    @staticmethod
    def lift(gen, value):
        if isinstance(value, Traced):
            return value
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return int(value)
        raise TypeError(f"the offset functions may use only integers and + - * // % & | ^ << >>, got {value!r}")

    def _op(self, name, left, right):
        left, right = Traced.lift(self.gen, left), Traced.lift(self.gen, right)
        return self.gen.traced_op(name, left, right)

    def __add__(self, o): return self._op("add", self, o)  # noqa: E704
    def __radd__(self, o): return self._op("add", o, self)  # noqa: E704
    def __sub__(self, o): return self._op("sub", self, o)  # noqa: E704
    def __rsub__(self, o): return self._op("sub", o, self)  # noqa: E704
    def __mul__(self, o): return self._op("mul", self, o)  # noqa: E704
    def __rmul__(self, o): return self._op("mul", o, self)  # noqa: E704
    def __floordiv__(self, o): return self._op("div", self, o)  # noqa: E704
    def __rfloordiv__(self, o): return self._op("div", o, self)  # noqa: E704
    def __mod__(self, o): return self._op("rem", self, o)  # noqa: E704
    def __rmod__(self, o): return self._op("rem", o, self)  # noqa: E704
    def __and__(self, o): return self._op("and", self, o)  # noqa: E704
    def __rand__(self, o): return self._op("and", o, self)  # noqa: E704
    def __or__(self, o): return self._op("or", self, o)  # noqa: E704
    def __ror__(self, o): return self._op("or", o, self)  # noqa: E704
    def __xor__(self, o): return self._op("xor", self, o)  # noqa: E704
    def __rxor__(self, o): return self._op("xor", o, self)  # noqa: E704
    def __lshift__(self, o): return self._op("shl", self, o)  # noqa: E704
    def __rlshift__(self, o): return self._op("shl", o, self)  # noqa: E704
    def __rshift__(self, o): return self._op("shr", self, o)  # noqa: E704
    def __rrshift__(self, o): return self._op("shr", o, self)  # noqa: E704

    def __bool__(self):
        raise TypeError("the offset functions run on registers while generating: no `if` on lane or warp values")


_TRACED_PTX = {"add": "add.u32", "sub": "sub.u32", "mul": "mul.lo.u32", "div": "div.u32", "rem": "rem.u32",
               "and": "and.b32", "or": "or.b32", "xor": "xor.b32", "shl": "shl.b32", "shr": "shr.u32"}


# -- the generator ---------------------------------------------------------------------------------------
class _Gen:
    """Emits the kernel for one (M, N, K) into a KernelBuilder; one method per phase."""

    def __init__(self, m: int, n: int, k: int, options: Options = DEFAULT, fragment_offsets=None):
        self.m, self.n, self.k, self.kb = m, n, k, k // BLOCK_K
        self.fragment_offsets = fragment_offsets  # exercise 04: (a_fragment_offset, b_fragment_offset) or None
        self.ragged_m, self.ragged_n = m % BLOCK_M != 0, n % BLOCK_N != 0
        self.o = options
        self.threads, self.stages, self.shared_bytes = options.threads, options.stages, options.shared_bytes
        self.rows_per_pass = self.threads // 8
        self.passes = BLOCK_M // self.rows_per_pass
        self.m_tiles, self.warp_m_shift = options.warp_m // 16, options.warp_m.bit_length() - 1
        self.b = KernelBuilder(KERNEL, params=[("u64", "a"), ("u64", "sa"), ("u64", "b"), ("u64", "sb"),
                                               ("u64", "d"), ("u32", "sa_stride")],
                               max_threads=self.threads, min_blocks_per_sm=1)

    def r(self, t="u32", hint=None):
        return self.b.reg(t, hint)

    def emit(self, *lines):
        self.b.emit(*lines)

    def global_param(self, name):
        ptr = self.r("u64", "ptr_" + name)
        self.emit(c.global_pointer_param(ptr, self.b.param(name)))
        return ptr

    # -- setup ---------------------------------------------------------------------------------------
    def indices(self):
        e, r = self.emit, self.r
        self.tid, self.lane, warp = r(hint="tid"), r(hint="lane"), r(hint="warp")
        self.warp_m, self.warp_n = r(hint="warp_m"), r(hint="warp_n")
        self.m0, self.n0, self.n_block, self.smem = r(hint="m0"), r(hint="n0"), r(hint="nblk"), r(hint="smem")
        e(c.special(self.tid, "tid.x"), f"and.b32 {self.lane}, {self.tid}, 31;", f"shr.u32 {warp}, {self.tid}, 5;",
          f"shr.u32 {self.warp_m}, {warp}, 2;", f"and.b32 {self.warp_n}, {warp}, 3;",
          c.special(self.n_block, "ctaid.x"), f"shl.b32 {self.n0}, {self.n_block}, 7;",
          c.special(self.m0, "ctaid.y"), f"shl.b32 {self.m0}, {self.m0}, 7;",
          shared_memory.shared_address_of(self.smem, SMEM))
        self.a, self.sa, self.bp = self.global_param("a"), self.global_param("sa"), self.global_param("b")
        self.sb, self.d = self.global_param("sb"), self.global_param("d")
        self.sa_stride = r(hint="sa_stride")
        e(c.ld_param("u32", self.sa_stride, self.b.param("sa_stride")))

    def row_pointers(self, base, first_row, rows_total):
        """Per-pass u64 pointers to this thread's 16-byte chunk of its rows; rows past the end are clamped
        to the last row (their products land in rows/columns of D that are never stored)."""
        e, r = self.emit, self.r
        row, chunk_off, wide = r(), r(), r("u64")
        e(f"shr.u32 {row}, {self.tid}, 3;", f"add.u32 {row}, {row}, {first_row};",
          f"and.b32 {chunk_off}, {self.tid}, 7;", f"shl.b32 {chunk_off}, {chunk_off}, 4;")
        ragged = rows_total % BLOCK_M != 0
        pointers = []
        for p in range(self.passes if ragged else 1):
            this_row, ptr = r(), r("u64", "src")
            e(f"add.u32 {this_row}, {row}, {p * self.rows_per_pass};")
            if ragged:
                e(f"min.u32 {this_row}, {this_row}, {rows_total - 1};")
            e(f"mul.wide.u32 {wide}, {this_row}, {self.k};", f"add.u64 {ptr}, {base}, {wide};",
              f"cvt.u64.u32 {wide}, {chunk_off};", f"add.u64 {ptr}, {ptr}, {wide};")
            pointers.append(ptr)
        if ragged:
            return [(ptr, 0) for ptr in pointers]
        return [(pointers[0], p * self.rows_per_pass * self.k) for p in range(self.passes)]

    def load_setup(self):
        e, r = self.emit, self.r
        # shared destination of this thread's chunk: load_shared_offset(tid, 0) (+ pass * 4096 as immediates);
        # without the swizzle, chunk c of a row simply sits at c
        row, chunk, x = r(), r(), r()
        self.load_dst = r(hint="ld_dst")
        swizzle = [f"and.b32 {x}, {row}, 7;", f"xor.b32 {chunk}, {chunk}, {x};"] if self.o.swizzle else []
        e(f"shr.u32 {row}, {self.tid}, 3;", f"and.b32 {chunk}, {self.tid}, 7;", *swizzle,
          f"shl.b32 {chunk}, {chunk}, 4;",
          f"shl.b32 {self.load_dst}, {row}, 7;", f"add.u32 {self.load_dst}, {self.load_dst}, {chunk};",
          f"add.u32 {self.load_dst}, {self.load_dst}, {self.smem};")
        self.a_src = self.row_pointers(self.a, self.m0, self.m)
        self.b_src = self.row_pointers(self.bp, self.n0, self.n)
        # Activation scales: warp 0 copies the block's 128 scales of one K group, 4 floats (16 bytes) a lane.
        # sa is M-major, so they are contiguous; chunks past M are zero-filled through cp.async's src-size.
        self.is_scale_loader = r("pred", "p_sa")
        e(f"setp.lt.u32 {self.is_scale_loader}, {self.tid}, 32;")
        first, wide = r(), r("u64")
        self.sa_src, self.sa_step, self.sa_dst = r("u64", "sa_src"), r("u64", "sa_step"), r(hint="sa_dst")
        e(f"shl.b32 {first}, {self.tid}, 2;", f"add.u32 {first}, {first}, {self.m0};")
        self.sa_bytes = None
        if self.ragged_m:
            remaining = r("s32")
            self.sa_bytes = r(hint="sa_bytes")
            e(f"sub.s32 {remaining}, {self.m}, {first};", f"max.s32 {remaining}, {remaining}, 0;",
              f"min.s32 {remaining}, {remaining}, 4;", f"shl.b32 {self.sa_bytes}, {remaining}, 2;",
              f"min.u32 {first}, {first}, {(self.m - 1) // 4 * 4};")
        e(f"mul.wide.u32 {wide}, {first}, 4;", f"add.u64 {self.sa_src}, {self.sa}, {wide};",
          f"mul.wide.u32 {self.sa_step}, {self.sa_stride}, 4;",
          f"shl.b32 {self.sa_dst}, {self.tid}, 4;", f"add.u32 {self.sa_dst}, {self.sa_dst}, {self.smem};")
        # sb[n_block, g]: one float per K block for the whole CTA (BLOCK_N = 128 = the weights' block)
        self.sb_src = r("u64", "sb_src")
        e(f"mul.wide.u32 {wide}, {self.n_block}, {self.kb * 4};", f"add.u64 {self.sb_src}, {self.sb}, {wide};")

    def issue_loads(self, stage_offset: str | int, predicate: str | None, scale_predicate: str):
        """cp.async this thread's share of the next K block into the stage at ``stage_offset``; advance."""
        e = self.emit
        dst = self.r(hint="dst")
        e(f"add.u32 {dst}, {self.load_dst}, {stage_offset};")
        if self.o.cp_async:
            for operand, sources in ((0, self.a_src), (B_OFFSET, self.b_src)):
                for p, (ptr, offset) in enumerate(sources):
                    e(async_copies.cp_async_16(dst, f"{ptr}+{offset}" if offset else ptr,
                                    operand + p * self.rows_per_pass * 128, predicate=predicate))
            sa_dst = self.r(hint="sa_dst_stage")
            e(f"add.u32 {sa_dst}, {self.sa_dst}, {stage_offset};",
              async_copies.cp_async_16(sa_dst, self.sa_src, SA_OFFSET, src_size=self.sa_bytes, predicate=scale_predicate))
        else:
            self.load_through_registers(dst, stage_offset, predicate, scale_predicate)
        for ptr in dict.fromkeys(ptr for ptr, _ in self.a_src + self.b_src):
            e(f"add.u64 {ptr}, {ptr}, {BLOCK_K};")
        e(f"add.u64 {self.sa_src}, {self.sa_src}, {self.sa_step};")

    def load_through_registers(self, dst: str, stage_offset: str | int, predicate: str | None,
                               scale_predicate: str):
        """Without cp.async (ablation): every 16-byte chunk by ld.global.cg.v4 (L2 only, as cp.async.cg) into
        registers, all issued before the first st.shared.v4, which waits for its load. Scales past M are not
        zero-filled: the clamped source repeats the last group's, which only rows past M use."""
        e, b = self.emit, self.b
        guard, scale_guard = (f"@{predicate} " if predicate else ""), f"@{scale_predicate} "
        chunks = []
        for operand, sources in ((0, self.a_src), (B_OFFSET, self.b_src)):
            for p, (ptr, offset) in enumerate(sources):
                regs = b.regs("b32", 4, "ld")
                e(guard + f"ld.global.cg.v4.b32 {{{', '.join(regs)}}}, [{ptr}{c._offset(offset)}];")
                chunks.append((guard, regs, dst, operand + p * self.rows_per_pass * 128))
        sa_dst, scale = self.r(hint="sa_dst_stage"), b.regs("b32", 4, "ld_sa")
        e(f"add.u32 {sa_dst}, {self.sa_dst}, {stage_offset};",
          scale_guard + f"ld.global.cg.v4.b32 {{{', '.join(scale)}}}, [{self.sa_src}];")
        chunks.append((scale_guard, scale, sa_dst, SA_OFFSET))
        for chunk_guard, regs, address, offset in chunks:
            e(chunk_guard + f"st.shared.v4.b32 [{address}+{offset}], {{{', '.join(regs)}}};")

    def fragment_setup(self):
        """Per-k-step ldmatrix addresses (a_fragment_offset / b_fragment_offset without the tile offsets)."""
        e, r = self.emit, self.r
        if not self.o.ldmatrix:
            return self.fragment_setup_without_ldmatrix()
        if self.fragment_offsets is not None:
            return self.fragment_setup_traced()
        x, half_a, half_b, row_a, row_b, t = r(), r(), r(), r(), r(), r()
        swizzle_a = [f"xor.b32 {half_a}, {half_a}, {x};"] if self.o.swizzle else []
        swizzle_b = [f"xor.b32 {half_b}, {half_b}, {x};"] if self.o.swizzle else []
        e(f"and.b32 {x}, {self.lane}, 7;",
          f"shr.u32 {half_a}, {self.lane}, 4;", *swizzle_a,
          f"shr.u32 {half_b}, {self.lane}, 3;", f"and.b32 {half_b}, {half_b}, 1;", *swizzle_b,
          f"and.b32 {row_a}, {self.lane}, 15;", f"shl.b32 {t}, {self.warp_m}, {self.warp_m_shift};",
          f"add.u32 {row_a}, {row_a}, {t};",
          f"shl.b32 {row_a}, {row_a}, 7;", f"add.u32 {row_a}, {row_a}, {self.smem};",
          f"shr.u32 {row_b}, {self.lane}, 4;", f"shl.b32 {row_b}, {row_b}, 3;", f"add.u32 {row_b}, {row_b}, {x};",
          f"shl.b32 {t}, {self.warp_n}, 5;", f"add.u32 {row_b}, {row_b}, {t};",
          f"shl.b32 {row_b}, {row_b}, 7;", f"add.u32 {row_b}, {row_b}, {self.smem};")
        self.a_frag, self.b_frag = [], []
        for ks in range(K_STEPS):
            for half, row, out in ((half_a, row_a, self.a_frag), (half_b, row_b, self.b_frag)):
                addr = r(hint="frag")
                e(f"xor.b32 {addr}, {half}, {2 * ks};", f"shl.b32 {addr}, {addr}, 4;",
                  f"add.u32 {addr}, {addr}, {row};")
                out.append(addr)
        self.scale_read_setup(t)

    def traced_op(self, name: str, left, right):
        """One operator of a traced offset function (:class:`Traced`): folded, shared, or one instruction."""
        if isinstance(left, int) and isinstance(right, int):
            return {"add": left + right, "sub": left - right, "mul": left * right, "div": left // right,
                    "rem": left % right, "and": left & right, "or": left | right, "xor": left ^ right,
                    "shl": left << right, "shr": left >> right}[name] & 0xFFFFFFFF
        if isinstance(right, int) and right > 0 and right & (right - 1) == 0 and name in ("mul", "div", "rem"):
            name, right = {"mul": ("shl", right.bit_length() - 1), "div": ("shr", right.bit_length() - 1),
                           "rem": ("and", right - 1)}[name]
        operands = tuple(x.register if isinstance(x, Traced) else str(x) for x in (left, right))
        key = (name,) + operands
        if key not in self.traced:
            out = self.r(hint="off")
            self.emit(f"{_TRACED_PTX[name]} {out}, {operands[0]}, {operands[1]};")
            self.traced[key] = Traced(self, out)
        return self.traced[key]

    def traced_address(self, value, base: str) -> str:
        """u32 register holding shared address ``base`` + the traced offset ``value``."""
        out = self.r(hint="frag")
        value = Traced.lift(self, value)
        self.emit(f"add.u32 {out}, {base}, {value.register if isinstance(value, Traced) else value};")
        return out

    def fragment_setup_traced(self):
        """Exercise 04: every ldmatrix address from the student's (or the stage's) offset functions, run on the
        warp and lane registers while generating: per k step, one per A m tile and one per B pair of n tiles."""
        a_offset, b_offset = self.fragment_offsets
        self.traced = {}
        warp_m, warp_n, lane = (Traced(self, x) for x in (self.warp_m, self.warp_n, self.lane))
        b_base = self.r(hint="b_smem")
        self.emit(f"add.u32 {b_base}, {self.smem}, {B_OFFSET};")
        self.a_frag_traced = [[self.traced_address(a_offset(warp_m, lane, mt, ks), self.smem)
                               for mt in range(self.m_tiles)] for ks in range(K_STEPS)]
        self.b_frag_traced = [[self.traced_address(b_offset(warp_n, lane, pair, ks), b_base)
                               for pair in range(N_TILES // 2)] for ks in range(K_STEPS)]
        self.scale_read_setup(self.r())

    def fragment_setup_without_ldmatrix(self):
        """Without ldmatrix (ablation): lane l = 4g + t loads register j of its fragment itself, 4 bytes at
        K byte 4t (+16 for registers 2-3 of A, 1 of B) of row g (+8 for registers 1 and 3 of A) of its m or n
        tile: the bytes ldmatrix would have handed it. Per k step: the low-half address; the high half sits one
        chunk over, at +16 or -16 (chunk (2ks ^ g) ^ 1) with the swizzle, at +16 without."""
        e, r = self.emit, self.r
        g, t4, row_a, row_b, t = r(), r(), r(), r(), r()
        e(f"shr.u32 {g}, {self.lane}, 2;", f"and.b32 {t4}, {self.lane}, 3;", f"shl.b32 {t4}, {t4}, 2;",
          f"shl.b32 {t}, {self.warp_m}, {self.warp_m_shift};", f"add.u32 {row_a}, {g}, {t};",
          f"shl.b32 {row_a}, {row_a}, 7;", f"add.u32 {row_a}, {row_a}, {self.smem};",
          f"add.u32 {row_a}, {row_a}, {t4};",
          f"shl.b32 {t}, {self.warp_n}, 5;", f"add.u32 {row_b}, {g}, {t};",
          f"shl.b32 {row_b}, {row_b}, 7;", f"add.u32 {row_b}, {row_b}, {self.smem};",
          f"add.u32 {row_b}, {row_b}, {t4};")
        self.high_delta = None
        if self.o.swizzle:
            self.high_delta = r(hint="hi")
            e(f"and.b32 {self.high_delta}, {g}, 1;", f"shl.b32 {self.high_delta}, {self.high_delta}, 5;",
              f"sub.u32 {self.high_delta}, 16, {self.high_delta};")
        self.a_frag, self.b_frag = [], []
        for ks in range(K_STEPS):
            for row, out in ((row_a, self.a_frag), (row_b, self.b_frag)):
                addr = r(hint="frag")
                if self.o.swizzle:
                    e(f"xor.b32 {addr}, {g}, {2 * ks};", f"shl.b32 {addr}, {addr}, 4;",
                      f"add.u32 {addr}, {addr}, {row};")
                else:
                    e(f"add.u32 {addr}, {row}, {32 * ks};")
                out.append(addr)
        self.scale_read_setup(t)

    def scale_read_setup(self, t: str):
        # this thread's accumulator rows in the scale tile: warp_m*WARP_M + lane//4 (+ 16*m_tile + 8*half)
        e, r = self.emit, self.r
        self.sa_read = r(hint="sa_rd")
        e(f"shr.u32 {t}, {self.lane}, 2;", f"shl.b32 {self.sa_read}, {self.warp_m}, {self.warp_m_shift};",
          f"add.u32 {self.sa_read}, {self.sa_read}, {t};", f"shl.b32 {self.sa_read}, {self.sa_read}, 2;",
          f"add.u32 {self.sa_read}, {self.sa_read}, {self.smem};")

    # -- one K block -----------------------------------------------------------------------------------
    def load_fragments(self, ks: int, a_addr: str, b_addr: str):
        """A fragments of the warp's m tiles and B fragments of its n tiles for k step ``ks``."""
        e = self.emit
        if self.o.ldmatrix:
            for mt in range(self.m_tiles):
                e(mma_sync.ldmatrix_x4(self.a_regs[mt], a_addr, mt * 16 * 128))
            for pair in range(N_TILES // 2):
                e(mma_sync.ldmatrix_x4(self.b_regs[pair], b_addr, B_OFFSET + pair * 16 * 128))
            return
        a_high, b_high, high = a_addr, b_addr, 16
        if self.high_delta is not None:
            a_high, b_high, high = self.r(), self.r(), 0
            e(f"add.u32 {a_high}, {a_addr}, {self.high_delta};", f"add.u32 {b_high}, {b_addr}, {self.high_delta};")
        for mt in range(self.m_tiles):
            regs, base = self.a_regs[mt], mt * 16 * 128
            for reg, (address, offset) in zip(regs, ((a_addr, base), (a_addr, base + 8 * 128),
                                                     (a_high, base + high), (a_high, base + 8 * 128 + high))):
                e(f"ld.shared.b32 {reg}, [{address}+{offset}];")
        for nt in range(N_TILES):
            low, high_reg = self.b_regs[nt // 2][2 * (nt % 2): 2 * (nt % 2) + 2]
            base = B_OFFSET + nt * 8 * 128
            e(f"ld.shared.b32 {low}, [{b_addr}+{base}];", f"ld.shared.b32 {high_reg}, [{b_high}+{base + high}];")

    def load_fragments_traced(self, ks: int, stage_offset: str | int):
        """Exercise 04: load_fragments with the traced addresses (each already includes its tile offset)."""
        for regs, address in zip(self.a_regs + self.b_regs, self.a_frag_traced[ks] + self.b_frag_traced[ks]):
            staged = self.r()
            self.emit(f"add.u32 {staged}, {address}, {stage_offset};", mma_sync.ldmatrix_x4(regs, staged, 0))

    def compute_block(self, stage_offset: str | int):
        e, r = self.emit, self.r
        sb_value = r("f32", "sb")
        e(c.ld_global("f32", sb_value, self.sb_src, cache=".nc"), f"add.u64 {self.sb_src}, {self.sb_src}, 4;")
        for ks in range(K_STEPS):
            if self.fragment_offsets is not None and self.o.ldmatrix:
                self.load_fragments_traced(ks, stage_offset)
            else:
                a_addr, b_addr = r(), r()
                e(f"add.u32 {a_addr}, {self.a_frag[ks]}, {stage_offset};",
                  f"add.u32 {b_addr}, {self.b_frag[ks]}, {stage_offset};")
                self.load_fragments(ks, a_addr, b_addr)
            for mt in range(self.m_tiles):
                for nt in range(N_TILES):
                    b_pair = self.b_regs[nt // 2][2 * (nt % 2): 2 * (nt % 2) + 2]
                    addend = [self.zero] * 4 if ks == 0 else self.acc[mt][nt]  # a fresh sum per K block
                    e(mma_sync.mma_m16n8k32_e4m3(self.acc[mt][nt], self.a_regs[mt], b_pair, addend))
        sa_addr = r()
        e(f"add.u32 {sa_addr}, {self.sa_read}, {stage_offset};")
        for mt in range(self.m_tiles):
            for half in range(2):
                scale = r("f32", "scale")
                e(f"ld.shared.f32 {scale}, [{sa_addr}+{SA_OFFSET + 4 * (16 * mt + 8 * half)}];",
                  f"mul.f32 {scale}, {scale}, {sb_value};")
                for nt in range(N_TILES):
                    for i in (2 * half, 2 * half + 1):
                        e(c.promote(self.total[mt][nt][i], self.acc[mt][nt][i], scale))

    def main_loop(self):
        e, r, b = self.emit, self.r, self.b
        self.a_regs = [b.regs("b32", 4, "fa") for _ in range(self.m_tiles)]
        self.b_regs = [b.regs("b32", 4, "fb") for _ in range(N_TILES // 2)]
        self.acc = [[b.regs("f32", 4, "acc") for _ in range(N_TILES)] for _ in range(self.m_tiles)]
        self.total = [[b.regs("f32", 4, "tot") for _ in range(N_TILES)] for _ in range(self.m_tiles)]
        self.zero = r("f32", "zero")
        e(f"mov.f32 {self.zero}, 0f00000000;")
        for row in self.total:
            for regs in row:
                e(*(f"mov.f32 {x}, 0f00000000;" for x in regs))
        if self.stages == 1:
            return self.synchronous_loop()
        copies = self.o.cp_async
        b.comment("prologue: the first STAGES-1 K blocks in flight" +
                  (" (empty groups keep the count uniform)" if copies else ""))
        for s in range(self.stages - 1):
            if s < self.kb:
                self.issue_loads(s * STAGE_BYTES, None, self.is_scale_loader)
            if copies:
                e(async_copies.cp_async_commit())
        kb, ahead, rd, wr = r(hint="kb"), r(hint="ahead"), r(hint="read_stage"), r(hint="write_stage")
        load, load_scales, more, wrap = r("pred"), r("pred"), r("pred"), r("pred")
        e(f"mov.u32 {kb}, 0;", f"mov.u32 {rd}, 0;", f"mov.u32 {wr}, {(self.stages - 1) * STAGE_BYTES};")
        top = b.label("k_block")
        b.place(top)
        if copies:
            b.comment("block kb has landed (this thread's copies) and is visible to all (everyone's); the stage "
                      "written next was read in iteration kb-1, which every warp has finished")
            e(async_copies.cp_async_wait(self.stages - 2), c.bar_sync(0))
        else:
            b.comment("block kb was stored in an earlier iteration and is visible to all; the stage written next "
                      "was read in iteration kb-1, which every warp has finished")
            e(c.bar_sync(0))
        e(f"add.u32 {ahead}, {kb}, {self.stages - 1};", f"setp.lt.u32 {load}, {ahead}, {self.kb};",
          f"and.pred {load_scales}, {load}, {self.is_scale_loader};")
        self.issue_loads(wr, load, load_scales)
        if copies:
            e(async_copies.cp_async_commit())
        self.compute_block(rd)
        for offset in (rd, wr):
            e(f"add.u32 {offset}, {offset}, {STAGE_BYTES};", f"setp.eq.u32 {wrap}, {offset}, {self.shared_bytes};",
              f"selp.u32 {offset}, 0, {offset}, {wrap};")
        e(f"add.u32 {kb}, {kb}, 1;", f"setp.lt.u32 {more}, {kb}, {self.kb};", f"@{more} bra {top};")

    def synchronous_loop(self):
        """One stage (ablation): load block kb, wait for it, compute it, and let every warp finish reading it
        before the next block overwrites it; loads and math never overlap."""
        e, r, b = self.emit, self.r, self.b
        kb, more = r(hint="kb"), r("pred")
        e(f"mov.u32 {kb}, 0;")
        top = b.label("k_block")
        b.place(top)
        self.issue_loads(0, None, self.is_scale_loader)
        if self.o.cp_async:
            e(async_copies.cp_async_commit(), async_copies.cp_async_wait(0))
        b.comment("block kb is in shared memory (everyone's copies)")
        e(c.bar_sync(0))
        self.compute_block(0)
        b.comment("every warp is done reading the stage before it is refilled")
        e(c.bar_sync(0))
        e(f"add.u32 {kb}, {kb}, 1;", f"setp.lt.u32 {more}, {kb}, {self.kb};", f"@{more} bra {top};")

    # -- epilogue --------------------------------------------------------------------------------------
    def store(self):
        """D = BF16(total): rows g, g+8 and columns 2t, 2t+1 of every mma tile, masked at the ragged edges."""
        e, r = self.emit, self.r
        g, t, row, col, wide, ptr = r(), r(), r(hint="row"), r(hint="col"), r("u64"), r("u64", "dst")
        e(f"shr.u32 {g}, {self.lane}, 2;", f"and.b32 {t}, {self.lane}, 3;",
          f"shl.b32 {row}, {self.warp_m}, {self.warp_m_shift};", f"add.u32 {row}, {row}, {g};",
          f"add.u32 {row}, {row}, {self.m0};",
          f"shl.b32 {col}, {self.warp_n}, 5;", f"shl.b32 {t}, {t}, 1;", f"add.u32 {col}, {col}, {t};",
          f"add.u32 {col}, {col}, {self.n0};",
          f"mul.wide.u32 {ptr}, {row}, {2 * self.n};", f"mul.wide.u32 {wide}, {col}, 2;",
          f"add.u64 {ptr}, {ptr}, {wide};", f"add.u64 {ptr}, {ptr}, {self.d};")
        col_ok = []
        for nt in range(N_TILES):
            preds = []
            for extra in ((0, 1) if self.n % 2 else (0,)):
                if self.ragged_n:
                    p = r("pred")
                    e(f"setp.lt.u32 {p}, {col}, {max(self.n - nt * 8 - extra, 0)};")
                    preds.append(p)
                else:
                    preds.append(None)
            col_ok.append(preds)
        for mt in range(self.m_tiles):
            for half in range(2):
                row_ok = None
                if self.ragged_m:
                    row_ok = r("pred")
                    e(f"setp.lt.u32 {row_ok}, {row}, {max(self.m - 16 * mt - 8 * half, 0)};")
                for nt in range(N_TILES):
                    lo, hi = self.total[mt][nt][2 * half], self.total[mt][nt][2 * half + 1]
                    offset = (16 * mt + 8 * half) * 2 * self.n + 2 * 8 * nt
                    if self.n % 2 == 0:  # both columns in or both out; 4-byte aligned
                        packed = r("b32")
                        e(c.cvt_f32x2_to_bf16x2(packed, hi, lo))
                        e(self._guard(row_ok, col_ok[nt][0]) + c.st_global("b32", ptr, packed, offset))
                    else:  # odd N: rows start at odd element offsets, so store halves one by one
                        for value, extra in ((lo, 0), (hi, 1)):
                            h = r("b16")
                            guard = self._guard(row_ok, col_ok[nt][extra])
                            e(f"cvt.rn.bf16.f32 {h}, {value};",
                              guard + c.st_global("b16", ptr, h, offset + 2 * extra))

    def _guard(self, *preds):
        return c.guard_prefix(preds, lambda: self.r("pred"), self.emit)

    def build(self) -> str:
        self.indices()
        self.load_setup()
        self.fragment_setup()
        self.main_loop()
        self.store()
        return module([self.b], extra_globals=shared_memory.dynamic_shared_declaration(SMEM))


def _check_shape(m: int, n: int, k: int) -> None:
    if min(m, n, k) <= 0 or k % BLOCK_K:
        raise ValueError(f"stage 04 needs M, N > 0 and K a positive multiple of {BLOCK_K}, got {m}x{n}x{k}")
    if m * k >= 2**32 or n * k >= 2**32 or 2 * m * n >= 2**32:
        raise ValueError(f"stage 04 addresses rows with 32-bit products: {m}x{n}x{k} is too large")


@functools.lru_cache(maxsize=None)
def generate(m: int, n: int, k: int, options: Options = DEFAULT, fragment_offsets=None) -> str:
    """The PTX text of the kernel specialized for (M, N, K); ``options`` turns the stage's ideas off one by one.
    ``fragment_offsets`` (exercise 04): a pair of functions like (:func:`a_fragment_offset`,
    :func:`b_fragment_offset`) that then compute every ldmatrix address (see :class:`Traced`)."""
    _check_shape(m, n, k)
    return _Gen(m, n, k, options, fragment_offsets).build()


def grid(m: int, n: int) -> tuple[int, int, int]:
    return ceil_div(n, BLOCK_N), ceil_div(m, BLOCK_M), 1


@functools.lru_cache(maxsize=None)
def _kernel(m: int, n: int, k: int, options: Options = DEFAULT, fragment_offsets=None):
    from ptx.compile import compile_ptx
    from ptx.runtime import load_kernel
    return load_kernel(compile_ptx(generate(m, n, k, options, fragment_offsets)), KERNEL)


def shared_bytes(m: int, n: int, k: int, options: Options = DEFAULT) -> int:
    """Dynamic shared memory the kernel for (M, N, K) launches with."""
    return options.shared_bytes


def gemm(a, sa, b, sb, d, stream=None, options: Options = DEFAULT, fragment_offsets=None) -> None:
    """D = (A*sA)(B*sB)^T, BF16 out (contract in gemm.fp8); asynchronous on ``stream``."""
    from gemm.validate import check_gemm_args
    args = check_gemm_args(a, sa, b, sb, d)
    kernel = _kernel(args.m, args.n, args.k, options, fragment_offsets)
    kernel.launch(grid(args.m, args.n), options.threads,
                  [args.a.ptr, args.sa.ptr, args.b.ptr, args.sb.ptr, args.d.ptr, np.uint32(args.sa_stride)],
                  shared_bytes=options.shared_bytes, stream=stream)


def emulate(a, sa, b, sb, *, seed=None, options: Options = DEFAULT, fragment_offsets=None) -> np.ndarray:
    """Run this stage's generated PTX on the CPU (ptx.emulate, each CTA's threads in lockstep) for host
    operands in the gemm.fp8 contract; D as float32, NaN where the kernel wrote nothing. Lockstep has no
    schedule to vary, so ``seed`` is unused. ``ptx.emulate.run_stage(stage, ...)`` adds a report and edits."""
    from gemm.fp8 import align, bf16_to_float
    from ptx.emulate.lockstep import run_kernel
    m, k = a.shape
    n = b.shape[0]
    sa_storage = np.zeros((sa.shape[1], align(m, 4)), np.float32)  # the M-major, M-padded-to-4 scale bytes
    sa_storage[:, :m] = np.asarray(sa).T
    d = np.full((m, n), 0x7FC0, np.uint16)  # BF16 NaN: what the kernel never writes stays NaN
    run_kernel(generate(m, n, k, options, fragment_offsets), KERNEL, grid(m, n), options.threads, options.shared_bytes,
               dict(a=np.ascontiguousarray(a).view(np.uint8), sa=sa_storage, b=np.ascontiguousarray(b).view(np.uint8),
                    sb=np.ascontiguousarray(sb, np.float32), d=d, sa_stride=align(m, 4)))
    return bf16_to_float(d)
