"""Core PTX idioms every kernel uses: ids, parameters, global memory, FP8/BF16 conversions, the promotion FMA,
branches, named barriers.

Each helper returns PTX text (one or a few instructions) for :meth:`ptx.builder.KernelBuilder.emit`;
registers are passed in by name, so the helpers never allocate. Comments name
the PTX ISA 8.5 section (the instruction's own section, or "Special Registers").
"""
from __future__ import annotations


# -- ids ---------------------------------------------------------------------------------------------
def special(dst: str, register: str) -> str:
    # PTX ISA "Special Registers": %tid, %ntid, %ctaid, %nctaid, %laneid, %cluster_ctarank, ...
    return f"mov.u32 {dst}, %{register.lstrip('%')};"


def global_thread_index(dst: str, scratch: str, axis: str = "x") -> str:
    # PTX ISA "Special Registers" (%ctaid, %ntid, %tid): dst = ctaid * ntid + tid (special registers
    # cannot be arithmetic operands, so they go through registers first)
    return "\n".join([
        special(dst, f"ctaid.{axis}"),
        special(scratch, f"ntid.{axis}"),
        f"mul.lo.u32 {dst}, {dst}, {scratch};",
        special(scratch, f"tid.{axis}"),
        f"add.u32 {dst}, {dst}, {scratch};",
    ])


def warp_broadcast(dst: str, src: str, lane: int = 0) -> str:
    # PTX ISA "shfl.sync" (.idx, whole warp): every lane takes lane ``lane``'s ``src``. Beyond moving data, it
    # tells ptxas the value is warp-uniform, so what is computed from it (wgmma descriptors) stays on the
    # uniform datapath instead of being rebuilt per thread and moved over with R2UR
    return f"shfl.sync.idx.b32 {dst}, {src}, {lane}, 31, -1;"


def cluster_rank(dst_u32: str) -> str:
    # PTX ISA "Special Registers" (%cluster_ctarank): this CTA's rank in its cluster
    return special(dst_u32, "cluster_ctarank")


# -- parameters and addresses ------------------------------------------------------------------------
def ld_param(ptx_type: str, dst: str, param_symbol: str) -> str:
    # PTX ISA "ld" (state space .param): read a kernel parameter
    return f"ld.param.{ptx_type} {dst}, [{param_symbol}];"


def cvta_global(dst: str, src: str) -> str:
    # PTX ISA "cvta": generic address -> .global address (pointer parameters
    # arrive as generic addresses)
    return f"cvta.to.global.u64 {dst}, {src};"


def global_pointer_param(dst: str, param_symbol: str) -> str:
    """ld.param + cvta: a .u64 pointer parameter as a .global address."""
    return ld_param("u64", dst, param_symbol) + "\n" + cvta_global(dst, dst)


def element_address(dst: str, base: str, index_u32: str, element_bytes: int) -> str:
    # PTX ISA "mul" (.wide) and "add": dst = base + index * element_bytes
    # in 64 bits
    return f"mul.wide.u32 {dst}, {index_u32}, {element_bytes};\nadd.s64 {dst}, {base}, {dst};"


# -- global memory -----------------------------------------------------------------------------------
def ld_global(ptx_type: str, dst: str, address: str, offset: int = 0, cache: str = "") -> str:
    # PTX ISA "ld": one scalar from .global (cache ".nc": read-only path)
    return f"ld.global{cache}.{ptx_type} {dst}, [{address}{_offset(offset)}];"


def st_global(ptx_type: str, address: str, src: str, offset: int = 0) -> str:
    # PTX ISA "st": one scalar to .global
    return f"st.global.{ptx_type} [{address}{_offset(offset)}], {src};"


def ld_global_v4(dst4: list[str], address: str, offset: int = 0, cache: str = ".nc") -> str:
    # PTX ISA "ld" with .v4.b32: one 16-byte load (16-byte aligned address)
    return f"ld.global{cache}.v4.b32 {{{', '.join(dst4)}}}, [{address}{_offset(offset)}];"


def st_global_v4(address: str, src4: list[str], offset: int = 0) -> str:
    # PTX ISA "st" with .v4.b32: one 16-byte store (16-byte aligned address)
    return f"st.global.v4.b32 [{address}{_offset(offset)}], {{{', '.join(src4)}}};"


def _offset(offset: int) -> str:
    return f"+{offset}" if offset > 0 else (f"{offset}" if offset < 0 else "")


# -- conversions -------------------------------------------------------------------------------------
def cvt_e4m3x2_to_f16x2(dst_b32: str, src_b16: str) -> str:
    # PTX ISA "cvt" (.f16x2.e4m3x2, sm_89+): two e4m3 bytes -> two f16
    # halves, exactly (every e4m3 value is an f16); the low byte becomes the low half
    return f"cvt.rn.f16x2.e4m3x2 {dst_b32}, {src_b16};"


def cvt_f16_to_f32(dst_f32: str, src_b16: str) -> str:
    # PTX ISA "cvt": f16 -> f32 (exact)
    return f"cvt.f32.f16 {dst_f32}, {src_b16};"


def unpack_b32(low_b16: str, high_b16: str, src_b32: str) -> str:
    # PTX ISA "mov" (vector unpack): b32 -> its low and high 16-bit halves
    return f"mov.b32 {{{low_b16}, {high_b16}}}, {src_b32};"


def cvt_f32x2_to_bf16x2(dst_b32: str, high_f32: str, low_f32: str) -> str:
    # PTX ISA "cvt" (.bf16x2.f32, sm_80+): round two f32 to nearest even; the FIRST source goes to the
    # UPPER half, so pass (element 1, element 0) to store element 0 at the lower address
    return f"cvt.rn.bf16x2.f32 {dst_b32}, {high_f32}, {low_f32};"


# -- arithmetic --------------------------------------------------------------------------------------
def promote(total: str, partial: str, scale: str) -> str:
    # PTX ISA "Floating point instructions: fma": one FFMA, the scale promotion total += partial * scale
    return f"fma.rn.f32 {total}, {partial}, {scale}, {total};"


def promote_first(total: str, partial: str, scale: str) -> str:
    # PTX ISA "Floating point instructions: mul": a tile's first promotion writes the total (total = partial * scale),
    # so the totals need no zeroing first; the value fma into a zero total gives (but for the sign of an exact zero)
    return f"mul.rn.f32 {total}, {partial}, {scale};"


def divide_by_constant(dst_u32: str, src_u32: str, divisor: int) -> str:
    # PTX ISA "shr" / "div" (.u32): dst = src / divisor for a compile-time divisor; a shift where it is a power of
    # two (what the power-of-two-only kernels always emitted), else div.u32 by an immediate (ptxas 13.0 emits a
    # reciprocal sequence of about ten instructions for it, not a multiply-high: keep it off per-K-block paths)
    if divisor & (divisor - 1) == 0:
        return f"shr.u32 {dst_u32}, {src_u32}, {divisor.bit_length() - 1};"
    return f"div.u32 {dst_u32}, {src_u32}, {divisor};"


# -- control -----------------------------------------------------------------------------------------
def setp(compare: str, ptx_type: str, predicate: str, a: str, b: str) -> str:
    # PTX ISA "setp": predicate = a <compare> b (eq ne lt le gt ge; lo hi ls hs)
    return f"setp.{compare}.{ptx_type} {predicate}, {a}, {b};"


def guard_prefix(preds, new_predicate, emit) -> str:
    # PTX ISA "Predicated Execution": the "@p " an instruction is guarded by; two conditions are first combined
    # with and.pred into ``new_predicate()`` (allocated only then); none: unguarded ("")
    preds = [p for p in preds if p]
    if not preds:
        return ""
    if len(preds) == 1:
        return f"@{preds[0]} "
    both = new_predicate()
    emit(f"and.pred {both}, {preds[0]}, {preds[1]};")
    return f"@{both} "


def branch_if(predicate: str, label: str, negate: bool = False) -> str:
    # PTX ISA "bra" with a guard predicate
    return f"@{'!' if negate else ''}{predicate} bra {label};"


def branch(label: str) -> str:
    # PTX ISA "bra" (.uni: when every thread takes it)
    return f"bra.uni {label};"


def exit_if(predicate: str, label_done: str) -> str:
    """Guard for ragged edges: threads with ``predicate`` set jump to the end of the kernel."""
    return branch_if(predicate, label_done)


def bar_sync(barrier: int = 0, threads: int | None = None) -> str:
    # PTX ISA "bar": the CTA (or `threads` of it) meets at
    # named barrier `barrier`
    return f"bar.sync {barrier}, {threads};" if threads else f"bar.sync {barrier};"


def bar_arrive(barrier: int, threads: int) -> str:
    # PTX ISA "bar" (bar.arrive): count this warp at named barrier `barrier` (of `threads`) without waiting
    return f"bar.arrive {barrier}, {threads};"


def exit_thread() -> str:
    # PTX ISA "exit": the thread terminates; the CTA lives on while others run (named barriers must not
    # count exited threads, so roles that exit early never join barrier 0 again)
    return "exit;"


__all__ = [
    "special", "global_thread_index", "cluster_rank", "ld_param", "cvta_global", "global_pointer_param", "element_address",
    "ld_global", "st_global", "ld_global_v4", "st_global_v4", "cvt_e4m3x2_to_f16x2", "cvt_f16_to_f32",
    "unpack_b32", "cvt_f32x2_to_bf16x2", "promote", "promote_first", "divide_by_constant", "setp", "guard_prefix", "branch_if", "branch", "exit_if",
    "bar_sync", "bar_arrive", "exit_thread",
]
