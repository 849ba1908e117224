"""The benchmark harness: the ladder and inspect commands, result files, docs rendering, the kernel timer."""
import importlib.util
import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import lessons
from gemm.testing import bench_dense, peers, problems
from gemm.fp8 import BF16
from gemm.testing.problems import random_problem, reference_gemm
from gemm.testing.records import Column, device_info, format_table, read_result, write_result
from gemm.testing.timer import choose_pairs
from lessons import render_docs
from lessons.__main__ import main as lessons_command

ROOT = Path(__file__).resolve().parent.parent


def _run(args, timeout=120, **env):
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=timeout)


# ------------------------------------------------------------------------------------- ladder, no GPU

def test_ladder_cli_without_gpu_runs_and_says_timings_need_a_gpu():
    result = _run(["-m", "lessons", "ladder", "--sim-shape", "16,24,128"], NUMBA_ENABLE_CUDASIM="1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Timings need a GPU" in result.stdout
    for number in set(lessons.available_stages()) & set(lessons.GEMM_STAGES):
        assert f"{number:02d} " in result.stdout, f"stage {number} missing from the table:\n{result.stdout}"


def _fake_stage(kind, gemm, name):
    module = types.ModuleType(f"lessons.{name}")
    module.IDEA, module.KIND, module.gemm = f"fake {name}", kind, gemm
    return module


def _host_gemm(a, sa, b, sb, d, stream=None):
    """What a correct stage computes, done on the host through the simulator's arrays."""
    ref = reference_gemm(a.copy_to_host(), sa.copy_to_host(), b.copy_to_host(), sb.copy_to_host())
    d.copy_to_device(ref.astype(np.float32).astype(BF16).view(np.uint16))


def _forgets_last_row(a, sa, b, sb, d, stream=None):
    bits = np.zeros(d.shape, np.uint16)
    bits[-1] = 0x7FC0
    d.copy_to_device(bits)


def _raises(a, sa, b, sb, d, stream=None):
    raise ValueError("this stage is broken")


def test_ladder_without_gpu_reports_each_stage_and_goes_on(monkeypatch, capsys):
    from lessons import ladder
    fakes = {91: ("91_fake_ok", _host_gemm), 92: ("92_fake_broken", _raises), 93: ("93_fake_lazy", _forgets_last_row)}
    for number, (name, gemm) in fakes.items():
        monkeypatch.setitem(lessons.STAGES, number, name)
        monkeypatch.setitem(sys.modules, f"lessons.{name}", _fake_stage("numba", gemm, name))
    monkeypatch.setitem(lessons.STAGES, 94, "94_fake_missing")  # no module: an import failure
    assert ladder.run_without_gpu([91, 92, 93, 94], sim_shape=(33, 40, 256), ptx_shape=(64, 64, 128)) == 0
    out = capsys.readouterr().out
    lines = {}
    for line in out.splitlines():  # the table row comes first, error details after the table
        if line[:3] in ("91 ", "92 ", "93 ", "94 "):
            lines.setdefault(line[:2], line)
    assert "ok (simulator" in lines["91"], out
    assert "failed" in lines["92"] and "this stage is broken" in out
    assert "WRONG" in lines["93"]
    assert "failed (import)" in lines["94"]


# ----------------------------------------------------------------------------------------------- inspect

def _ptx_stages():
    found = []
    for number in lessons.available_stages():
        try:
            module = lessons.stage(number)
        except Exception:
            continue
        if hasattr(module, "generate") and number in lessons.GEMM_STAGES:
            found.append(number)
    return found


def test_inspect_cli_on_a_ptx_stage_without_gpu():
    if importlib.util.find_spec("ptx.sass") is None:
        pytest.skip("ptx/sass.py (the toolchain helper's SASS listing) is not in this checkout yet")
    stages = _ptx_stages()
    if not stages:
        pytest.skip("no PTX GEMM stage (lessons/04_* and later) in this checkout yet")
    result = _run(["-m", "lessons", "inspect", str(stages[-1])], NUMBA_ENABLE_CUDASIM="1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "registers" in result.stdout and "SASS:" in result.stdout and "FFMA" in result.stdout


def test_inspect_counts_opcodes_of_a_small_ptx_kernel(monkeypatch, capsys):
    if importlib.util.find_spec("ptx.sass") is None:
        pytest.skip("ptx/sass.py (the toolchain helper's SASS listing) is not in this checkout yet")
    from lessons.inspect_stage import inspect

    from ptx.builder import PtxModule

    def generate(m, n, k):  # one FMA per thread: enough to see FFMA and STG in the listing
        return PtxModule(f"""
.version 8.5
.target sm_90a
.address_size 64
.visible .entry fake_fma(.param .u64 out)
{{
  .reg .f32 %f<4>; .reg .b64 %rd<4>; .reg .b32 %r<2>;
  ld.param.u64 %rd1, [out];
  cvta.to.global.u64 %rd2, %rd1;
  mov.u32 %r1, %tid.x;
  cvt.rn.f32.u32 %f1, %r1;
  fma.rn.f32 %f2, %f1, {m}.0, {n}.0;
  mul.wide.u32 %rd3, %r1, 4;
  add.s64 %rd2, %rd2, %rd3;
  st.global.f32 [%rd2], %f2;
  ret;
}}""", {"fake_fma": [("u64", 0)]})

    module = _fake_stage("ptx", None, "95_fake_ptx")
    module.generate = generate
    monkeypatch.setitem(lessons.STAGES, 95, "95_fake_ptx")
    monkeypatch.setitem(sys.modules, "lessons.95_fake_ptx", module)
    assert inspect(95, 3, 5, 128) == 0
    out = capsys.readouterr().out
    assert "kernel fake_fma" in out and "registers" in out
    assert "FFMA 1" in out and "STG 1" in out


def test_inspect_a_numba_stage_without_gpu_says_what_needs_a_gpu(monkeypatch, capsys):
    from lessons.inspect_stage import inspect
    monkeypatch.setitem(lessons.STAGES, 96, "96_fake_numba")
    monkeypatch.setitem(sys.modules, "lessons.96_fake_numba", _fake_stage("numba", _host_gemm, "96_fake_numba"))
    assert inspect(96, 64, 64, 128) == 0
    assert "Numba stage" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ result files

def test_result_file_round_trip_is_strict_json_and_atomic(tmp_path):
    rows = [{"stage": 1, "time_us": np.float64(12.5), "diff": float("nan"), "pairs": np.int64(3)}]
    device = {"gpu": False, "date": "2026-11-22T00:00:00+00:00"}
    path = tmp_path / "sub" / "ladder.json"
    write_result(path, command="python -m lessons ladder", rows=rows, device=device, shape={"m": 1})
    assert [p.name for p in path.parent.iterdir()] == ["ladder.json"]  # no temp file left behind
    json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    result = read_result(path)
    assert result["rows"] == [{"stage": 1, "time_us": 12.5, "diff": None, "pairs": 3}]
    assert result["date"] == device["date"] and result["shape"] == {"m": 1}
    assert result["command"] == "python -m lessons ladder"


def test_read_result_rejects_other_json(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"rows": []}')
    with pytest.raises(ValueError, match="not a result file"):
        read_result(path)


def test_device_info_without_gpu_is_json_and_hostname_free():
    info = device_info()
    assert {"gpu", "date", "packages", "python"} <= set(info)
    assert info["packages"]["numba-cuda"]
    text = json.dumps(info)
    assert os.uname().nodename not in text


# ------------------------------------------------------------------------------------------------ tables

def test_format_table_aligns_and_marks_missing_values():
    columns = [Column("name", "name", align="left"), Column("t", "time (us)", "{:.1f}")]
    rows = [{"name": "naive", "t": 1234.56}, {"name": "tiled", "t": float("nan")}, {"name": "x"}]
    text = format_table(columns, rows).splitlines()
    assert text[0].split() == ["name", "time", "(us)"]
    assert text[2].endswith("1234.6") and text[3].endswith("-") and text[4].endswith("-")
    assert len({len(line) for line in text[:3]}) == 1
    markdown = format_table(columns, rows, markdown=True).splitlines()
    assert markdown[0] == "| name | time (us) |" and markdown[1] == "|:---|---:|"
    assert markdown[2] == "| naive | 1234.6 |"


def test_bench_shapes():
    assert len(bench_dense.DEEPSEEK_SHAPES) == 18 and (64, 2112, 7168) in bench_dense.DEEPSEEK_SHAPES
    assert len(bench_dense.BENCH_SHAPES) == 26 and (1, 7168, 2048) in bench_dense.BENCH_SHAPES
    assert bench_dense.parse_shapes("64,2112,7168; 128x7168x2048") == [(64, 2112, 7168), (128, 7168, 2048)]
    with pytest.raises(Exception, match="M,N,K"):
        bench_dense.parse_shapes("64,2112")


def test_a_result_records_the_command_as_retyped(monkeypatch):
    from gemm.testing.records import command_line
    monkeypatch.setattr(sys, "argv", ["/x/gemm/__main__.py", "bench", "dense", "--out", "/tmp/o", "--grouped"])
    assert command_line("gemm") == "python -m gemm bench dense --grouped"


def test_choose_pairs_stays_in_bounds():
    assert choose_pairs(1.0, 1e-4) == 3  # a one-second stage-01 call: few pairs
    assert choose_pairs(10e-6, 90e-6) == 50
    assert 3 < choose_pairs(2e-3, 1e-4) < 50


# ------------------------------------------------------------------------------------------ output check

def test_reference_rows_sample_edges_and_check_output_catches_nan(rng):
    a, sa, b, sb = random_problem(700, 40, 256, rng)
    reference = problems.reference_rows(a, sa, b, sb, rng, max_rows=64)
    assert reference.sampled and len(reference.rows) == 64 and {0, 699} <= set(reference.rows.tolist())
    full = reference_gemm(a, sa, b, sb)
    bits = full.astype(np.float32).astype(BF16).view(np.uint16)
    check = problems.check_output(bits, reference)
    assert check["correct"] and check["unwritten"] == 0 and check["diff"] < 1e-4
    bits = bits.copy()
    bits[350, 7] = problems.BF16_NAN_BITS
    check = problems.check_output(bits, reference)
    assert not check["correct"] and check["unwritten"] == 1 and math.isnan(check["diff"])


# ------------------------------------------------------------------------------------------------- docs

def _fake_results(folder: Path):
    device = {"gpu": True, "date": "2026-11-22T12:00:00+00:00", "name": "NVIDIA H100 80GB HBM3", "sm_count": 132,
              "sm_clock_mhz": 1980, "sm_clock_max_mhz": 1980, "driver_version": "580.159.04", "cuda_runtime": "13.0",
              "packages": {"torch": "2.11.0", "numba-cuda": "0.30.4"}}
    ladder_rows = [{"stage": 1, "label": "01 naive", "idea": "one thread per output", "time_us": 512345.0,
                    "tflops": 0.47, "gbps": 0.2, "diff": 1e-6, "status": "ok"},
                   {"stage": 2, "label": "02 smem_tiling", "idea": "tiles in shared memory", "time_us": 101000.0,
                    "tflops": 2.38, "gbps": 1.0, "speedup": 5.07, "diff": 1e-6, "status": "ok"},
                   {"stage": None, "label": "cuBLAS", "kind": "peer", "idea": "torch._scaled_mm", "time_us": 210.0,
                    "tflops": 1145.0, "gbps": 500.0, "diff": 1e-6, "status": "ok"}]
    write_result(folder / "ladder.json", command="python -m lessons ladder", rows=ladder_rows, device=device,
                 shape={"m": 4096, "n": 4096, "k": 7168})
    write_result(folder / "gemm_bench.json", command="python -m gemm bench dense", device=device,
                 rows=[{"M": 64, "N": 2112, "K": 7168, "us": {"ours": 20.0, "cublas": 22.0},
                        "tflops": {"ours": 97.0, "cublas": 88.0}, "gbs": {"ours": 800.0, "cublas": 727.0},
                        "diff": {"ours": 2e-6}, "ours_vs_cublas": 1.1, "status": "ok"}],
                 summary={"ours_vs_cublas": {"geomean": 1.1, "shapes": 1, "at_or_above": 1, "lowest": 1.1}})
    (folder / "ladder.png").write_bytes(b"\x89PNG fake")


def test_render_docs_fills_the_marked_blocks_from_json(tmp_path):
    docs, results = tmp_path / "docs", tmp_path / "results"
    docs.mkdir()
    results.mkdir()
    for name in ("ladder.md", "benchmarks.md"):
        (docs / name).write_text((ROOT / "docs" / name).read_text())
    _fake_results(results)
    args = ["--results", str(results), "--docs", str(docs)]
    assert lessons_command(["docs", *args, "--check"]) == 1  # placeholders differ from the results
    assert lessons_command(["docs", *args]) == 0
    assert lessons_command(["docs", *args, "--check"]) == 0
    ladder = (docs / "ladder.md").read_text()
    block = ladder.split("<!-- ladder_results -->")[1].split("<!-- /ladder_results -->")[0]
    assert "| 02 smem_tiling | tiles in shared memory | 101,000.0 | 2.38 | 1 | 5.07x |" in block
    assert "| cuBLAS | torch._scaled_mm | 210.0 | 1,145 | 500 |" in block
    assert "5.07x" in block and "NVIDIA H100" in block and "![TFLOP/s per stage](../results/ladder.png)" in block
    assert ladder.startswith("# The ladder")  # text outside the markers untouched
    bench_doc = (docs / "benchmarks.md").read_text()
    assert "| shape | ours TFLOP/s | cuBLAS TFLOP/s | ours GB/s |" in bench_doc
    assert "| 64x2112x7168 | 97 | 88 | 800 | - | 1.10x | 2.0e-06 | ok |" in bench_doc
    assert "ours / cuBLAS: geomean 1.100 over 1 shapes" in bench_doc


def test_committed_docs_match_committed_results():
    assert lessons_command(["docs", "--check"]) == 0, "run `python -m lessons docs` and commit docs/"


def test_replace_block_needs_both_markers():
    with pytest.raises(ValueError, match="markers"):
        render_docs.replace_block("no markers here", "ladder_results", "x")


def test_ladder_chart_is_drawn(tmp_path):
    from lessons.ladder import plot_ladder
    rows = [{"label": "01 naive", "tflops": 0.5}, {"label": "02 smem", "tflops": 3.0},
            {"label": "cuBLAS", "kind": "peer", "tflops": 1100.0}, {"label": "03 broken", "status": "failed"}]
    plot_ladder(rows, tmp_path / "ladder.png", title="test")
    assert (tmp_path / "ladder.png").read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
def test_bench_kernel_times_a_numba_kernel_stably():
    from numba import cuda

    from gemm.testing.timer import bench_kernel

    @cuda.jit
    def fill(out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = i

    out = cuda.device_array(64 << 20 >> 2, dtype=np.float32)  # 64 MiB written per call
    blocks = (out.size + 255) // 256

    def launch(stream):
        fill[blocks, 256, cuda.external_stream(stream)](out)

    first, second = bench_kernel(launch), bench_kernel(launch)
    for timing in (first, second):
        assert 3 <= timing.pairs <= 50 and len(timing.samples_us) == 5
        assert 0 < timing.min_us <= timing.median_us
        assert timing.median_us < 1000, "64 MiB at >0.1 TB/s: anything slower is not the kernel"
    assert abs(first.median_us - second.median_us) / first.median_us < 0.25, (first, second)
    assert (out.copy_to_host()[:5] == np.arange(5)).all()


@pytest.mark.gpu
def test_bench_kernel_reports_a_launch_that_cannot_be_captured():
    from numba import cuda

    from gemm.testing.timer import bench_kernel, timing_stream

    @cuda.jit
    def noop(out):
        out[0] = 1

    out = cuda.device_array(1, dtype=np.float32)

    def launch_and_copy_back(stream):  # synchronizing a capturing stream is illegal
        noop[1, 1, cuda.external_stream(stream)](out)
        cuda.external_stream(stream).synchronize()

    with pytest.raises(Exception):
        bench_kernel(launch_and_copy_back)
    timing = bench_kernel(lambda s: noop[1, 1, cuda.external_stream(s)](out))  # the timing stream is still usable
    assert timing_stream() and timing.nodes_per_call == 1
    other = cuda.stream()
    assert bench_kernel(lambda s: noop[1, 1, other](out)).nodes_per_call == 0  # untimed work shows


@pytest.mark.gpu
def test_cublas_peer_is_correct_and_timed(rng):
    if not problems.torch_available():
        pytest.skip("needs torch with CUDA")
    a, sa, b, sb = random_problem(128, 2112, 7168, rng)
    row = peers.time_peer(a, sa, b, sb, problems.reference_rows(a, sa, b, sb, rng))
    assert "peer_error" not in row, row
    assert row["peer_correct"] and row["peer_us"] > 0 and row["peer_tflops"] > 10, row


@pytest.mark.gpu
def test_ladder_on_gpu_writes_json_and_png(tmp_path):
    stages = [s for s in lessons.available_stages() if s in lessons.GEMM_STAGES]
    if not stages:
        pytest.skip("no GEMM stage in this checkout yet")
    result = _run(["-m", "lessons", "ladder", "--m", "256", "--n", "384", "--k", "512", "--out", str(tmp_path)],
                  timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    ladder = read_result(tmp_path / "ladder_256x384x512.json")  # not the ladder's shape: lessons.ladder.ladder_file
    assert [r["stage"] for r in ladder["rows"] if r.get("kind") != "peer"] == stages
    assert all(r["time_us"] > 0 for r in ladder["rows"]), ladder["rows"]
    assert (tmp_path / "ladder_256x384x512.png").exists() and ladder["device"]["sm_count"] > 0


# ----------------------------------------------- the GPU code paths, with a fake timer and simulator arrays

def _fake_timer(launch):
    from gemm.testing.timer import Timing
    launch(0)
    return Timing(median_us=100.0, min_us=95.0, samples_us=[100.0, 95.0, 105.0], pairs=3, flush_us=90.0)


def test_ladder_gpu_path_with_fake_timer_writes_json_and_png(monkeypatch, tmp_path):
    from lessons import ladder
    for number, name, gemm in ((91, "91_fake_ok", _host_gemm), (92, "92_fake_broken", _raises),
                               (93, "93_fake_ok_again", _host_gemm)):
        monkeypatch.setitem(lessons.STAGES, number, name)
        monkeypatch.setitem(sys.modules, f"lessons.{name}", _fake_stage("numba", gemm, name))
    monkeypatch.setattr(ladder, "bench_kernel", _fake_timer)
    monkeypatch.setattr(ladder, "device_info", lambda: {"gpu": True, "date": "2026-11-22T00:00:00+00:00"})
    assert ladder.run_on_gpu((40, 136, 256), [91, 92, 93], with_peer=False, out_dir=tmp_path) == 1  # 92 failed
    assert ladder.ladder_file((40, 136, 256)) == "ladder_40x136x256.json"  # not the ladder's shape: its own file
    result = read_result(tmp_path / "ladder_40x136x256.json")
    rows = {r["stage"]: r for r in result["rows"]}
    assert rows[91]["status"] == "ok" and rows[91]["diff"] < 1e-4 and rows[91]["time_us"] == 100.0
    assert rows[92]["status"] == "failed" and "broken" in rows[92]["error"] and "traceback" not in rows[92]
    assert rows[93]["speedup"] == 1.0  # vs stage 91: the last stage that was timed
    assert result["shape"] == {"m": 40, "n": 136, "k": 256}
    assert (tmp_path / "ladder_40x136x256.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_row_with_fake_gemm_on_cpu_torch(rng):
    torch = pytest.importorskip("torch")

    def host_gemm(lhs, rhs, out, stream=None):
        (a, sa), (b, sb) = lhs, rhs
        assert sa.stride() == (1, 4 * ((a.shape[0] + 3) // 4)), "sa must arrive M-major, M padded to 4"
        ref = reference_gemm(a.view(torch.uint8).numpy(), sa.numpy(), b.view(torch.uint8).numpy(), sb.numpy())
        out.copy_(torch.from_numpy(ref.astype(np.float32)).to(torch.bfloat16))

    row = bench_dense.measure_shape(66, 130, 256, rng, with_peer=False, gemm=host_gemm, device="cpu", timer=_fake_timer)
    assert row["status"] == "ok", row
    assert row["ours_us"] == 100.0 and row["diff"] < 1e-4 and row["unwritten"] == 0
    assert row["ours_tflops"] == pytest.approx(2 * 66 * 130 * 256 / 100e-6 / 1e12)


def test_cublas_scale_layouts_match_torch_rules():
    pytest.importorskip("torch")
    sa = np.arange(6 * 3, dtype=np.float32).reshape(6, 3)
    scale_a = problems.torch_m_major(sa, "cpu", 6)  # torch wants (M, K/128) with strides exactly (1, M)
    assert tuple(scale_a.shape) == (6, 3) and scale_a.stride() == (1, 6) and (scale_a.numpy() == sa).all()
    sb = np.arange(2 * 3, dtype=np.float32).reshape(2, 3)  # (N/128, K/128)
    scale_b = problems.torch_m_major(sb.T, "cpu", 4)  # (K/128, N/128) column-major, leading dim padded to 4
    assert tuple(scale_b.shape) == (3, 2) and scale_b.stride() == (1, 4) and (scale_b.numpy() == sb.T).all()


@pytest.mark.gpu
def test_inspect_a_numba_stage_on_gpu_shows_registers():
    numba_stages = [s for s in lessons.available_stages() if s in lessons.GEMM_STAGES
                    and getattr(lessons.stage(s), "KIND", None) == "numba"]
    if not numba_stages:
        pytest.skip("no Numba stage in this checkout yet")
    result = _run(["-m", "lessons", "inspect", str(numba_stages[0])], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "registers" in result.stdout, result.stdout


# ------------------------------------------------ the timer's bookkeeping, against a simulated driver

class _SimulatedDriver:
    """Just enough of cuda.bindings.driver for bench_kernel: one stream, a clock in microseconds that work
    advances, events that read the clock, and stream capture that records work (a kernel, or the flush's memset)
    as graph nodes instead of doing it."""

    class CUresult:
        CUDA_SUCCESS = 0

    class CUstreamCaptureMode:
        CU_STREAM_CAPTURE_MODE_RELAXED = 2

    class CUevent_flags:
        CU_EVENT_DEFAULT = 0

    class CUstream_flags:
        CU_STREAM_NON_BLOCKING = 1

    class CUgraphNodeType:
        CU_GRAPH_NODE_TYPE_KERNEL = 0
        CU_GRAPH_NODE_TYPE_MEMSET = 2

    FLUSH_US, GRAPH_LAUNCH_US = 90.0, 3.0

    def __init__(self):
        self.clock, self.capture, self.events, self.graphs, self.handles = 0.0, None, {}, {}, 100

    def work(self, microseconds, node_type=CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL):
        if self.capture is not None:
            self.capture.append((node_type, microseconds))
        else:
            self.clock += microseconds

    def _new(self):
        self.handles += 1
        return self.handles

    def cuInit(self, flags): return (0,)
    def cuCtxGetCurrent(self): return (0, 1)
    def cuCtxGetDevice(self): return (0, 0)
    def cuStreamCreate(self, flags): return (0, self._new())
    def cuMemAlloc(self, size): return (0, 4096)
    def cuMemsetD32(self, ptr, value, count): return (0,)  # zeroing the flush buffer once, outside any timing
    def cuMemsetD32Async(self, ptr, value, count, stream):
        self.work(self.FLUSH_US, self.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMSET)
        return (0,)
    def cuStreamSynchronize(self, stream): return (0,)
    def cuEventCreate(self, flags): return (0, self._new())
    def cuEventRecord(self, event, stream): self.events[event] = self.clock; return (0,)
    def cuEventSynchronize(self, event): return (0,)
    def cuEventElapsedTime(self, start, end): return (0, (self.events[end] - self.events[start]) / 1e3)
    def cuEventDestroy(self, event): return (0,)
    def cuStreamBeginCapture(self, stream, mode): self.capture = []; return (0,)
    def cuGraphInstantiate(self, graph, flags): return (0, graph)
    def cuGraphDestroy(self, graph): return (0,)
    def cuGraphGetNodes(self, graph, count):
        nodes = [(graph, index) for index in range(len(self.graphs[graph]))]
        return (0, nodes[:count], len(nodes[:count]) if count else len(nodes))

    def cuGraphNodeGetType(self, node):
        graph, index = node
        return (0, self.graphs[graph][index][0])

    def cuGraphExecDestroy(self, graph): return (0,)
    def cuGraphLaunch(self, graph, stream):
        self.clock += sum(microseconds for _, microseconds in self.graphs[graph]) + self.GRAPH_LAUNCH_US
        return (0,)

    def cuStreamEndCapture(self, stream):
        graph = self._new()
        self.graphs[graph], self.capture = self.capture, None
        return (0, graph)


@pytest.fixture
def simulated_driver(monkeypatch):
    from gemm.testing import timer as testing
    driver = _SimulatedDriver()
    monkeypatch.setattr(testing, "_driver", lambda: driver)
    monkeypatch.setattr(testing, "_timing_streams", {})
    monkeypatch.setattr(testing, "_flush_buffers", {})
    return driver


@pytest.mark.parametrize("kernel_us, expected_pairs", [(40.0, 50), (1e6, 3), (3910.0, 25)])
def test_bench_kernel_subtracts_flushes_and_picks_pairs(simulated_driver, kernel_us, expected_pairs):
    from gemm.testing.timer import MAX_PAIRS, bench_kernel
    calls_outside_capture = []

    def launch(stream):
        if simulated_driver.capture is None:
            calls_outside_capture.append(stream)
        simulated_driver.work(kernel_us)

    timing = bench_kernel(launch)
    assert timing.median_us == pytest.approx(kernel_us) and timing.min_us == pytest.approx(kernel_us)
    assert timing.pairs == min(expected_pairs, MAX_PAIRS) and len(timing.samples_us) == 5
    assert timing.flush_us == pytest.approx(simulated_driver.FLUSH_US + simulated_driver.GRAPH_LAUNCH_US / timing.pairs)
    assert len(calls_outside_capture) >= 1, "the first call must happen before any capture"


def test_bench_kernel_counts_the_graph_nodes_a_call_adds(simulated_driver):
    """Work a call puts on another stream is in no node of the captured graph: nodes_per_call says so (the
    grader's defence against untimed work)."""
    from gemm.testing.timer import bench_kernel
    timed = bench_kernel(lambda stream: simulated_driver.work(50.0))
    assert timed.nodes_per_call == 1 and timed.kernels_per_call == 1

    def elsewhere(stream):  # the work happens, but not on the captured stream
        simulated_driver.clock += 50.0

    assert bench_kernel(elsewhere).nodes_per_call == 0


def test_bench_kernel_ends_the_capture_when_the_launch_fails(simulated_driver):
    from gemm.testing.timer import bench_kernel
    calls = []

    def launch(stream):
        calls.append(simulated_driver.capture is not None)
        if simulated_driver.capture is not None:
            raise RuntimeError("cannot be captured")

    with pytest.raises(RuntimeError, match="cannot be captured"):
        bench_kernel(launch)
    assert simulated_driver.capture is None and calls[0] is False


def test_the_timers_count_kernel_launches_apart_from_other_nodes(simulated_driver):
    """A call of two kernels and a memset: three nodes, two kernel launches; the flushes' memsets are not the call's."""
    from gemm.testing.timer import bench_back_to_back, bench_kernel

    def launch(stream):
        simulated_driver.work(20.0)
        simulated_driver.work(5.0, simulated_driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMSET)
        simulated_driver.work(30.0)

    for timing in (bench_kernel(launch), bench_back_to_back(launch)):
        assert (timing.nodes_per_call, timing.kernels_per_call) == (3, 2)


@pytest.fixture
def simulated_torch(simulated_driver, monkeypatch):
    """bench_kineto and bench on the simulated driver: a torch whose CUDA calls do nothing, and ``fn()`` run as is
    on the timing stream."""
    from gemm.testing import timer
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=lambda: None, current_device=lambda: 0))
    monkeypatch.setattr(timer, "_torch_with_cuda", lambda caller: fake)
    monkeypatch.setattr(timer, "torch_launch", lambda fn: lambda stream: fn())
    return simulated_driver


def test_bench_kineto_keeps_deepgemms_return_contract(simulated_torch):
    from gemm.testing.timer import bench, bench_kineto

    def two_kernels():  # as a K-grouped GEMM that launches one kernel per group
        simulated_torch.work(40.0)
        simulated_torch.work(60.0)

    assert bench_kineto(two_kernels, "fp8_gemm") == pytest.approx(100e-6)  # seconds per call
    assert bench_kineto(two_kernels, ("fp8_gemm", "other")) == pytest.approx((100e-6, 100e-6))
    assert bench_kineto(two_kernels, "fp8_gemm", with_multiple_kernels=True) == pytest.approx(50e-6)  # per launch
    # no flush: back-to-back calls in one graph, whose launch is shared by the calls
    assert bench_kineto(two_kernels, "fp8_gemm", num_tests=10, flush_l2=False) == pytest.approx(100.3e-6)
    assert bench(two_kernels, num_tests=10) == pytest.approx(0.1003)  # milliseconds
    with pytest.raises(RuntimeError, match="no kernel"):
        bench_kineto(lambda: None, "fp8_gemm")
    with pytest.raises(TypeError, match="str or a tuple of str"):
        bench_kineto(two_kernels, ["fp8_gemm"])
    with pytest.raises(ValueError, match="barrier_comm_profiling"):
        bench_kineto(two_kernels, "fp8_gemm", barrier_comm_profiling=True)


def test_bench_kineto_silences_the_calls_after_the_first(simulated_torch, capfd):
    """suppress_kineto_output: the first call prints (DeepGEMM builds its kernels there), the timed ones do not."""
    from gemm.testing.timer import bench_kineto

    def noisy_kernel():
        print("a call")
        os.write(2, b"a call from C\n")
        simulated_torch.work(10.0)

    assert bench_kineto(noisy_kernel, "fp8_gemm", suppress_kineto_output=True) == pytest.approx(10e-6)
    out, err = capfd.readouterr()
    assert (out, err) == ("a call\n", "a call from C\n")
    print("after")  # the descriptors are back
    assert capfd.readouterr().out == "after\n"


def test_deepgemms_timers_need_a_cuda_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    from gemm.testing.timer import bench, bench_kineto
    for call in (lambda: bench_kineto(lambda: None, "fp8_gemm"), lambda: bench(lambda: None)):
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            call()


def _ladder_run(device: str, rows: list[dict]) -> dict:
    from lessons.ladder import LADDER_SHAPE
    m, n, k = LADDER_SHAPE
    return {"device": {"name": device}, "date": "d", "command": "python -m lessons ladder",
            "shape": {"m": m, "n": n, "k": k}, "rows": rows}


def _stage_row(stage: int, tflops: float, status: str = "ok") -> dict:
    return {"stage": stage, "label": f"{stage:02d}", "time_us": 100.0, "tflops": tflops, "status": status}


def test_a_stage_the_reference_ladder_lacks_takes_its_measured_line_from_the_h200_ladder(tmp_path):
    """results/ladder.json (the H100 reference) gives each stage it ran its "Measured:" line, even where that row
    failed (the H200 must not hide it); only a stage it never ran takes the H200 ladder's (results/ladder_h200.json),
    which names its file and device."""
    import shutil
    lessons_dir, results = tmp_path / "lessons", tmp_path / "results"
    lessons_dir.mkdir()
    results.mkdir()
    for number in (16, 17):
        source = next((ROOT / "lessons").glob(f"{number:02d}_*.py"))
        shutil.copy(source, lessons_dir / source.name)
    h100 = _ladder_run("NVIDIA H100 80GB HBM3", [_stage_row(14, 1400.0), _stage_row(17, 0.0, "WRONG")])
    h200 = _ladder_run("NVIDIA H200", [_stage_row(16, 1440.0), _stage_row(17, 1449.7)])
    covered = render_docs.measured_stages(h100, ok_only=False)
    assert covered == {14, 17} and render_docs.measured_stages(h100) == {14}
    assert render_docs.measured_lines(h200, lessons_dir, source="ladder_h200.json", skip=covered) == {}
    rendered = render_docs.measured_lines(h200, lessons_dir, source="ladder_h200.json", skip={14})
    text = rendered[next(lessons_dir.glob("17_*.py"))]
    flat = " ".join(text.split())
    assert "Measured: 1,450 TFLOP/s" in flat and "NVIDIA H200" in flat and "results/ladder_h200.json" in flat


def test_every_stages_measured_line_cites_a_committed_result():
    """A "Measured:" line names the result file it was drawn from; that file is committed (a line left behind by
    a deleted or renamed result would otherwise pass `lessons docs --check`)."""
    import re
    cited = 0
    for path in sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py")):
        text = " ".join(path.read_text().split())
        for line in re.findall(r"Measured: .*?\(results/([\w.]+\.json)", text):
            assert (ROOT / "results" / line).exists(), (path.name, line)
            cited += 1
    assert cited >= 17  # stages 01-17 each cite their run


def test_a_run_on_an_h200_is_bounded_by_its_own_hbm():
    """The SM units are the H100 SXM's on any GH100 board; HBM is the board's: a decode stage measured on an H200
    (4.8 TB/s HBM3e) is not credited with a share of the H100's 3.35 TB/s."""
    from lessons.ladder import speed_of_light
    h100, h200 = speed_of_light(16, 32, 4096, 7168), speed_of_light(16, 32, 4096, 7168, "NVIDIA H200")
    assert (h100["bound_unit"], h200["bound_unit"]) == ("HBM3", "HBM3e")
    assert h200["bound_tflops"] / h100["bound_tflops"] == pytest.approx(4.8 / 3.35)
    assert speed_of_light(17, 4096, 4096, 7168, "NVIDIA H200") == speed_of_light(17, 4096, 4096, 7168)
