"""ptx.emulate with thread-block clusters of 2 CTAs (CPU): a TMA multicast ring whose stages both CTAs' consumers
release through remote mbarrier arrives, barrier.cluster, distributed shared memory, and the bugs a cluster
kernel can have: a missing remote arrive (deadlock across the cluster), a CTA that exits while its peer still
arrives on its barriers, a peer's barrier used before it is initialised. Every kernel also assembles for sm_90a
with .reqnctapercluster 2, 1, 1."""
import numpy as np
import pytest

from ptx.emulate import EmulationError, FakeTensorMap, run_kernel

HEADER = ".version 8.5\n.target sm_90a\n.address_size 64\n.extern .shared .align 1024 .b8 smem[];\n"
REGS = ".reg .b32 %r<40>;\n.reg .b64 %rd<8>;\n.reg .b16 %rs<4>;\n.reg .pred %p<8>;\n.reg .f32 %f<4>;\n"


def pointer(reg: str, param: str) -> str:
    return f"ld.param.u64 {reg}, [{param}];\ncvta.to.global.u64 {reg}, {reg};\n"


def kernel(name: str, params: list[str], threads: int, body: str, cluster: int = 2) -> str:
    declared = ",\n".join(f"    .param {p}" for p in params)
    return (f"{HEADER}.visible .entry {name}(\n{declared}\n)\n.maxntid {threads}, 1, 1\n"
            f".reqnctapercluster {cluster}, 1, 1\n{{\n{REGS}{body}}}\n")


# ------------------------------------------------------------------------------ a multicast ring
MULTICAST = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"


# Cluster k (CTAs 2k, 2k+1) takes tiles k, k + nclusters, ... through a 2-stage ring. Stage s: A at 1024 s
# (4 x 32 f32, this CTA's own: rows 8t + 4 rank of tensor A), B at 1024 s + 512 (4 x 32 f32, rows 4t.. of
# tensor B, shared by the cluster: CTA r multicasts rows 4t + 2r, 4t + 2r + 1 to offset 512 + 256 r of both
# CTAs). Barriers at 2048: full[2] (count 1, 1024 bytes: A + both halves of B), empty[2] (count 8: lane 0 of
# the 4 consumer warps of *both* CTAs, since either producer's multicast overwrites the stage in both).
# Threads 0-127 the producer warpgroup (thread 0 issues, the rest wait at the end), 128-255 the consumers:
# thread c sums element c of every A tile and of every B tile.
#   start: "cluster" (barrier.cluster after the inits) or "cta" (bar.sync 0 only: a peer may not be ready)
#   end: "cluster" (barrier.cluster before exit), "drain" (the producer waits for the last release of each
#        stage before exit) or "none" (the bug: a CTA may exit while its peer still arrives on its barriers)
#   remote: consumers also release the peer's empty barrier (False: the bug, the peer's producer starves)
#   empty: the empty barriers' count (4 with remote=False: each producer waits only for its own consumers)
def multicast_ring(start="cluster", end="cluster", remote=True, empty=8) -> str:
    cluster_sync = "barrier.cluster.arrive.aligned;\nbarrier.cluster.wait.aligned;\n"
    stage = """rem.u32 %r10, %r8, 2;
div.u32 %r11, %r8, 2;
and.b32 %r11, %r11, 1;
xor.b32 %r12, %r11, 1;
mad.lo.u32 %r13, %r10, 8, %r7;
add.u32 %r14, %r13, 16;
mad.lo.u32 %r15, %r10, 1024, %r4;
"""
    drain = f"""mov.u32 %r19, 0;
$d_loop:
setp.ge.u32 %p2, %r19, 2;
@%p2 bra $p_end;
{stage}$d_wait:
mbarrier.try_wait.parity.shared::cta.b64 %p3, [%r14], %r12;
@!%p3 bra $d_wait;
add.u32 %r8, %r8, 1;
add.u32 %r19, %r19, 1;
bra.uni $d_loop;
"""
    start_sync = ("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n"
                  if start == "cluster" else "bar.sync 0;\n")
    release = "mapa.shared::cluster.u32 %r22, %r14, %r6;\n" \
              "@%p4 mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%r22];\n" if remote else ""
    return kernel("mc", [".align 64 .b8 mc_param_tmap_a[128]", ".align 64 .b8 mc_param_tmap_b[128]",
                         ".u64 mc_param_out", ".u32 mc_param_tiles"], 256, f"""
mov.u32 %r0, %tid.x;
mov.u32 %r1, %cluster_ctarank;
mov.u32 %r2, %clusterid.x;
mov.u32 %r3, %nclusterid.x;
mov.u32 %r4, smem;
ld.param.u32 %r5, [mc_param_tiles];
xor.b32 %r6, %r1, 1;
add.u32 %r7, %r4, 2048;
setp.eq.u32 %p0, %r0, 0;
@!%p0 bra $init_done;
mbarrier.init.shared::cta.b64 [%r7], 1;
mbarrier.init.shared::cta.b64 [%r7+8], 1;
mbarrier.init.shared::cta.b64 [%r7+16], {empty};
mbarrier.init.shared::cta.b64 [%r7+24], {empty};
fence.mbarrier_init.release.cluster;
$init_done:
{start_sync}mov.u32 %r8, 0;
mov.u32 %r9, %r2;
setp.ge.u32 %p1, %r0, 128;
@%p1 bra $consumer;
@!%p0 bra $p_end;
mov.b64 %rd0, mc_param_tmap_a;
cvta.param.u64 %rd0, %rd0;
mov.b64 %rd1, mc_param_tmap_b;
cvta.param.u64 %rd1, %rd1;
mov.b16 %rs0, 3;
$p_loop:
setp.ge.u32 %p2, %r9, %r5;
@%p2 bra $p_done;
{stage}$p_wait:
mbarrier.try_wait.parity.shared::cta.b64 %p3, [%r14], %r12;
@!%p3 bra $p_wait;
mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r13], 1024;
shl.b32 %r16, %r9, 3;
shl.b32 %r17, %r1, 2;
add.u32 %r16, %r16, %r17;
cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r15], [%rd0, {{0, %r16}}], [%r13];
shl.b32 %r16, %r9, 2;
shl.b32 %r17, %r1, 1;
add.u32 %r16, %r16, %r17;
shl.b32 %r17, %r1, 8;
add.u32 %r18, %r15, 512;
add.u32 %r18, %r18, %r17;
{MULTICAST} [%r18], [%rd1, {{0, %r16}}], [%r13], %rs0;
add.u32 %r8, %r8, 1;
add.u32 %r9, %r9, %r3;
bra.uni $p_loop;
$p_done:
{drain if end == "drain" else ""}$p_end:
{cluster_sync if end == "cluster" else ""}exit;
$consumer:
sub.u32 %r20, %r0, 128;
and.b32 %r21, %r20, 31;
setp.eq.u32 %p4, %r21, 0;
mov.f32 %f0, 0f00000000;
mov.f32 %f1, 0f00000000;
$c_loop:
setp.ge.u32 %p2, %r9, %r5;
@%p2 bra $c_end;
{stage}mad.lo.u32 %r15, %r20, 4, %r15;
$c_wait:
mbarrier.try_wait.parity.shared::cta.b64 %p3, [%r13], %r11;
@!%p3 bra $c_wait;
ld.shared.f32 %f2, [%r15];
add.f32 %f0, %f0, %f2;
ld.shared.f32 %f2, [%r15+512];
add.f32 %f1, %f1, %f2;
@%p4 mbarrier.arrive.shared::cta.b64 _, [%r14];
{release}add.u32 %r8, %r8, 1;
add.u32 %r9, %r9, %r3;
bra.uni $c_loop;
$c_end:
{cluster_sync if end == "cluster" else ""}mov.u32 %r23, %ctaid.x;
mad.lo.u32 %r23, %r23, 128, %r20;
{pointer('%rd2', 'mc_param_out')}mul.wide.u32 %rd3, %r23, 8;
add.s64 %rd2, %rd2, %rd3;
st.global.v2.f32 [%rd2], {{%f0, %f1}};
ret;
""")


def run_multicast(ptx, tiles=13, ctas=4, **options):
    """Returns (got, want): per CTA and consumer thread, the sums of its A elements and of its B elements."""
    a = (np.arange(tiles * 8 * 32, dtype=np.float32) % 251).reshape(tiles * 8, 32)
    b = (np.arange(tiles * 4 * 32, dtype=np.float32) * 7 % 253).reshape(tiles * 4, 32)
    tmap_a = FakeTensorMap(a, np.float32, a.shape, 128, (4, 32), 0)
    tmap_b = FakeTensorMap(b, np.float32, b.shape, 128, (2, 32), 0)
    out = np.full((ctas, 128, 2), np.nan, np.float32)
    stats = run_kernel(ptx, "mc", (ctas,), 256, 2080, dict(tmap_a=tmap_a, tmap_b=tmap_b, out=out, tiles=tiles),
                       cluster=2, **options)
    want, clusters = np.zeros_like(out), ctas // 2
    for cta in range(ctas):
        rank, mine = cta % 2, range(cta // 2, tiles, clusters)
        want[cta, :, 0] = sum(a[8 * t + 4 * rank:8 * t + 4 * rank + 4].reshape(-1) for t in mine)
        want[cta, :, 1] = sum(b[4 * t:4 * t + 4].reshape(-1) for t in mine)
    return out, want, stats


SCHEDULES = [{}, dict(preempt=False)] + [dict(seed=s) for s in range(6)]


@pytest.mark.parametrize("end", ["cluster", "drain"])
@pytest.mark.parametrize("options", SCHEDULES)
def test_multicast_ring_released_by_both_ctas(end, options):
    """13 tiles over 2 clusters: each ring of 2 stages wraps 3 times; every B tile reaches both CTAs of its
    cluster through two multicasts (one half each), every A tile only its own CTA."""
    got, want, stats = run_multicast(multicast_ring(end=end), **options)
    np.testing.assert_array_equal(got, want)
    assert stats.ctas == 4 and stats.clusters == 2 and stats.switches > 20


def test_missing_remote_arrive_deadlocks_across_the_cluster():
    """Consumers that release only their own CTA's empty barrier give it 4 of its 8 arrivals: both producers
    starve once the ring has wrapped, and the report names every warpgroup of both CTAs."""
    text = multicast_ring(remote=False)
    with pytest.raises(EmulationError, match=r"deadlock in cluster 0 \(CTAs \(0, 0\), \(1, 0\)\)") as error:
        run_multicast(text)
    message = str(error.value)
    line = 1 + text.splitlines().index("mbarrier.try_wait.parity.shared::cta.b64 %p3, [%r14], %r12;")
    for rank in (0, 1):
        assert f"CTA rank {rank} warpgroup 0 at line {line}: mbarrier.try_wait" in message
        assert f"CTA rank {rank} warpgroup 1 at line" in message
    assert "4 of 8 arrivals" in message


@pytest.mark.parametrize("seed", [0, 1])
def test_waiting_only_for_local_consumers_lets_the_peer_overwrite_a_stage_in_use(seed):
    """Empty barriers of count 4 released by their own CTA's consumers only: a producer multicasts the next
    half of B into a stage the peer's consumers have not read yet (random schedules show it as wrong sums)."""
    got, want, _ = run_multicast(multicast_ring(remote=False, empty=4), seed=seed)
    assert not np.array_equal(got, want)


@pytest.mark.parametrize("options", [dict(preempt=False), dict(seed=0), dict(seed=3)])
def test_exit_without_draining_while_the_peer_arrives_is_an_error(options):
    """No end barrier, no drain: a CTA whose consumers finish first exits while the peer's consumers still
    have to release its empty barriers (remote arrives into a CTA that is gone). A race: the default
    round-robin interleaves the two CTAs' consumers arrive by arrive, so both release their last stage before
    either exits and the run is clean; without preemption, or with most seeds, one CTA finishes first."""
    with pytest.raises(EmulationError, match=r"remote access to an exited CTA: mbarrier.arrive.*shared::cluster"):
        run_multicast(multicast_ring(end="none"), **options)


def test_remote_access_before_the_peer_initialises_its_barriers():
    """Without barrier.cluster after the inits some schedules multicast into a peer that has not initialised
    its full barrier yet: found for some seeds, never with the cluster barrier."""
    failures = []
    for seed in range(12):
        try:
            got, want, _ = run_multicast(multicast_ring(start="cta"), seed=seed)
            np.testing.assert_array_equal(got, want)
        except EmulationError as error:
            assert "uninitialised barrier" in str(error)
            failures.append(seed)
    assert failures


# ------------------------------------------------------------------------------ barrier.cluster, DSMEM
# 96 threads per CTA; warp 2 exits at once (the cluster barrier counts only live threads). The others write
# 1000 (rank + 1) + 100 clusterid + tid into the *peer's* shared memory (mapa, st.shared::cluster), meet at
# barrier.cluster, read their own shared memory (what the peer wrote) and store it with the special registers.
def exchange(middle=True, wait_only=False) -> str:
    sync = "barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n"
    if wait_only:
        sync = "barrier.cluster.wait.acquire.aligned;\n"
    return kernel("xc", [".u64 xc_param_out"], 96, f"""
mov.u32 %r0, %tid.x;
setp.ge.u32 %p0, %r0, 64;
@%p0 exit;
barrier.cluster.arrive.relaxed.aligned;
barrier.cluster.wait.aligned;
mov.u32 %r1, %cluster_ctarank;
mov.u32 %r2, %cluster_nctarank;
mov.u32 %r3, %clusterid.x;
mov.u32 %r4, %ctaid.x;
mov.u32 %r5, smem;
shl.b32 %r6, %r0, 2;
add.u32 %r6, %r6, %r5;
xor.b32 %r7, %r1, 1;
mapa.shared::cluster.u32 %r8, %r6, %r7;
add.u32 %r9, %r1, 1;
mul.lo.u32 %r9, %r9, 1000;
mad.lo.u32 %r9, %r3, 100, %r9;
add.u32 %r9, %r9, %r0;
st.shared::cluster.u32 [%r8], %r9;
{sync if middle else ""}ld.shared.u32 %r10, [%r6];
ld.shared::cluster.u32 %r11, [%r8];
mad.lo.u32 %r12, %r4, 64, %r0;
{pointer('%rd0', 'xc_param_out')}mul.wide.u32 %rd1, %r12, 24;
add.s64 %rd0, %rd0, %rd1;
st.global.v4.u32 [%rd0], {{%r10, %r1, %r2, %r3}};
st.global.v2.u32 [%rd0+16], {{%r4, %r11}};
barrier.cluster.arrive.aligned;
barrier.cluster.wait.aligned;
ret;
""")


def run_exchange(text, ctas=4, **options):
    out = np.zeros((ctas, 64, 6), np.uint32)
    run_kernel(text, "xc", (ctas,), 96, 256, dict(out=out), cluster=2, **options)
    return out


@pytest.mark.parametrize("options", [{}, dict(preempt=False), dict(seed=0), dict(seed=1)])
def test_barrier_cluster_orders_distributed_shared_memory(options):
    out = run_exchange(exchange(), **options)
    cta = np.arange(4)[:, None]
    tid = np.arange(64)[None, :]
    rank, cluster = cta % 2, cta // 2
    peer_wrote = 1000 * (1 - rank + 1) + 100 * cluster + tid
    np.testing.assert_array_equal(out[..., 0], peer_wrote)  # own shared memory, written by the peer
    np.testing.assert_array_equal(out[..., 1], np.broadcast_to(rank, (4, 64)))  # %cluster_ctarank
    assert (out[..., 2] == 2).all()  # %cluster_nctarank
    np.testing.assert_array_equal(out[..., 3], np.broadcast_to(cluster, (4, 64)))  # %clusterid.x
    np.testing.assert_array_equal(out[..., 4], np.broadcast_to(cta, (4, 64)))  # %ctaid.x
    np.testing.assert_array_equal(out[..., 5], 1000 * (rank + 1) + 100 * cluster + tid)  # peer's, by ld::cluster


def test_without_the_cluster_barrier_a_cta_reads_before_its_peer_writes():
    """Round-robin: once the start barrier completes, CTA 0 writes, reads and stores before CTA 1 writes."""
    out = run_exchange(exchange(middle=False))
    assert (out[0::2, :, 0] == 0).all()


def test_barrier_cluster_wait_without_arrive_is_an_error():
    with pytest.raises(EmulationError, match="did not barrier.cluster.arrive first"):
        run_exchange(exchange(wait_only=True))


# ------------------------------------------------------------------------------ remote arrives, exit checks
# 32 threads per CTA. Thread 0 initialises a barrier of count ``count`` at shared 0, the cluster syncs, thread 0
# arrives once on the *peer's* barrier; with ``wait`` every thread then waits for the phase (parity 0) on its
# own barrier; a final barrier.cluster keeps both CTAs alive until the other is done.
def remote_arrive(count=1, wait=False) -> str:
    waiting = "$wait:\nmbarrier.try_wait.parity.shared::cta.b64 %p1, [%r5], 0;\n@!%p1 bra $wait;\n"
    return kernel("ra", [".u32 ra_param_unused"], 32, f"""
mov.u32 %r0, %tid.x;
mov.u32 %r1, %cluster_ctarank;
mov.u32 %r5, smem;
setp.eq.u32 %p0, %r0, 0;
@%p0 mbarrier.init.shared::cta.b64 [%r5], {count};
fence.mbarrier_init.release.cluster;
barrier.cluster.arrive.release.aligned;
barrier.cluster.wait.acquire.aligned;
xor.b32 %r7, %r1, 1;
mapa.shared::cluster.u32 %r8, %r5, %r7;
@%p0 mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%r8];
fence.acq_rel.cluster;
{waiting if wait else ""}barrier.cluster.arrive.aligned;
barrier.cluster.wait.aligned;
ret;
""")


def run_remote_arrive(text, **options):
    return run_kernel(text, "ra", (2,), 32, 64, dict(unused=0), cluster=2, **options)


@pytest.mark.parametrize("options", [{}, dict(preempt=False), dict(seed=5)])
def test_a_remote_arrive_completes_the_peers_phase(options):
    stats = run_remote_arrive(remote_arrive(count=1, wait=True), **options)
    assert stats.clusters == 1 and stats.ctas == 2


def test_a_barrier_left_mid_phase_in_either_cta_is_reported_at_the_end_of_the_cluster():
    with pytest.raises(EmulationError, match=r"mbarrier at shared 0 of CTA rank 0 \(0, 0\) left mid-phase: .*"
                                             r"1 of 2 arrivals"):
        run_remote_arrive(remote_arrive(count=2))


def test_a_deadlock_report_names_the_cluster_barrier():
    """Only CTA rank 1 waits for its barrier (which gets 1 of its 2 arrivals); rank 0 waits at barrier.cluster
    for rank 1's threads."""
    text = remote_arrive(count=2, wait=True).replace("$wait:\n", "setp.eq.u32 %p2, %r1, 0;\n@%p2 bra $waited;\n"
                                                     "$wait:\n").replace("@!%p1 bra $wait;\n",
                                                                          "@!%p1 bra $wait;\n$waited:\n")
    with pytest.raises(EmulationError, match=r"deadlock in cluster 0 \(CTAs \(0, 0\), \(1, 0\)\)") as error:
        run_remote_arrive(text)
    message = str(error.value)
    assert "CTA rank 0 warpgroup 0 at line" in message and "barrier.cluster.wait.aligned; (32 threads active) " \
        "waits for barrier.cluster (1 phases completed; CTA rank 0 32 arrived, 0 live not yet, CTA rank 1 0 " \
        "arrived, 32 live not yet)" in message
    assert "CTA rank 1 warpgroup 0 at line" in message and "mbarrier at shared 0 to complete the phase of " \
        "parity 0 (0 phases completed (current parity 0), 1 of 2 arrivals" in message


# ------------------------------------------------------------------------------ small contracts
def test_cluster_must_divide_the_grid():
    with pytest.raises(EmulationError, match="divide the grid"):
        run_exchange(exchange(), ctas=3)


def test_cluster_one_is_a_lone_cta():
    """cluster=1 (the default): %cluster_ctarank 0, %cluster_nctarank 1, %clusterid = %ctaid; barrier.cluster
    works within the CTA; mapa to rank 0 names the CTA itself."""
    out = np.zeros((3, 64, 6), np.uint32)
    text = exchange().replace("xor.b32 %r7, %r1, 1;", "mov.u32 %r7, 0;")
    run_kernel(text, "xc", (3,), 96, 256, dict(out=out))
    tid = np.arange(64)[None, :]
    np.testing.assert_array_equal(out[..., 0], 1000 + 100 * np.arange(3)[:, None] + tid)
    assert (out[..., 1] == 0).all() and (out[..., 2] == 1).all()
    np.testing.assert_array_equal(out[..., 3], np.broadcast_to(np.arange(3)[:, None], (3, 64)))


def test_mapa_to_a_rank_outside_the_cluster_is_an_error():
    text = exchange().replace("xor.b32 %r7, %r1, 1;", "mov.u32 %r7, 2;")
    with pytest.raises(EmulationError, match="mapa to CTA rank 2 of a cluster of 2"):
        run_exchange(text)


def test_a_mapa_address_in_a_cta_local_operand_is_an_error():
    text = exchange().replace("ld.shared.u32 %r10, [%r6];", "ld.shared.u32 %r10, [%r8];")
    with pytest.raises(EmulationError, match="a mapa result.*CTA-local"):
        run_exchange(text)
    text = multicast_ring().replace("@%p4 mbarrier.arrive.release.cluster.shared::cluster.b64",
                                    "@%p4 mbarrier.arrive.shared::cta.b64")
    with pytest.raises(EmulationError, match=r"\.shared::cta operand, which takes a CTA-local address"):
        run_multicast(text)


# ------------------------------------------------------------------------------ the text is real PTX
@pytest.mark.parametrize("name, text", [("mc", multicast_ring()), ("mc", multicast_ring(end="drain")),
                                        ("mc", multicast_ring(start="cta", end="none", remote=False, empty=4)),
                                        ("ra", remote_arrive(count=2, wait=True)),
                                        ("xc", exchange()), ("xc", exchange(wait_only=True))])
def test_cluster_kernels_assemble_for_sm90a(name, text):
    from ptx.compile import compile_ptx
    assert name in compile_ptx(text, assembler="nvjitlink").resources  # written by hand, no setmaxnreg
