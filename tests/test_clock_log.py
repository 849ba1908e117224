"""gemm.testing.clock_log (``bench configs --clocks``): nvidia-smi's samples parsed, each timed round's window
summarized, and the sampler run as a real background process (a fake one here: CPU)."""
import datetime
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

from gemm.testing.clock_log import ClockLog, Window, parse_samples, reason_names, summarize

LINES = """\
2026/11/28 22:50:01.000, 1980, 120.50, 40, 0x0000000000000000
2026/11/28 22:50:01.010, 1755, 686.10, 56, 0x0000000000000004
2026/11/28 22:50:01.020, 1740, [N/A], 56, 0x0000000000000004
2026/11/28 22:50:01.030, 1725, 684.90, 57, 0x0000000000000004
2026/11/28 22:50:01.040, 17"""


def at(ms: int) -> datetime.datetime:
    return datetime.datetime(2026, 11, 28, 22, 50, 1) + datetime.timedelta(milliseconds=ms)


def test_samples_are_parsed_and_unfilled_or_cut_lines_left_out():
    samples = parse_samples(LINES)
    assert [s.sm_mhz for s in samples] == [1980, 1755, 1725]
    assert samples[1].power_w == 686.1 and samples[1].reasons == 4 and samples[2].temperature_c == 57


def test_a_window_takes_the_median_of_the_samples_inside_it():
    samples = parse_samples(LINES)
    summary = summarize(samples, at(5), at(35))
    assert summary == {"samples": 2, "sm_mhz": 1740.0, "power_w": 685.5, "temperature_c": 57,
                       "reasons": ["power cap"]}
    assert summarize(samples, at(100), at(200)) == {"samples": 0}


def test_clock_event_reasons_are_named_and_unknown_bits_kept():
    assert reason_names(0x4 | 0x1) == ["idle", "power cap"]
    assert reason_names(0x4 | 0x1000) == ["power cap", "0x1004"]
    assert reason_names(0) == []


def _fake_sampler(tmp_path: Path) -> list[str]:
    """A stand-in for nvidia-smi -lms 5: a line with the current time every 5 ms."""
    script = tmp_path / "fake_smi.py"
    script.write_text(textwrap.dedent("""\
        import datetime, sys, time
        while True:
            now = datetime.datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
            print(f"{now}, 1800, 650.0, 55, 0x4", flush=True)
            time.sleep(0.005)
        """))
    return [sys.executable, str(script)]


def test_a_background_sampler_fills_each_rounds_window(tmp_path):
    with ClockLog(command=_fake_sampler(tmp_path)) as log:  # returns once the sampler's first line is written
        files = [Path(log._out.name), Path(log._err.name)]
        for _ in range(2):
            with log.window():
                time.sleep(0.1)
    assert len(log.windows) == 2 and all(w.end is not None for w in log.windows)
    assert log._process.poll() is not None and not any(path.exists() for path in files) and log.error is None
    for window in log.windows:
        assert window.summary["samples"] >= 1 and window.summary["sm_mhz"] == 1800
        assert window.summary["reasons"] == ["power cap"]


def test_without_nvidia_smi_there_is_no_sampler_and_the_windows_stay_empty(monkeypatch):
    from gemm.testing import clock_log
    monkeypatch.setattr(clock_log.shutil, "which", lambda name: None)
    assert clock_log.query_fields("00000000:19:00.0") is None and clock_log.query_fields(None) is None
    log = ClockLog("00000000:19:00.0")
    assert not log.available
    with log:
        with log.window():
            pass
    assert log.windows[0].summary == {} and log.error is None


def test_a_sampler_that_exits_at_once_is_reported_with_its_stderr_and_leaves_no_files(tmp_path):
    command = [sys.executable, "-c", "import sys; sys.stderr.write('no such GPU'); sys.exit(3)"]
    with ClockLog(command=command) as log:
        files = [Path(log._out.name), Path(log._err.name)]
        with log.window():
            pass
    assert log.error == f"{sys.executable} exited with 3: no such GPU"
    assert log.windows[0].summary == {"samples": 0} and not any(path.exists() for path in files)


def test_a_sampler_that_cannot_start_is_an_error_not_a_crash():
    with ClockLog(command=["/nonexistent/nvidia-smi"]) as log:
        with log.window():
            pass
    assert log.error.startswith("/nonexistent/nvidia-smi:") and log.windows[0].summary == {}


def test_the_sampler_is_stopped_and_its_files_removed_when_the_timed_code_raises(tmp_path):
    log = ClockLog(command=_fake_sampler(tmp_path))
    try:
        with log:
            files = [Path(log._out.name), Path(log._err.name)]
            with log.window():
                raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert log._process.poll() is not None and not any(path.exists() for path in files)
    assert log.windows[0].end is not None


def test_each_timed_round_is_a_window_and_rows_get_the_rounds_clocks():
    from gemm.testing.bench_configs import clock_fields, timed_rounds
    summaries = iter([{"samples": 3, "sm_mhz": 1700.0, "power_w": 686.0, "reasons": ["power cap"]},
                      {"samples": 3, "sm_mhz": 1750.0, "power_w": 680.0, "reasons": ["power cap"]},
                      {"samples": 0}, {"samples": 2, "sm_mhz": 1800.0, "power_w": 600.0, "reasons": []}])

    class FakeLog:
        def window(self):
            window = Window(datetime.datetime.now())
            window.summary = next(summaries)
            return _Ctx(window)

    class _Ctx:
        def __init__(self, window):
            self.window = window

        def __enter__(self):
            return self.window

        def __exit__(self, *exc):
            return None

    windows: dict = {}
    times = timed_rounds({"a": "a", "b": "b"}, lambda launch: SimpleNamespace(median_us=1.0), rounds=2, warmup=1,
                         clock_log=FakeLog(), windows=windows)
    assert times == {"a": [1.0, 1.0], "b": [1.0, 1.0]} and [len(windows[n]) for n in "ab"] == [2, 2]
    a, b = clock_fields(windows["a"]), clock_fields(windows["b"])  # palindrome: a, b, b, a
    assert a == {"round_mhz": [1700.0, 1800.0], "round_w": [686.0, 600.0], "round_samples": [3, 2],
                 "round_reasons": [["power cap"], []], "sm_mhz": 1750.0, "power_w": 643.0}
    assert b["round_mhz"] == [1750.0, None] and b["sm_mhz"] == 1750.0 and b["round_samples"] == [3, 0]


def test_a_sweeps_table_shows_each_configs_clock_and_power_where_they_were_recorded():
    from lessons.render_docs import _clock_text, sweep_block
    rows = [{"m": 1, "n": 2, "k": 3, "name": "a", "tflops": 10.0, "sm_mhz": 1714.2, "power_w": 705.6},
            {"m": 1, "n": 2, "k": 3, "name": "b", "tflops": 9.0, "vs_first": 0.9, "sm_mhz": None, "power_w": None}]
    table = sweep_block({"device": {"name": "GPU"}, "date": "d", "command": "c", "configs": ["a", "b"], "rows": rows})
    assert "`a` SM MHz / W" in table and "| 1 | 2 | 3 | 10 | 9 | 0.90x | 1714 / 706 | - |" in table
    assert _clock_text({"sm_mhz": 1700.0, "power_w": None}) == "1700 / -"
    unclocked = sweep_block({"device": {"name": "GPU"}, "date": "d", "command": "c", "configs": ["a", "b"],
                             "rows": [{k: v for k, v in r.items() if k not in ("sm_mhz", "power_w")} for r in rows]})
    assert "MHz" not in unclocked
