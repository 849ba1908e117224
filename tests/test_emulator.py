"""ptx.emulate on hand-written kernels (CPU): warp specialization (an elected producer thread feeding a math
warpgroup through a ring of mbarriers), deadlock reports, races exposed by preemption, stmatrix, TMA stores
(clipping, 128B swizzle, the bulk-group wait), named barriers. Every kernel also assembles for sm_90a, so the
text is real PTX, not a dialect only the emulator accepts."""
import numpy as np
import pytest

from ptx.emulate import EmulationError, FakeTensorMap, run_kernel
from ptx.vocab import core

HEADER = ".version 8.5\n.target sm_90a\n.address_size 64\n.extern .shared .align 1024 .b8 smem[];\n"
REGS = ".reg .b32 %r<32>;\n.reg .b64 %rd<8>;\n.reg .pred %p<8>;\n.reg .f32 %f<4>;\n"


def pointer(reg: str, param: str) -> str:
    return f"ld.param.u64 {reg}, [{param}];\ncvta.to.global.u64 {reg}, {reg};\n"


def kernel(name: str, params: list[str], threads: int, body: str) -> str:
    declared = ",\n".join(f"    .param {p}" for p in params)
    return f"{HEADER}.visible .entry {name}(\n{declared}\n)\n.maxntid {threads}, 1, 1\n{{\n{REGS}{body}}}\n"


# ------------------------------------------------------------------------------ a warp-specialized ring
# Threads 0-127: the producer warpgroup; thread 0 loops issuing TMA loads of 4 x 32 f32 tiles into a 2-stage
# ring, the others exit. Threads 128-255: the consumers; thread c adds element c of each tile. CTA b takes
# tiles b, b + nctaid, ... (div/rem give the stage and parity). Barriers at 1024: full[2], then empty[2].
def ring(parity_flip=1, early_release=False) -> str:
    release = "mbarrier.arrive.shared::cta.b64 _, [%r11];\n"
    return kernel("ring", [".align 64 .b8 ring_param_tmap[128]", ".u64 ring_param_out",
                           ".u32 ring_param_tiles"], 256, f"""
mov.u32 %r0, %tid.x;
mov.u32 %r1, %ctaid.x;
mov.u32 %r2, %nctaid.x;
mov.u32 %r3, smem;
ld.param.u32 %r4, [ring_param_tiles];
setp.eq.u32 %p0, %r0, 0;
@!%p0 bra $init_done;
add.u32 %r5, %r3, 1024;
mbarrier.init.shared::cta.b64 [%r5], 1;
mbarrier.init.shared::cta.b64 [%r5+8], 1;
mbarrier.init.shared::cta.b64 [%r5+16], 128;
mbarrier.init.shared::cta.b64 [%r5+24], 128;
fence.mbarrier_init.release.cluster;
$init_done:
bar.sync 0;
setp.ge.u32 %p1, %r0, 128;
mov.u32 %r6, 0;
mov.u32 %r7, %r1;
@%p1 bra $consumer;
setmaxnreg.dec.sync.aligned.u32 40;
@!%p0 exit;
mov.b64 %rd0, ring_param_tmap;
cvta.param.u64 %rd0, %rd0;
$p_loop:
setp.ge.u32 %p2, %r7, %r4;
@%p2 bra $p_end;
rem.u32 %r8, %r6, 2;
div.u32 %r9, %r6, 2;
and.b32 %r9, %r9, 1;
xor.b32 %r9, %r9, {parity_flip};
mad.lo.u32 %r10, %r8, 8, %r3;
add.u32 %r11, %r10, 1040;
add.u32 %r10, %r10, 1024;
mad.lo.u32 %r12, %r8, 512, %r3;
$p_wait:
mbarrier.try_wait.parity.shared::cta.b64 %p3, [%r11], %r9;
@!%p3 bra $p_wait;
mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r10], 512;
shl.b32 %r13, %r7, 2;
cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r12], [%rd0, {{0, %r13}}], [%r10];
add.u32 %r6, %r6, 1;
add.u32 %r7, %r7, %r2;
bra.uni $p_loop;
$p_end:
exit;
$consumer:
setmaxnreg.inc.sync.aligned.u32 232;
sub.u32 %r14, %r0, 128;
mov.f32 %f0, 0f00000000;
$c_loop:
setp.ge.u32 %p2, %r7, %r4;
@%p2 bra $c_end;
rem.u32 %r8, %r6, 2;
div.u32 %r9, %r6, 2;
and.b32 %r9, %r9, 1;
mad.lo.u32 %r10, %r8, 8, %r3;
add.u32 %r11, %r10, 1040;
add.u32 %r10, %r10, 1024;
mad.lo.u32 %r12, %r8, 512, %r3;
mad.lo.u32 %r12, %r14, 4, %r12;
$c_wait:
mbarrier.try_wait.parity.shared::cta.b64 %p3, [%r10], %r9;
@!%p3 bra $c_wait;
{release if early_release else ""}ld.shared.f32 %f1, [%r12];
add.f32 %f0, %f0, %f1;
{"" if early_release else release}add.u32 %r6, %r6, 1;
add.u32 %r7, %r7, %r2;
bra.uni $c_loop;
$c_end:
mad.lo.u32 %r15, %r1, 128, %r14;
{pointer('%rd1', 'ring_param_out')}mul.wide.u32 %rd2, %r15, 4;
add.s64 %rd1, %rd1, %rd2;
st.global.f32 [%rd1], %f0;
ret;
""")


def run_ring(ptx, tiles=5, ctas=2, **options):
    x = np.arange(tiles * 4 * 32, dtype=np.float32).reshape(tiles * 4, 32) % 251
    tmap = FakeTensorMap(x, np.float32, x.shape, 128, (4, 32), 0)
    out = np.full(ctas * 128, np.nan, np.float32)
    stats = run_kernel(ptx, "ring", (ctas,), 256, 1056, dict(tmap=tmap, out=out, tiles=tiles), **options)
    tile_values = x.reshape(tiles, 128)
    want = np.concatenate([tile_values[b::ctas].sum(0) for b in range(ctas)])
    return out, want, stats


@pytest.mark.parametrize("options", [{}, dict(preempt=False), dict(seed=1), dict(seed=2)])
def test_producer_warpgroup_feeds_consumers_through_a_ring(options):
    out, want, stats = run_ring(ring(), **options)
    np.testing.assert_array_equal(out, want)
    assert stats.ctas == 2 and stats.switches > 6  # the warpgroups took turns, many times


def test_wrong_parity_is_a_deadlock_naming_each_warpgroup():
    with pytest.raises(EmulationError, match="deadlock") as error:
        run_ring(ring(parity_flip=0))
    message, lines = str(error.value), ring(parity_flip=0).splitlines()
    producer, consumer = (1 + lines.index(f"mbarrier.try_wait.parity.shared::cta.b64 %p3, [{r}], %r9;")
                          for r in ("%r11", "%r10"))
    assert f"warpgroup 0 at line {producer}: mbarrier.try_wait" in message and "(1 threads active)" in message
    assert f"warpgroup 1 at line {consumer}: mbarrier.try_wait" in message and "(128 threads active)" in message
    assert "mbarrier at shared 1040 to complete the phase of parity 0" in message  # the producer's empty[0]


def test_releasing_a_stage_before_reading_it_gives_a_wrong_answer():
    out, want, _ = run_ring(ring(early_release=True))
    assert not np.array_equal(out, want)  # the producer refilled the stage between the release and the read
    out, want, _ = run_ring(ring(early_release=True), preempt=False)
    np.testing.assert_array_equal(out, want)  # without preemption the bug hides


# ------------------------------------------------------------------------------ stmatrix
def stmatrix_kernel(x: int) -> str:
    words = [f"%r{3 + j}" for j in range(x)]
    make = "".join(f"add.u32 %r20, %r2, {2 * j};\nadd.u32 %r21, %r20, 1;\nshl.b32 %r21, %r21, 16;\n"
                   f"or.b32 {w}, %r20, %r21;\n" for j, w in enumerate(words))
    return kernel("stm", [".u64 stm_param_out"], 32, f"""
mov.u32 %r0, %tid.x;
mov.u32 %r1, smem;
shl.b32 %r2, %r0, 3;
{make}shr.u32 %r10, %r0, 3;
shl.b32 %r10, %r10, 7;
and.b32 %r11, %r0, 7;
shl.b32 %r11, %r11, 4;
add.u32 %r10, %r10, %r11;
add.u32 %r10, %r10, %r1;
stmatrix.sync.aligned.m8n8.x{x}.shared.b16 [%r10], {{{", ".join(words)}}};
bar.sync 0;
shl.b32 %r12, %r0, 4;
add.u32 %r13, %r12, %r1;
ld.shared.v4.b32 {{%r14, %r15, %r16, %r17}}, [%r13];
{pointer('%rd0', 'stm_param_out')}cvt.u64.u32 %rd1, %r12;
add.s64 %rd0, %rd0, %rd1;
st.global.v4.b32 [%rd0], {{%r14, %r15, %r16, %r17}};
ret;
""")


@pytest.mark.parametrize("x", [1, 2, 4])
def test_stmatrix_layout(x):
    """Lane l's register j holds 2 * (4l + j) (low half) and 2 * (4l + j) + 1; matrix j's row r was addressed
    by lane 8j + r at smem + 128j + 16r. By the ISA, element (r, c) of matrix j comes from lane 4r + c // 2,
    half c % 2: so matrix j, row r, column c must hold 2 * (4 * (4r + c // 2) + j) + c % 2."""
    out = np.zeros(256, np.uint16)  # 4 matrices x 8 rows x 8 b16
    run_kernel(stmatrix_kernel(x), "stm", (1,), 32, 512, dict(out=out))
    got = out.reshape(4, 8, 8)
    j, r, c = np.meshgrid(np.arange(4), np.arange(8), np.arange(8), indexing="ij")
    want = np.where(j < x, 2 * (4 * (4 * r + c // 2) + j) + c % 2, 0)
    np.testing.assert_array_equal(got, want)
    assert got[0, 0, :4].tolist() == [0, 1, 8, 9] and (x < 2 or got[1, 2, 5] == 83)  # spot values by hand


# ------------------------------------------------------------------------------ TMA store
# 128 threads fill a box-sized staging tile, element (r, c) = 64r + c (swizzled like a TMA tile when asked);
# thread 0 stores it at (x, y) and waits for the bulk group unless told not to.
def store_kernel(wait=True) -> str:
    params = [".align 64 .b8 st_param_tmap[128]"] + [f".u32 st_param_{n}" for n in ("x", "y", "row_bytes",
                                                                                     "words", "swizzle")]
    return kernel("st", params, 128, f"""
mov.u32 %r0, %tid.x;
mov.u32 %r1, smem;
ld.param.u32 %r2, [st_param_row_bytes];
ld.param.u32 %r3, [st_param_swizzle];
ld.param.u32 %r11, [st_param_words];
mov.u32 %r4, %r0;
$fill:
shl.b32 %r5, %r4, 2;
div.u32 %r6, %r5, %r2;
rem.u32 %r7, %r5, %r2;
shr.u32 %r7, %r7, 1;
mad.lo.u32 %r8, %r6, 64, %r7;
add.u32 %r9, %r8, 1;
shl.b32 %r9, %r9, 16;
or.b32 %r8, %r8, %r9;
shr.u32 %r10, %r5, 7;
and.b32 %r10, %r10, 7;
shl.b32 %r10, %r10, 4;
mul.lo.u32 %r10, %r10, %r3;
xor.b32 %r10, %r5, %r10;
add.u32 %r10, %r10, %r1;
st.shared.b32 [%r10], %r8;
add.u32 %r4, %r4, 128;
setp.lt.u32 %p0, %r4, %r11;
@%p0 bra $fill;
fence.proxy.async.shared::cta;
bar.sync 0;
setp.ne.u32 %p1, %r0, 0;
@%p1 bra $done;
mov.b64 %rd0, st_param_tmap;
cvta.param.u64 %rd0, %rd0;
ld.param.u32 %r12, [st_param_x];
ld.param.u32 %r13, [st_param_y];
cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd0, {{%r12, %r13}}], [%r1];
cp.async.bulk.commit_group;
{"cp.async.bulk.wait_group.read 0;" if wait else ""}
$done:
ret;
""")


@pytest.mark.parametrize("box, swizzle, x, y", [((32, 64), 128, 0, 0), ((32, 64), 128, 64, 64), ((128, 64), 128, 0, 0),
                                                ((64, 16), 0, 96, 32), ((64, 16), 0, 16, 0)])
def test_tma_store_writes_the_box_and_clips_to_the_tensor(box, swizzle, x, y):
    m, n = 70, 100  # ragged: the boxes at (64, 64) and (96, 32) stick out of the tensor
    d = np.full((m, n), 0xFFFF, np.uint16)
    tmap = FakeTensorMap(d, np.uint16, (m, n), 2 * n, box, swizzle)
    words = box[0] * box[1] // 2
    run_kernel(store_kernel(), "st", (1,), 128, box[0] * box[1] * 2,
               dict(tmap=tmap, x=x, y=y, row_bytes=2 * box[1], words=words, swizzle=swizzle // 128))
    want = np.full((m, n), 0xFFFF, np.uint16)
    rows, cols = min(box[0], m - y), min(box[1], n - x)
    want[y:y + rows, x:x + cols] = 64 * np.arange(rows)[:, None] + np.arange(cols)[None, :]
    np.testing.assert_array_equal(d, want)


def test_tma_store_without_wait_group_is_an_error():
    d = np.zeros((32, 64), np.uint16)
    tmap = FakeTensorMap(d, np.uint16, d.shape, 128, (32, 64), 128)
    with pytest.raises(EmulationError, match="bulk store pending at exit"):
        run_kernel(store_kernel(wait=False), "st", (1,), 128, 4096,
                   dict(tmap=tmap, x=0, y=0, row_bytes=128, words=1024, swizzle=1))
    assert not d.any()  # never performed


# ------------------------------------------------------------------------------ named barriers
# Warpgroup 1 writes shared memory and arrives on barrier 1; warpgroup 0 syncs on it before reading (it runs
# first, so it really waits). Then warps 2-3 exit, warps 0-1 meet at barrier 2 (64 threads), and bar.sync 0
# completes once warpgroup 1 has exited too (it counts only live threads).
def named_kernel(count=256) -> str:
    return kernel("named", [".u64 named_param_out"], 256, f"""
mov.u32 %r0, %tid.x;
mov.u32 %r1, smem;
setp.lt.u32 %p0, %r0, 128;
@%p0 bra $reader;
sub.u32 %r2, %r0, 128;
shl.b32 %r2, %r2, 2;
add.u32 %r2, %r2, %r1;
mul.lo.u32 %r3, %r0, 3;
st.shared.u32 [%r2], %r3;
bar.arrive 1, {count};
exit;
$reader:
bar.sync 1, {count};
shl.b32 %r4, %r0, 2;
add.u32 %r5, %r4, %r1;
ld.shared.u32 %r6, [%r5];
{pointer('%rd0', 'named_param_out')}cvt.u64.u32 %rd1, %r4;
add.s64 %rd0, %rd0, %rd1;
st.global.u32 [%rd0], %r6;
setp.ge.u32 %p1, %r0, 64;
@%p1 exit;
bar.sync 2, 64;
bar.sync 0;
ret;
""")


def test_named_barriers_with_counts():
    out = np.zeros(128, np.uint32)
    stats = run_kernel(named_kernel(), "named", (1,), 256, 512, dict(out=out))
    np.testing.assert_array_equal(out, 3 * (np.arange(128) + 128))
    assert stats.switches >= 3


def test_named_barrier_count_too_large_deadlocks():
    with pytest.raises(EmulationError, match=r"deadlock.*bar.sync 1, 384.*named barrier 1 \(256 of 384 threads"):
        run_kernel(named_kernel(count=384), "named", (1,), 256, 512, dict(out=np.zeros(128, np.uint32)))


# ------------------------------------------------------------------------------ wgmma reads at wait_group
# A (64 x 128 bytes) and B (8 x 128 bytes) all e4m3 1.0, so D = 32 everywhere; rewriting A to 2.0 while the
# wgmma is in flight makes it 64 (its operands are read at wgmma.wait_group, as hardware may).
def wgmma_kernel(order: str) -> str:
    def fill(words, value):
        return f"""mov.u32 %r2, %r0;
mov.u32 %r4, {value};
$fill_{value}:
shl.b32 %r3, %r2, 2;
add.u32 %r3, %r3, %r1;
st.shared.b32 [%r3], %r4;
add.u32 %r2, %r2, 128;
setp.lt.u32 %p0, %r2, {words};
@%p0 bra $fill_{value};
"""

    store = f"""{pointer('%rd2', 'mma_param_out')}mul.wide.u32 %rd3, %r0, 16;
add.s64 %rd2, %rd2, %rd3;
st.global.v4.f32 [%rd2], {{%f0, %f1, %f2, %f3}};
"""
    steps = {"rewrite": fill(2048, 0x40404040), "wait": "wgmma.wait_group.sync.aligned 0;\n", "store": store}
    return kernel("mma", [".u64 mma_param_out"], 128, f"""
mov.u32 %r0, %tid.x;
mov.u32 %r1, smem;
{fill(2304, 0x38383838)}fence.proxy.async.shared::cta;
bar.sync 0;
mov.b64 %rd0, {0x4000_0040_0001_0000};
mov.b64 %rd1, {0x4000_0040_0001_0200};
setp.ne.u32 %p1, %r0, %r0;
wgmma.fence.sync.aligned;
wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {{%f0, %f1, %f2, %f3}}, %rd0, %rd1, %p1, 1, 1;
wgmma.commit_group.sync.aligned;
{"".join(steps[step] for step in order.split())}ret;
""")


@pytest.mark.parametrize("order, want", [("wait rewrite store", 32), ("rewrite wait store", 64)])
def test_wgmma_reads_its_operands_at_wait_group(order, want):
    out = np.zeros((128, 4), np.float32)
    run_kernel(wgmma_kernel(order), "mma", (1,), 128, 9216, dict(out=out))
    assert (out == want).all()


def test_reading_accumulators_before_wait_group_is_an_error():
    with pytest.raises(EmulationError, match="accumulator before wgmma.wait_group"):
        run_kernel(wgmma_kernel("store wait"), "mma", (1,), 128, 9216, dict(out=np.zeros((128, 4), np.float32)))


# ------------------------------------------------------------------------------ scalar instructions
def scalar_kernel() -> str:
    return kernel("ops", [".u64 ops_param_out", ".u64 ops_param_x"], 32, f"""
mov.u32 %r0, %tid.x;
mov.u32 %r1, smem;
mad.lo.u32 %r2, %r0, 37, 5;
rem.u32 %r3, %r0, 7;
add.u32 %r3, %r3, 1;
div.u32 %r10, %r2, %r3;
rem.u32 %r11, %r2, %r3;
min.u32 %r12, %r2, 600;
max.u32 %r13, %r2, 600;
sub.u32 %r14, %r3, %r2;
setp.le.s32 %p1, %r14, -100;
setp.gt.u32 %p2, %r2, 900;
or.pred %p3, %p1, %p2;
not.pred %p4, %p3;
and.pred %p5, %p4, %p1;
selp.u32 %r15, 1, 0, %p1;
selp.u32 %r16, 2, 0, %p2;
add.u32 %r15, %r15, %r16;
selp.u32 %r16, 4, 0, %p3;
add.u32 %r15, %r15, %r16;
selp.u32 %r16, 8, 0, %p4;
add.u32 %r15, %r15, %r16;
selp.u32 %r16, 16, 0, %p5;
add.u32 %r15, %r15, %r16;
{pointer('%rd0', 'ops_param_out')}mul.wide.u32 %rd1, %r0, 32;
add.s64 %rd0, %rd0, %rd1;
st.global.v4.b32 [%rd0], {{%r10, %r11, %r12, %r13}};
st.global.v2.b32 [%rd0+16], {{%r14, %r15}};
{pointer('%rd2', 'ops_param_x')}mul.wide.u32 %rd1, %r0, 4;
add.s64 %rd2, %rd2, %rd1;
ld.global.nc.f32 %f0, [%rd2];
mul.f32 %f0, %f0, 0f40000000;
shl.b32 %r4, %r0, 2;
add.u32 %r4, %r4, %r1;
st.shared.f32 [%r4], %f0;
bar.sync 0;
sub.u32 %r5, 31, %r0;
shl.b32 %r5, %r5, 2;
add.u32 %r5, %r5, %r1;
ld.shared.f32 %f1, [%r5];
st.global.f32 [%rd0+24], %f1;
ret;
""")


def test_scalar_instructions():
    out, x = np.zeros((32, 8), np.uint32), np.linspace(-3, 5, 32, dtype=np.float32)
    run_kernel(scalar_kernel(), "ops", (1,), 32, 128, dict(out=out, x=x))
    t = np.arange(32, dtype=np.int64)
    a, b = 37 * t + 5, t % 7 + 1
    p1, p2 = (b - a) <= -100, a > 900
    flags = p1 + 2 * p2 + 4 * (p1 | p2) + 8 * ~(p1 | p2) + 16 * (~(p1 | p2) & p1)
    want = np.stack([a // b, a % b, np.minimum(a, 600), np.maximum(a, 600), (b - a) % 2**32, flags], 1)
    np.testing.assert_array_equal(out[:, :6], want)
    np.testing.assert_array_equal(out[:, 6].view(np.float32), 2 * x[::-1])  # through st/ld.shared.f32


def shuffle_kernel() -> str:
    """out[t] = the value of lane (t % 32 + 5) % 32 of t's warp, value = 1000 * warp + 7 * lane; broadcast: warp * 64."""
    return kernel("shfl", [".u64 shfl_param_out"], 64, f"""
mov.u32 %r0, %tid.x;
and.b32 %r1, %r0, 31;
shr.u32 %r2, %r0, 5;
mul.lo.u32 %r3, %r2, 1000;
mad.lo.u32 %r3, %r1, 7, %r3;
add.u32 %r4, %r1, 5;
and.b32 %r4, %r4, 31;
shfl.sync.idx.b32 %r5, %r3, %r4, 31, -1;
shr.u32 %r6, %r0, 5;
shl.b32 %r6, %r6, 6;
{core.warp_broadcast("%r6", "%r6")}
ld.param.u64 %rd0, [shfl_param_out];
mul.wide.u32 %rd1, %r0, 8;
add.s64 %rd0, %rd0, %rd1;
st.global.u32 [%rd0], %r5;
st.global.u32 [%rd0+4], %r6;
ret;
""")


def test_shuffle_index_reads_the_named_lane_of_its_own_warp():
    out = np.zeros((64, 2), np.uint32)
    run_kernel(shuffle_kernel(), "shfl", (1,), 64, 0, dict(out=out))
    t = np.arange(64)
    np.testing.assert_array_equal(out[:, 0], 1000 * (t // 32) + 7 * ((t % 32 + 5) % 32))
    np.testing.assert_array_equal(out[:, 1], 64 * (t // 32))


# ------------------------------------------------------------------------------ the text is real PTX
@pytest.mark.parametrize("name, text", [("ring", ring()), ("ring", ring(early_release=True)),
                                        ("stm", stmatrix_kernel(1)), ("stm", stmatrix_kernel(2)),
                                        ("stm", stmatrix_kernel(4)), ("st", store_kernel()),
                                        ("named", named_kernel()), ("mma", wgmma_kernel("rewrite wait store")),
                                        ("ops", scalar_kernel()), ("shfl", shuffle_kernel())])
def test_kernels_assemble_for_sm90a(name, text):
    from ptx.compile import compile_ptx
    assembler = "ptxas" if name == "ring" else "nvjitlink"  # written by hand; the ring moves registers (setmaxnreg)
    assert name in compile_ptx(text, assembler=assembler).resources
