"""The MoE topic lesson (lessons/moe_grouped.py): dispatch and combine on random routings, the two layouts' rules,
and the tile walks against the kernel's scheduler functions. NumPy only, no kernel runs (tests/test_grouped.py runs
the kernels); a fraction of a second."""
import numpy as np
import pytest

import lessons
from lessons import moe_grouped as mg

ALIGN = mg.ALIGNMENT


def routing(rng, tokens=None, experts=None, top_k=None, drop=0.0):
    """A random top-k routing with random skew; ``drop``: fraction of choices marked -1 (not on this rank)."""
    experts = int(rng.integers(1, 12)) if experts is None else experts
    top_k = int(rng.integers(1, experts + 1)) if top_k is None else top_k
    tokens = int(rng.integers(0, 300)) if tokens is None else tokens
    ids, weights = mg.random_routing(tokens, experts, top_k, rng, skew=float(rng.uniform(0, 3)))
    if drop:
        ids[rng.random(ids.shape) < drop] = -1
    return ids, weights, experts


def test_it_is_a_topic_not_a_stage():
    assert "moe_grouped" in lessons.TOPICS and "moe_grouped" not in lessons.STAGES.values()
    assert set(lessons.available_stages()) == set(lessons.STAGES)


@pytest.mark.parametrize("drop", [0.0, 0.3])
def test_dispatch_combine_round_trip(rng, drop):
    """permute -> an "expert" per group -> combine gives every token the weighted sum of its experts' outputs,
    through either layout; choices not routed here add nothing."""
    ids, weights, experts = routing(rng, drop=drop)
    x = rng.normal(size=(len(ids), 8))
    scale = rng.normal(size=experts)  # expert g multiplies by scale[g]
    want = np.einsum("tk,tn->tn", np.where(ids >= 0, weights * scale[np.maximum(ids, 0)], 0.0), x)
    routed = mg.dispatch(ids, experts)
    for layout in (routed.contiguous, routed.masked):
        a = mg.permute(x, layout)
        rows = layout.source >= 0
        assert (a[rows] == x[layout.source[rows]]).all() and not a[~rows].any()
        group = np.where(rows, np.arange(rows.size).reshape(rows.shape) // layout.m_max, -1) \
            if isinstance(layout, mg.MaskedLayout) else layout.m_indices
        out = a * np.where(group >= 0, scale[np.maximum(group, 0)], np.nan)[..., None]  # padding rows: NaN
        np.testing.assert_allclose(mg.combine(out, layout, weights), want, atol=1e-12)
        # the inverse permutation: every routed (token, choice) has its own row, holding that token, in its group
        pos = layout.position[ids >= 0]
        assert len(set(pos.tolist())) == pos.size
        assert (layout.source.ravel()[pos] == np.nonzero(ids >= 0)[0]).all()
        assert (layout.position[ids < 0] == -1).all()


def test_contiguous_layout_alignment_and_padding(rng):
    ids, _, experts = routing(rng, drop=0.1)
    layout = mg.dispatch_contiguous(ids, experts)
    counts = mg.tokens_per_expert(ids, experts)
    assert layout.rows % ALIGN == 0 and layout.rows == sum(-(-c // ALIGN) * ALIGN for c in counts)
    assert layout.m_indices.dtype == np.int32
    for g, (start, count) in enumerate(zip(layout.starts, counts)):
        assert start % ALIGN == 0
        if count:  # the group's rows, then -1 up to the alignment; an empty group takes no rows
            block = layout.m_indices[start:start + -(-count // ALIGN) * ALIGN]
            assert (block[:count] == g).all() and (block[count:] == -1).all()
            assert (layout.source[start:start + count] >= 0).all()
            assert (layout.source[start + count:start + len(block)] == -1).all()
        assert (layout.m_indices == g).sum() == count
    # tokens keep their order inside a group (a stable permutation)
    for g in range(experts):
        tokens = layout.source[layout.m_indices == g]
        assert (np.diff(tokens) >= 0).all()
    grouped = pytest.importorskip("gemm.grouped")
    if layout.rows:
        grouped.check_m_indices(layout.m_indices, experts)  # the kernel's own rules hold


def test_counts_routing_and_empty_groups():
    layout = mg.dispatch([150, 0, 40, 90], m_max=192)
    assert layout.contiguous.rows == 512 and layout.contiguous.starts.tolist() == [0, 256, 256, 384]
    assert layout.contiguous.m_indices[::128].tolist() == [0, 0, 2, 3]
    assert layout.masked.masked_m.tolist() == [150, 0, 40, 90] and layout.masked.source.shape == (4, 192)
    assert layout.masked.expected_m == 94  # the mean of the experts that got tokens
    with pytest.raises(ValueError, match="tokens per expert must be >= 0"):
        mg.dispatch([3, -1])


def test_masked_layout_slots_and_masked_m(rng):
    ids, _, experts = routing(rng, drop=0.1)
    counts = mg.tokens_per_expert(ids, experts)
    m_max = int(counts.max(initial=0)) + int(rng.integers(0, 5)) or 1
    layout = mg.dispatch_masked(ids, experts, m_max=m_max)
    assert layout.masked_m.dtype == np.int32 and layout.masked_m.tolist() == counts.tolist()
    assert layout.source.shape == (experts, m_max) and layout.m_max == m_max
    for g, count in enumerate(counts):  # slots 0..count-1 filled, the rest empty
        assert (layout.source[g, :count] >= 0).all() and (layout.source[g, count:] == -1).all()
    assert 1 <= layout.expected_m <= max(m_max, 1)


def test_masked_overflow_is_a_clear_error(rng):
    ids, _, experts = routing(rng, tokens=int(rng.integers(20, 200)), experts=4, top_k=2)
    largest = int(mg.tokens_per_expert(ids, experts).max())
    mg.dispatch_masked(ids, experts, m_max=largest)  # exactly full: fine
    with pytest.raises(ValueError, match=rf"received {largest} tokens but the masked layout has M_max = "
                                         rf"{largest - 1} slots per expert.*raise m_max"):
        mg.dispatch_masked(ids, experts, m_max=largest - 1)
    with pytest.raises(ValueError, match="m_max must be positive"):
        mg.dispatch_masked(ids, experts, m_max=0)


def test_combine_checks_the_weights_shape(rng):
    ids, weights, experts = routing(rng, tokens=10, experts=4, top_k=2)
    layout = mg.dispatch_contiguous(ids, experts)
    with pytest.raises(ValueError, match=r"topk_weights must have shape \(10, 2\)"):
        mg.combine(np.zeros((layout.rows, 3)), layout, weights[:, :1])


# ------------------------------------------------------------------------------------------ the tile walks
@pytest.mark.parametrize("block_m, persistent", [(64, True), (128, True), (64, False)])
def test_contiguous_walk_covers_every_needed_tile_once(rng, block_m, persistent):
    """Exactly the tiles whose first row has a group, each once; padding blocks (first index -1) never computed;
    with ``skipped=True`` the CTAs' steps are the dense schedule, every tile once."""
    ids, _, experts = routing(rng, drop=0.1)
    m_indices = mg.dispatch_contiguous(ids, experts).m_indices
    n, block_n = int(rng.integers(1, 600)), int(rng.choice([64, 128, 192]))
    grid = int(rng.integers(1, 20)) if persistent else None
    raster = int(rng.integers(0, 4)) if persistent else 0
    walks = mg.contiguous_tiles(m_indices, block_m, n, block_n, grid=grid, raster_group=raster, groups=experts)
    tiles = [t for walk in walks for t in walk]
    n_blocks = -(-n // block_n)
    want = {(int(m_indices[mb * block_m]), mb, nb) for mb in range(len(m_indices) // block_m)
            for nb in range(n_blocks) if m_indices[mb * block_m] >= 0}
    assert len(tiles) == len(want) and set(tiles) == want
    every = mg.contiguous_tiles(m_indices, block_m, n, block_n, grid=grid, raster_group=raster, skipped=True)
    from gemm.kernel.tile_scheduler import schedule
    m_blocks = len(m_indices) // block_m
    grid = grid or m_blocks * n_blocks
    assert [[(mb, nb) for _, mb, nb in walk] for walk in every] == \
        [schedule(cta, grid, m_blocks, n_blocks, raster) for cta in range(grid)]
    assert all(g == -1 for walk in every for g, mb, _ in walk if m_indices[mb * block_m] < 0)


def test_contiguous_walk_skips_indices_outside_the_groups():
    m_indices = np.array([0] * 128 + [5] * 128, np.int32)  # 5 is past G = 2: the kernel skips it like -1
    walks = mg.contiguous_tiles(m_indices, 128, 128, 128, groups=2)
    assert [t for w in walks for t in w] == [(0, 0, 0)]
    with pytest.raises(ValueError, match="block_m must divide"):
        mg.contiguous_tiles(m_indices, 256, 128, 128)


@pytest.mark.parametrize("raster_group", [0, 2])
def test_masked_walk_covers_every_needed_tile_once_and_skips_empty_groups(rng, raster_group):
    experts = int(rng.integers(1, 10))
    m_max, block_m = int(rng.integers(1, 300)), int(rng.choice([64, 128, 256]))
    masked_m = rng.integers(0, m_max + 1, experts)
    masked_m[rng.random(experts) < 0.3] = 0
    n_blocks, grid = int(rng.integers(1, 6)), int(rng.integers(1, 20))
    walks = mg.masked_tiles(masked_m, m_max, block_m, n_blocks, grid, raster_group)
    assert len(walks) == grid
    tiles = [t for walk in walks for t in walk]
    want = {(g, mb, nb) for g, count in enumerate(masked_m) for mb in range(-(-int(count) // block_m))
            for nb in range(n_blocks)}
    assert len(tiles) == len(want) and set(tiles) == want
    assert not {g for g, _, _ in tiles} & set(np.flatnonzero(masked_m == 0).tolist())
    # the virtual-tile walk: CTA c's k-th tile is the (c + k * grid)-th tile of the groups' tiles in order
    from gemm.kernel.tile_scheduler import tile_coords
    flat = []
    for g, count in enumerate(masked_m):
        blocks = -(-int(count) // block_m)
        raster = raster_group if raster_group < n_blocks else 0
        flat += [(g, *tile_coords(t, blocks, n_blocks, raster)) for t in range(blocks * n_blocks)]
    assert walks == [flat[cta::grid] for cta in range(grid)]


def test_walk_table_lists_each_cta():
    table = mg.walk_table([[(0, 0, 0), (-1, 1, 0)], [(1, 2, 0)]])
    assert table.splitlines()[1].split() == ["0", "g0", "m0", "n0", "skip", "m1", "n0"]
    assert table.splitlines()[2].split() == ["1", "g1", "m2", "n0"]
