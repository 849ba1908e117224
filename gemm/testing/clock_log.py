"""The SM clock and board power while kernels are timed: nvidia-smi samples them in the background
(``python -m gemm bench configs --clocks``).

Why: a long-K FP8 GEMM runs an H100 or H200 at its power limit, where the power cap, not the kernel, sets the SM
clock. Two configs timed round by round can then differ by their clock as well as by their cycles; a round's log
says which. nvidia-smi writes a line every ``interval_ms``; each timed round marks its window (:meth:`window`), and
once the log is closed each window gets the median clock and power of the samples inside it.
"""
from __future__ import annotations

import datetime
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# newest names first; drivers before 530 have no power.draw.instant, before 535 no clocks_event_reasons
FIELD_SETS = (("clocks.sm", "power.draw.instant", "temperature.gpu", "clocks_event_reasons.active"),
              ("clocks.sm", "power.draw", "temperature.gpu", "clocks_throttle_reasons.active"))
# nvidia-smi's clock event reasons (nvml.h, nvmlClocksEventReason*), the ones a timed kernel meets
REASONS = {0x1: "idle", 0x2: "application clocks", 0x4: "power cap", 0x8: "hardware slowdown",
           0x20: "thermal (software)", 0x40: "thermal (hardware)", 0x80: "power brake"}
TIME_FORMAT = "%Y/%m/%d %H:%M:%S.%f"


@dataclass
class Sample:
    time: datetime.datetime
    sm_mhz: float
    power_w: float
    temperature_c: float
    reasons: int


@dataclass
class Window:
    """One timed round's span; ``summary`` is filled when the log closes."""
    start: datetime.datetime
    end: datetime.datetime | None = None
    summary: dict = field(default_factory=dict)


def parse_samples(text: str) -> list[Sample]:
    """nvidia-smi's ``--format=csv,noheader,nounits`` lines (timestamp first, then a FIELD_SETS set) as samples;
    lines it could not fill ("[N/A]", a line cut short when it was stopped) are left out."""
    samples = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 5:
            continue
        try:
            samples.append(Sample(datetime.datetime.strptime(parts[0], TIME_FORMAT), float(parts[1]),
                                  float(parts[2]), float(parts[3]), int(parts[4], 16)))
        except ValueError:
            continue
    return samples


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in REASONS.items() if mask & bit] + ([f"0x{mask:x}"] if mask & ~sum(REASONS) else [])


def summarize(samples: list[Sample], start: datetime.datetime, end: datetime.datetime) -> dict:
    """The median SM clock and power of the samples in [start, end], the hottest temperature and every clock event
    reason seen; {"samples": 0} when none fell inside (a window shorter than the sampling interval)."""
    inside = [s for s in samples if start <= s.time <= end]
    if not inside:
        return {"samples": 0}
    reasons = 0
    for sample in inside:
        reasons |= sample.reasons
    return {"samples": len(inside), "sm_mhz": statistics.median(s.sm_mhz for s in inside),
            "power_w": statistics.median(s.power_w for s in inside),
            "temperature_c": max(s.temperature_c for s in inside), "reasons": reason_names(reasons)}


def query_fields(gpu: str | None) -> tuple[str, ...] | None:
    """The first of FIELD_SETS this nvidia-smi answers for ``gpu``; None without nvidia-smi, a GPU it can name, or
    an answer."""
    if gpu is None or shutil.which("nvidia-smi") is None:
        return None
    for fields in FIELD_SETS:
        try:
            done = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                                   "-i", gpu], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode == 0 and "[N/A]" not in done.stdout and "Not Supported" not in done.stdout:
            return fields
    return None


class ClockLog:
    """``with ClockLog(gpu, fields) as log:`` samples ``gpu`` (what nvidia-smi's -i takes: a PCI bus id names the GPU
    whatever CUDA_VISIBLE_DEVICES says) every ``interval_ms`` into a file; ``with log.window() as w:`` marks a
    round. When the ``with`` ends, every window's ``summary`` is filled. ``fields``: a FIELD_SETS set
    (:func:`query_fields`, asked once by the caller; None: asked here). ``command``: the sampler's argv (tests pass
    a fake). ``available`` is False where there is no sampler to run; ``error`` says why a sampler that ran gave
    nothing (it exited early: its stderr), and the windows then stay empty."""

    START_SECONDS = 10.0  # the first line: nvidia-smi starts NVML before it samples

    def __init__(self, gpu: str | None = "0", interval_ms: int = 10, command: list[str] | None = None,
                 fields: tuple[str, ...] | None = None):
        if command is None:
            fields = fields or query_fields(gpu)
            command = (["nvidia-smi", f"--query-gpu=timestamp,{','.join(fields)}", "--format=csv,noheader,nounits",
                        "-lms", str(interval_ms), "-i", gpu] if fields else None)
        self.command, self.fields, self.interval_ms = command, fields, interval_ms
        self.available = command is not None
        self.error: str | None = None
        self.windows: list[Window] = []
        self.samples: list[Sample] = []
        self._process = self._out = self._err = None

    def __enter__(self) -> "ClockLog":
        if not self.available:
            return self
        # files, not pipes: nothing reads until the end, and a full pipe would stop nvidia-smi mid-run
        self._out = tempfile.NamedTemporaryFile("w+", suffix=".csv", delete=False)
        self._err = tempfile.NamedTemporaryFile("w+", suffix=".err", delete=False)
        try:
            self._process = subprocess.Popen(self.command, stdout=self._out, stderr=self._err, text=True)
        except OSError as error:
            self.error = f"{self.command[0]}: {error}"
            self._close_files()
            return self
        self._wait_for_first_line()
        return self

    def _wait_for_first_line(self) -> None:
        """Until the sampler has written (so the first window has samples) or exited, at most START_SECONDS."""
        deadline = time.monotonic() + self.START_SECONDS
        path = Path(self._out.name)
        while path.stat().st_size == 0 and self._process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)

    def window(self) -> "_Marker":
        window = Window(datetime.datetime.now())
        self.windows.append(window)
        return _Marker(window)

    def __exit__(self, *exc) -> None:
        if self._process is None:
            return
        try:
            exited = self._process.poll()
            if exited is None:
                self._process.terminate()
                try:
                    self._process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait()
            self._out.flush()
            self.samples = parse_samples(Path(self._out.name).read_text())
            if exited is not None:  # it stopped by itself: say so, with what it said
                stderr = Path(self._err.name).read_text().strip()
                self.error = f"{self.command[0]} exited with {exited}" + (f": {stderr[-300:]}" if stderr else "")
        finally:
            self._close_files()
        # naive local times on both sides (nvidia-smi's timestamp and datetime.now()): one machine, one clock
        # (a daylight-saving change inside a run would misplace its windows)
        for window in self.windows:
            window.summary = summarize(self.samples, window.start, window.end or window.start)

    def _close_files(self) -> None:
        for handle in (self._out, self._err):
            if handle is not None:
                handle.close()
                Path(handle.name).unlink(missing_ok=True)


class _Marker:
    def __init__(self, window: Window):
        self.window = window

    def __enter__(self) -> Window:
        return self.window

    def __exit__(self, *exc) -> None:
        self.window.end = datetime.datetime.now()


__all__ = ["ClockLog", "Sample", "Window", "parse_samples", "summarize", "reason_names", "query_fields"]
