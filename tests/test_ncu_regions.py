"""python -m gemm profile-regions on the committed ncu listings (CPU): the per-phase shares docs/benchmarks.md quotes
for the tile boundary study come out of them, and a file that is not an ncu source table is named as such."""
from pathlib import Path

import pytest

from gemm.testing.ncu_regions import read_listing, regions, table

RESULTS = Path(__file__).parent.parent / "results"


def shares(name: str) -> dict[int, float]:
    found = regions(read_listing(RESULTS / name))
    total = sum(region.samples for region in found)
    return {region.executed: round(100 * region.samples / total, 1) for region in found}


def test_the_tile_boundary_shares_quoted_in_the_docs():
    """4096x24576x1536, 3072 tiles of 12 K blocks, 8 math warps: the K block runs 294,912 times a warp-instruction,
    the tile's start and epilogue 24,576 (3072 x 8); their shares are the docs' 81%, 3.7% and 6.3%."""
    ours = regions(read_listing(RESULTS / "ncu_src_ours_4096x24576x1536.csv.gz"))
    total = sum(region.samples for region in ours)
    k_loop = sum(r.samples for r in ours if r.executed == 294912) + sum(r.samples for r in ours if r.executed == 39780)
    per_tile = [r for r in ours if r.executed == 24576]
    assert round(100 * k_loop / total) == 81
    assert [round(100 * r.samples / total, 1) for r in per_tile][:3] == [3.7, 0.7, 5.6]
    assert "CS2R" in per_tile[0].opcodes and "STSM.16.M88.4" in per_tile[2].opcodes


def test_the_overlap_listing_quoted_in_the_docs():
    """16384x7168x2048: the K loop's waits for stages (their try_wait path) 1.1% of the samples in production, 1.2%
    with the next tile's first wave issued before the epilogue, whose own blocking wait ran in 2,422 of its 27,616
    warp-executions (the stage had mostly landed); the epilogue 4.8% (two regions) against 4.6%."""
    production = shares("ncu_src_prod_16384x7168x2048.csv.gz")
    overlap = shares("ncu_src_overlap_16384x7168x2048.csv.gz")
    assert production[68280] == 1.1 and overlap[13463] == 1.2
    assert 2422 in overlap and 27616 in overlap
    epilogue = [r for r in regions(read_listing(RESULTS / "ncu_src_overlap_16384x7168x2048.csv.gz"))
                if "STSM.16.M88.4" in r.opcodes]
    assert len(epilogue) == 1 and epilogue[0].executed == 28672


def test_table_and_a_wrong_file(tmp_path):
    text = table(RESULTS / "ncu_src_dg2507_4096x24576x1536.csv.gz")
    assert "FFMA 384" in text and "samples" in text  # DeepGEMM's K loop: three K blocks unrolled
    wrong = tmp_path / "not_ncu.csv"
    wrong.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="no ncu source table"):
        read_listing(wrong)
    with pytest.raises(ValueError, match="cannot read it"):
        read_listing(tmp_path / "missing.csv")
