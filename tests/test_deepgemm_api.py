"""DeepGEMM's names (gemm.deepgemm_api, docs/deepgemm.md) and the FP8LADDER_* switches that mirror DG_* (CPU)."""
import re
from pathlib import Path

import numpy as np
import pytest

import gemm

DOC = Path(__file__).resolve().parent.parent / "docs" / "deepgemm.md"


def test_every_name_the_doc_maps_exists():
    mapped = set(re.findall(r"`gemm\.(\w+)`", DOC.read_text()))
    assert mapped and all(hasattr(gemm, name) for name in mapped), sorted(n for n in mapped if not hasattr(gemm, n))


@pytest.mark.parametrize("x, size, want", [(1, 4, 4), (4, 4, 4), (5, 4, 8), (130, 4, 132), (7, 2, 8), (17, 1, 32),
                                           (0, 4, 0)])
def test_get_tma_aligned_size(x, size, want):
    assert gemm.get_tma_aligned_size(x, size) == want
    assert (gemm.get_tma_aligned_size(x, size) * size) % 16 == 0


def test_get_tma_aligned_size_names_a_bad_element_size():
    with pytest.raises(ValueError, match="element_size"):
        gemm.get_tma_aligned_size(10, 3)


def test_col_major_helper_is_the_mn_major_one(rng):
    sa = rng.random((5, 3), dtype=np.float32)
    got = gemm.get_col_major_tma_aligned_tensor(sa)
    np.testing.assert_array_equal(got, sa)
    assert got.strides == (4, 8 * 4)


def test_dump_dir_and_ptxas_verbose(monkeypatch, tmp_path, capsys):
    from gemm.kernel import KernelConfig
    from gemm.kernel.launch import cubin
    monkeypatch.setenv("FP8LADDER_DUMP_DIR", str(tmp_path))
    monkeypatch.setenv("FP8LADDER_PTXAS_VERBOSE", "1")
    cubin(KernelConfig(block_m=64, block_n=64, stages=3), 256, 512)
    names = sorted(p.suffix for p in tmp_path.iterdir())
    assert names == [".ptx", ".sass"]
    sass = next(tmp_path.glob("*.sass")).read_text()
    assert "QGMMA" in sass and "UTMALDG" in sass
    assert "registers" in capsys.readouterr().out
