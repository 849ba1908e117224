"""Prebuild (``python -m gemm prebuild``, ``gemm.prebuild``) and the disk cache it fills: every config the heuristics
can pick is built, the cache is relocatable (content keys), and many processes on one cold cache agree (CPU:
byte-identical cubins; GPU: correct GEMMs)."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gemm
import ptx.compile as compile_module
from gemm.__main__ import main, parse_nk_shapes
from gemm.heuristics import H100, choose_config, device_facts
from gemm.kernel.launch import cubin
from gemm.prebuild import configs_for, kernels_for, model_shapes, prebuild, sample_ms, target_device
from ptx.device import has_gpu

REPO = Path(__file__).resolve().parents[1]
SMALL = [(1024, 256)]  # few, quick kernels: M up to 512 picks 3 configs (64 x 16, 64 x 32, 64 x 64)
SMALL_MAX_M = 512


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache directory in use, and no cubins held in memory."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("FP8LADDER_CACHE_DIR", str(folder))
    compile_module.clear_memory_cache()
    yield folder
    compile_module.clear_memory_cache()


def assemblers_raise(monkeypatch):
    """From now on any assembly fails: whatever still works came from the cache."""
    def refuse(*args, **kwargs):
        raise AssertionError("the assembler ran: expected a cache hit")
    monkeypatch.setattr(compile_module, "_run_ptxas", refuse)
    monkeypatch.setattr(compile_module, "_run_nvjitlink", refuse)


def check_cache_files(folder: Path) -> int:
    """No temporary leftovers; every report names the sha256 of its image. Returns how many entries there are."""
    names = sorted(p.name for p in folder.iterdir())
    assert not [n for n in names if n.endswith(".tmp")], names
    reports = sorted(folder.glob("*.json"))
    assert sorted(p.stem for p in folder.glob("*.cubin")) == [p.stem for p in reports]
    for report_path in reports:
        report = json.loads(report_path.read_text())
        image = report_path.with_suffix(".cubin").read_bytes()
        assert image[:4] == b"\x7fELF"
        assert hashlib.sha256(image).hexdigest() == report["image_sha256"]
    return len(reports)


# -- which kernels ----------------------------------------------------------------------------------------
def exhaustive_configs(n, k, max_m, device):
    return set(choose_config(m, n, k, device) for m in range(1, max_m + 1))


@pytest.mark.parametrize("n, k, max_m, sms", [
    (2112, 7168, 1500, 132),
    (200, 256, 700, 132),     # N % 8 != 0: the staged epilogue
    (7168, 2048, 600, 78),   # a server that calls set_num_sms(78)
])
def test_sampled_m_reach_every_config(n, k, max_m, sms):
    device = target_device(sms)
    sampled = configs_for(n, k, max_m, device)
    assert len(sampled) == len(set(sampled))
    assert set(sampled) == exhaustive_configs(n, k, max_m, device)


def test_sample_ms_end_at_max_m():
    assert sample_ms(1) == [1]
    # 8, 16, 32: swap AB's token tiles; 16, 32: the unswapped decode rules' last M (split K, wide tiles)
    assert sample_ms(100) == [8, 16, 32, 64, 100]
    assert sample_ms(256) == [8, 16, 32, 64, 128, 192, 256]
    assert sample_ms(12) == [8, 12]
    with pytest.raises(ValueError, match="max_m"):
        sample_ms(0)


def test_target_device_without_gpu_is_an_h100():
    if has_gpu():
        assert target_device() == device_facts()
    else:
        assert target_device() == H100
    assert target_device(100).sm_count == 100
    assert target_device(100).shared_limit == target_device().shared_limit
    with pytest.raises(ValueError, match="positive SM count"):
        target_device(0)


def test_kernels_are_deduplicated_and_follow_the_ffma_variable(monkeypatch):
    kernels = kernels_for([(2112, 7168), (2112, 7168), (7168, 2048)], max_m=4096, device=H100)
    assert len(kernels) == len(set(kernels))
    assert {(kernel.n, kernel.k) for kernel in kernels} == {(2112, 7168), (7168, 2048)}
    assert all(kernel.config.post_passes == () for kernel in kernels)
    monkeypatch.setenv("FP8LADDER_FFMA_INTERLEAVE", "deepgemm")
    passed = kernels_for([(2112, 7168)], max_m=4096, device=H100)
    assert passed and all(kernel.config.post_passes == ("ffma_deepgemm",) for kernel in passed)


def test_deepseek_model_preset():
    shapes = model_shapes("deepseek-v3")
    assert shapes == sorted(set(shapes)) and (2112, 7168) in shapes and (7168, 16384) in shapes
    with pytest.raises(ValueError, match="deepseek-v3"):
        model_shapes("llama")


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="K a positive multiple of 128"):
        kernels_for([(2112, 100)], device=H100)
    with pytest.raises(ValueError, match="shapes"):
        prebuild([])


# -- building, and the relocatable cache -------------------------------------------------------------------
def test_prebuild_compiles_once_then_hits(cache):
    first = prebuild(SMALL, max_m=SMALL_MAX_M)
    assert first.compiled == len(first.kernels) >= 2 and first.cached == 0
    assert first.cache_dir == cache
    assert check_cache_files(cache) == len(first.kernels)
    again = prebuild(SMALL, max_m=SMALL_MAX_M)
    assert (again.compiled, again.cached) == (0, len(first.kernels))
    assert "already cached" in again.summary() and str(cache) in again.summary()


def test_moved_cache_hits_without_an_assembler(cache, tmp_path, monkeypatch):
    """Compile into A, move A to B (and ptxas to another path): every kernel is a hit from B."""
    built = prebuild(SMALL, max_m=SMALL_MAX_M, cache_dir=cache)
    images = {kernel: cubin(kernel.config, kernel.n, kernel.k).image for kernel in built.kernels}
    moved = tmp_path / "elsewhere" / "kernels"
    shutil.move(str(cache), str(moved))
    for path in moved.iterdir():
        assert str(tmp_path).encode() not in path.read_bytes(), f"{path.name} holds an absolute path"

    # the assembler's location is not part of the key (its version is)
    other_ptxas = tmp_path / "bin" / "ptxas"
    other_ptxas.parent.mkdir()
    other_ptxas.symlink_to(compile_module.ptxas_path())
    compile_module._ptxas_version.cache_clear()
    monkeypatch.setattr(compile_module, "ptxas_path", lambda: str(other_ptxas))
    try:
        assemblers_raise(monkeypatch)
        monkeypatch.setenv("FP8LADDER_CACHE_DIR", str(moved))
        compile_module.clear_memory_cache()
        for kernel, image in images.items():
            again = cubin(kernel.config, kernel.n, kernel.k)
            assert again.from_cache and again.image == image
        report = prebuild(SMALL, max_m=SMALL_MAX_M)
        assert (report.compiled, report.cached, report.cache_dir) == (0, len(images), moved)
    finally:
        compile_module._ptxas_version.cache_clear()


NOOP_PTX = ".version 8.5\n.target sm_90a\n.address_size 64\n.visible .entry noop()\n{\n    ret;\n}\n"


def test_ptx_cache_survives_a_move(cache, tmp_path, monkeypatch):
    """The toolchain alone: a compile_ptx result read back from a moved directory."""
    source = NOOP_PTX + f"// relocation {os.urandom(8).hex()}\n"  # a key nobody compiled before
    first = compile_module.compile_ptx(source, assembler="nvjitlink")  # written by hand: the assembler is named
    moved = tmp_path / "moved"
    cache.rename(moved)
    assemblers_raise(monkeypatch)
    monkeypatch.setenv("FP8LADDER_CACHE_DIR", str(moved))
    compile_module.clear_memory_cache()
    second = compile_module.compile_ptx(source, assembler="nvjitlink")
    assert second.from_cache and second.image == first.image and second.resources == first.resources


def test_cache_dir_argument_leaves_the_environment_alone(cache, tmp_path):
    target = tmp_path / "shipped"
    report = prebuild(SMALL, max_m=128, cache_dir=target)
    assert report.cache_dir == target and check_cache_files(target) == len(report.kernels)
    assert os.environ["FP8LADDER_CACHE_DIR"] == str(cache)
    assert not cache.exists()


# -- the command line ----------------------------------------------------------------------------------------
def test_parse_nk_shapes():
    assert parse_nk_shapes("2112,7168; 24576x1536;") == [(2112, 7168), (24576, 1536)]
    for bad in ("2112", "1,2,3", "a,b", "0,128"):
        with pytest.raises(Exception, match="expected N,K"):
            parse_nk_shapes(bad)


def test_cli_with_workers_then_cached(tmp_path, capsys):
    """--jobs 2 builds in spawned worker processes; a second run finds everything cached."""
    folder = tmp_path / "cli-cache"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("FP8LADDER_CACHE_DIR", None)
    args = ["--shapes", "1024,256", "--max-m", str(SMALL_MAX_M), "--sm-count", "132", "--cache-dir", str(folder)]
    done = subprocess.run([sys.executable, "-m", "gemm", "prebuild", *args, "--jobs", "2"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    kernels = len(kernels_for(SMALL, SMALL_MAX_M, target_device(132)))
    assert f"{kernels} kernels for 1 (N, K) shapes" in done.stdout
    assert f"compiled {kernels}, already cached 0" in done.stdout and str(folder) in done.stdout
    assert check_cache_files(folder) == kernels

    compile_module.clear_memory_cache()
    assert main(["prebuild", *args, "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert f"compiled 0, already cached {kernels}" in printed and "N=1024" not in printed


def test_cli_errors_say_what_to_pass(capsys):
    assert main(["prebuild"]) == 2
    assert "--shapes" in capsys.readouterr().err
    assert main(["prebuild", "--shapes", "1024,256", "--max-m", "0"]) == 2
    assert "max_m" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["prebuild", "--shapes", "256"])
    assert "expected N,K" in capsys.readouterr().err


# -- many processes, one cold cache ------------------------------------------------------------------------
PROCESSES = 8

# Waits until all PROCESSES have started (ready files), so that they really compile at the same time.
BARRIER = """
import os, sys, time
ready, count = sys.argv[1], int(sys.argv[2])
open(os.path.join(ready, str(os.getpid())), "w").close()
deadline = time.time() + 300
while len(os.listdir(ready)) < count and time.time() < deadline:
    time.sleep(0.01)
"""

CPU_WORKER = BARRIER + """
import hashlib, json
import ptx.compile as compile_module
from gemm.kernel.launch import cubin
from gemm.prebuild import kernels_for, target_device
images = {kernel.describe(): hashlib.sha256(cubin(kernel.config, kernel.n, kernel.k).image).hexdigest()
          for kernel in kernels_for(json.loads(sys.argv[3]), int(sys.argv[4]), target_device(132))}
print(json.dumps({"images": images, "compiled": compile_module.compile_count}))
"""


def run_together(script: str, cache_dir: Path, ready: Path, *args: str) -> list[str]:
    ready.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "FP8LADDER_CACHE_DIR": str(cache_dir)}
    workers = [subprocess.Popen([sys.executable, "-c", script, str(ready), str(PROCESSES), *args], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(PROCESSES)]
    outputs = []
    for worker in workers:
        out, err = worker.communicate(timeout=600)
        assert worker.returncode == 0, err
        outputs.append(out.strip().splitlines()[-1])
    return outputs


def test_eight_processes_on_one_cold_cache_agree(tmp_path):
    """8 processes compile the same kernels into one empty directory at once: all get byte-identical cubins and
    the directory ends with one valid entry per kernel (atomic writes: no torn or temporary files)."""
    cache_dir = tmp_path / "cold"
    shapes = [[1024, 256], [200, 256]]
    results = [json.loads(line) for line in run_together(CPU_WORKER, cache_dir, tmp_path / "ready",
                                                         json.dumps(shapes), str(SMALL_MAX_M))]
    images = results[0]["images"]
    from gemm.prebuild import kernels_for, target_device
    assert len(images) == len(kernels_for([tuple(s) for s in shapes], SMALL_MAX_M, target_device(132))) >= 4
    assert all(result["images"] == images for result in results)
    assert sum(result["compiled"] for result in results) >= len(images)  # each kernel was assembled somewhere
    assert check_cache_files(cache_dir) == len(images)


GPU_WORKER = BARRIER + """
import numpy as np, torch, gemm
from gemm.fp8 import bf16_to_float, calc_diff
from gemm.testing.problems import random_problem, reference_gemm
worst = 0.0
for m, n, k in [(300, 2112, 512), (64, 256, 384)]:
    a, sa, b, sb = random_problem(m, n, k, np.random.default_rng(os.getpid()))
    cuda = lambda x: torch.from_numpy(np.ascontiguousarray(x)).cuda()
    sa_device = gemm.get_mn_major_tma_aligned_tensor(cuda(sa))
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm.fp8_gemm_nt((cuda(a.view(np.uint8)), sa_device), (cuda(b.view(np.uint8)), cuda(sb)), out)
    torch.cuda.synchronize()
    got = out.float().cpu().numpy()
    assert not np.isnan(got).any(), (m, n, k)
    worst = max(worst, calc_diff(got, reference_gemm(a, sa, b, sb)))
print(worst)
"""


@pytest.mark.gpu
def test_eight_processes_on_one_cold_cache_compute_correctly(tmp_path):
    """8 processes call fp8_gemm_nt at once on an empty cache: every result matches the float64 reference."""
    pytest.importorskip("torch")
    cache_dir = tmp_path / "cold"
    diffs = [float(line) for line in run_together(GPU_WORKER, cache_dir, tmp_path / "ready")]
    print("calc_diff per process:", diffs)
    assert all(diff < 1e-3 for diff in diffs), diffs
    assert check_cache_files(cache_dir) >= 2


def test_prebuild_is_exported():
    assert gemm.prebuild is prebuild
    assert "python -m gemm prebuild" in sys.modules["gemm.prebuild"].__doc__
