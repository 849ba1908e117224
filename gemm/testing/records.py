"""Result files and tables: the device a run was taken on (name, clocks, versions), the JSON every benchmark
writes (atomically, with the command that reproduces it) and the plain/markdown tables they print."""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gemm.testing.timer import _check, _driver, _ensure_primary_context  # the timer's driver helpers

# ---------------------------------------------------------------------------------------------- device

def _package_versions() -> dict[str, str | None]:
    versions = {}
    for name in ("numba-cuda", "cuda-core", "cuda-bindings", "nvidia-nvjitlink", "torch", "numpy", "ml-dtypes"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _nvidia_smi_clocks(gpu: str = "0") -> dict | None:
    """``gpu``: what nvidia-smi's -i takes; a PCI bus id names the same GPU whatever CUDA_VISIBLE_DEVICES says."""
    fields = ["clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem", "power.limit", "driver_version"]
    try:
        text = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", "-i", gpu],
            capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    values = [v.strip() for v in text.strip().splitlines()[0].split(",")] if text.strip() else []
    if len(values) != len(fields):
        return None
    names = ["sm_clock_mhz", "sm_clock_max_mhz", "mem_clock_mhz", "mem_clock_max_mhz", "power_limit_w",
             "driver_version"]
    clocks = {name: _number(v) for name, v in zip(names, values)}
    clocks["driver_version"] = str(values[-1])  # "580.159.04" is not a number
    return clocks


def _number(text: str):
    try:
        return float(text) if "." in text else int(text)
    except ValueError:
        return text


def _gpu_facts(ordinal: int | None = None) -> dict:
    """The facts of device ``ordinal`` (default: the current device, the one a benchmark ran on)."""
    driver = _driver()
    ordinal = _ensure_primary_context(ordinal)
    device = _check(driver.cuDeviceGet(ordinal))
    attr = driver.CUdevice_attribute

    def attribute(name):
        return int(_check(driver.cuDeviceGetAttribute(getattr(attr, name), device)))

    facts = {
        "ordinal": ordinal,
        "name": _check(driver.cuDeviceGetName(256, device)).split(b"\0")[0].decode(),
        "compute_capability": f"{attribute('CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR')}."
                              f"{attribute('CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR')}",
        "sm_count": attribute("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
        "l2_bytes": attribute("CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE"),
        "memory_bytes": int(_check(driver.cuDeviceTotalMem(device))),
        "driver_cuda_version": _cuda_version_string(int(_check(driver.cuDriverGetVersion()))),
    }
    bus_id = gpu_bus_id(ordinal)
    clocks = _nvidia_smi_clocks(bus_id) if bus_id else None
    if clocks is None:  # no nvidia-smi: the driver knows only the maximum clocks
        clocks = {"sm_clock_max_mhz": attribute("CU_DEVICE_ATTRIBUTE_CLOCK_RATE") // 1000,
                  "mem_clock_max_mhz": attribute("CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE") // 1000,
                  "clock_source": "driver attributes (nvidia-smi unavailable)"}
    else:
        clocks["clock_source"] = "nvidia-smi"
    facts.update(clocks)
    return facts


def gpu_bus_id(ordinal: int | None = None) -> str | None:
    """Device ``ordinal``'s (default: the current device's) PCI bus id, what nvidia-smi's -i takes: it names the same
    GPU whatever CUDA_VISIBLE_DEVICES says. None where the driver does not say (the CUDA ordinal is no substitute:
    nvidia-smi numbers the GPUs its own way)."""
    driver = _driver()
    ordinal = _ensure_primary_context(ordinal)
    device = _check(driver.cuDeviceGet(ordinal))
    err, bus_id = driver.cuDeviceGetPCIBusId(32, device)
    return bus_id.split(b"\0")[0].decode() or None if err == driver.CUresult.CUDA_SUCCESS and bus_id else None


def _cuda_version_string(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


def _toolkit_versions() -> dict:
    versions = {}
    try:
        from cuda.bindings import runtime
        err, version = runtime.cudaRuntimeGetVersion()
        versions["cuda_runtime"] = _cuda_version_string(version) if int(err) == 0 else None
    except Exception:
        versions["cuda_runtime"] = None
    try:
        from cuda.bindings import nvjitlink
        versions["nvjitlink"] = ".".join(map(str, nvjitlink.version()))
    except Exception:
        versions["nvjitlink"] = None
    return versions


def device_info() -> dict:
    """What a result was measured on: GPU, clocks, driver and library versions, UTC date (no hostname)."""
    from ptx.device import has_gpu
    info = {"gpu": has_gpu(), "date": utc_now()}
    if info["gpu"]:
        try:
            info.update(_gpu_facts())
        except Exception as error:  # a description must never stop a benchmark
            info["gpu_facts_error"] = str(error)
    info.update(_toolkit_versions())
    info["python"] = platform.python_version()
    info["packages"] = _package_versions()
    return info


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------------------- results

def command_line(module: str) -> str:
    """The command that produced a result, as a user would retype it."""
    import shlex
    args, skip = [], False
    for arg in sys.argv[1:]:  # --out only says where this run's files went; the default is results/
        if skip or arg == "--out" or arg.startswith("--out="):
            skip = arg == "--out"
            continue
        args.append(arg)
    return shlex.join(["python", "-m", module, *args])


def write_result(path, *, command: str, rows: list[dict], device: dict | None = None, **extra) -> dict:
    """Write {"device", "date", "command", "rows", **extra} as JSON, atomically (temp file + rename)."""
    device = device_info() if device is None else device
    result = {"device": device, "date": device.get("date", utc_now()), "command": command, **extra,
              "rows": rows}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp",
                                     delete=False) as handle:
        json.dump(_plain(result), handle, indent=1, allow_nan=False)
        handle.write("\n")
    os.replace(handle.name, path)
    return result


def read_result(path) -> dict:
    with open(path) as handle:
        result = json.load(handle)
    missing = {"device", "date", "command", "rows"} - set(result)
    if missing:
        raise ValueError(f"{path}: not a result file (missing {sorted(missing)})")
    return result


def _plain(value):
    """JSON-safe copy: numpy scalars -> Python numbers, NaN/inf -> None (strict JSON has no NaN)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# ---------------------------------------------------------------------------------------------- tables

@dataclass
class Column:
    key: str
    title: str
    format: str | Callable = "{}"  # a format string or a function of the value; None/NaN print as "-"
    align: str = "right"


def three_digits(value: float) -> str:
    """0.472, 2.38, 14.1, 1,145: enough digits to compare stages across three orders of magnitude."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def format_cell(value, fmt) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    try:
        return fmt(value) if callable(fmt) else fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def format_table(columns: list[Column], rows: list[dict], *, markdown: bool = False) -> str:
    """Rows of dicts -> an aligned text table (terminal) or a Markdown table (docs)."""
    cells = [[format_cell(row.get(c.key), c.format) for c in columns] for row in rows]
    titles = [c.title for c in columns]
    if markdown:
        cells = [[cell.replace("|", "\\|") for cell in row] for row in cells]
        lines = ["| " + " | ".join(titles) + " |",
                 "|" + "|".join("---:" if c.align == "right" else ":---" for c in columns) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in cells]
        return "\n".join(lines)
    widths = [max(len(t), *(len(r[i]) for r in cells)) if cells else len(t) for i, t in enumerate(titles)]

    def line(values):
        return "  ".join(v.rjust(w) if c.align == "right" else v.ljust(w)
                         for v, w, c in zip(values, widths, columns)).rstrip()

    return "\n".join([line(titles), line(["-" * w for w in widths]), *map(line, cells)])
