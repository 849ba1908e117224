"""PTX text -> cubin for sm_90a through nvJitLink or ptxas, with ptxas's resource report as data. No GPU needed.

nvJitLink embeds ptxas, so this works on any machine with the ``nvidia-nvjitlink`` wheel. With ``-verbose``
ptxas prints, per kernel, the registers, spills, stack frame and shared memory; we parse that into
:class:`Resources` so tests and ``python -m lessons inspect`` can assert "no spills" without a GPU.

nvJitLink always compiles separately (``--compile-only``: code meant for linking), and in that mode ptxas drops
``setmaxnreg`` ("ignored to maintain compatibility across compilation units", C7504). A kernel that moves
registers between warpgroups therefore goes through the standalone ``ptxas`` in whole-program mode instead
(the ``nvidia-cuda-nvcc`` wheel ships it; a CUDA toolkit on PATH does too): ``assembler="auto"`` picks it
exactly for a :class:`ptx.builder.PtxModule` whose ``whole_program`` the builder set (it emitted ``setmaxnreg``).
Plain text (hand-written, Numba's, or edited by str operations) says nothing of the kind, so it needs the
assembler named.

Results are cached in memory and on disk (``$FP8LADDER_CACHE_DIR``, default ``~/.cache/fp8-ladder``),
keyed by content only: the PTX, the arch, the options, the assembler and its version (never a path), so a
cache directory can be moved or copied to another machine and still hit (``python -m gemm prebuild`` fills
one ahead of time). Files are written to a temporary name in the cache directory and renamed into place, so
concurrent writers never leave a torn file.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_ARCH = "sm_90a"


class PTXCompileError(RuntimeError):
    """nvJitLink rejected the PTX. ``log`` is ptxas's message; ``lines`` the PTX line numbers it blames."""

    def __init__(self, log: str, ptx: str):
        self.log = log
        self.ptx = ptx
        self.lines = sorted({int(n) for n in re.findall(r"line (\d+);", log)})
        source = ptx.splitlines()
        quoted = [f"  {n:5d} | {source[n - 1].strip()}" for n in self.lines if 0 < n <= len(source)]
        message = "nvJitLink could not compile the PTX:\n" + log.strip()
        if quoted:
            message += "\noffending PTX lines:\n" + "\n".join(quoted)
        super().__init__(message)


@dataclass(frozen=True)
class Resources:
    """What ptxas reports for one kernel (bytes unless named otherwise)."""
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack_frame: int = 0
    shared_bytes: int = 0  # static shared memory declared by the kernel (dynamic smem comes at launch)
    local_bytes: int = 0
    barriers: int = 0
    constant_bytes: int = 0  # cmem[0]: the parameter bank, mostly

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads


@dataclass
class Cubin:
    image: bytes
    ptx: str
    arch: str
    resources: dict[str, Resources] = field(default_factory=dict)
    info_log: str = ""
    from_cache: bool = False  # True when the image was read from the disk cache instead of compiled

    @property
    def warnings(self) -> list[str]:
        """ptxas/nvJitLink warnings, e.g. wgmma serialization ("Potential Performance Loss")."""
        return [line.strip() for line in self.info_log.splitlines() if "warning" in line.lower()]

    @functools.cached_property
    def key(self) -> str:
        """sha256 of the image: names this cubin in the loaded-kernel cache."""
        return hashlib.sha256(self.image).hexdigest()


# -- the verbose log ---------------------------------------------------------------------------------
_FUNCTION = re.compile(r"Function properties for (?:'(\w+)':|(\w+)\s*$)")


def _fields(text: str, patterns: list[tuple[str, str]]) -> dict[str, int]:
    values = {}
    for key, pattern in patterns:
        match = re.search(pattern, text)
        if match:
            values[key] = int(match.group(1))
    return values


def parse_resources(log: str) -> dict[str, Resources]:
    """Parse nvJitLink's verbose info log into {kernel: Resources}.

    The log holds two reports per kernel. ptxas's: "Function properties for k", then "N bytes stack frame,
    N bytes spill stores, N bytes spill loads" and "Used N registers, used N barriers, N bytes smem".
    The linker's: "Function properties for 'k':", then "used N registers, ..., N bytes smem, N bytes
    cmem[0], N bytes lmem". ptxas's smem is the kernel's own static shared memory (the linker's adds the
    1 KiB sm_90 reserves), so shared_bytes comes from ptxas and lmem/cmem from the linker.
    """
    ptxas_fields = [("stack_frame", r"(\d+) bytes stack frame"), ("spill_stores", r"(\d+) bytes spill stores"),
                    ("spill_loads", r"(\d+) bytes spill loads"), ("registers", r"Used (\d+) registers"),
                    ("barriers", r"used (\d+) barriers"), ("shared_bytes", r"(\d+) bytes smem")]
    linker_fields = [("local_bytes", r"(\d+) bytes lmem"), ("constant_bytes", r"(\d+) bytes cmem\[0\]"),
                     ("registers", r"used (\d+) registers"), ("barriers", r"used (\d+) barriers"),
                     ("stack_frame", r"(\d+) stack")]
    found: dict[str, dict[str, int]] = {}
    lines = log.splitlines() + ["", ""]
    for i, line in enumerate(lines):
        match = _FUNCTION.search(line)
        if not match:
            continue
        if match.group(1):  # linker report: one line follows; ptxas's numbers win where both exist
            entry = found.setdefault(match.group(1), {})
            for key, value in _fields(lines[i + 1], linker_fields).items():
                if key in ("local_bytes", "constant_bytes"):
                    entry[key] = value
                else:
                    entry.setdefault(key, value)
        else:
            entry = found.setdefault(match.group(2), {})
            entry.update(_fields(lines[i + 1] + "\n" + lines[i + 2], ptxas_fields))
    return {name: Resources(**values) for name, values in found.items()}


# -- the caches --------------------------------------------------------------------------------------
_MEMORY: dict[str, Cubin] = {}
compile_count = 0  # how many times nvJitLink actually ran in this process (tests use it to see cache hits)


def cache_dir() -> Path:
    """``$FP8LADDER_CACHE_DIR``, else ``~/.cache/fp8-ladder``; read at every lookup, so it may change at run time."""
    return Path(os.environ.get("FP8LADDER_CACHE_DIR") or Path.home() / ".cache" / "fp8-ladder").expanduser()


@functools.lru_cache(maxsize=None)
def _nvjitlink_version() -> str:
    from cuda.bindings import nvjitlink
    return ".".join(map(str, nvjitlink.version()))


def cache_key(ptx: str, arch: str, options: tuple[str, ...]) -> str:
    """sha256 of what decides the cubin. Content only (no paths): a moved or copied cache still hits."""
    text = "\0".join([ptx, arch, *options, _nvjitlink_version()])
    return hashlib.sha256(text.encode()).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read_disk(key: str, ptx: str, arch: str) -> Cubin | None:
    folder = cache_dir()
    image_path, report_path = folder / f"{key}.cubin", folder / f"{key}.json"
    try:
        # The report is written last, so its presence means the image is complete.
        report = json.loads(report_path.read_text())
        image = image_path.read_bytes()
    except (OSError, ValueError):
        return None
    if hashlib.sha256(image).hexdigest() != report.get("image_sha256"):
        return None
    resources = {name: Resources(**values) for name, values in report["resources"].items()}
    return Cubin(image, ptx, arch, resources, report.get("info_log", ""), from_cache=True)


def _write_disk(key: str, cubin: Cubin) -> None:
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _atomic_write(folder / f"{key}.cubin", cubin.image)
        report = {"arch": cubin.arch, "image_sha256": hashlib.sha256(cubin.image).hexdigest(),
                  "resources": {n: dataclasses.asdict(r) for n, r in cubin.resources.items()},
                  "info_log": cubin.info_log}
        _atomic_write(folder / f"{key}.json", json.dumps(report, indent=1).encode())
    except OSError:
        pass  # a read-only or full cache directory must not break compilation


# -- nvJitLink ---------------------------------------------------------------------------------------
def _log(getter_size, getter, handle) -> str:
    size = getter_size(handle)
    buffer = bytearray(size)
    if size:
        getter(handle, buffer)
    return bytes(buffer).rstrip(b"\0").decode(errors="replace")


@functools.lru_cache(maxsize=None)
def ptxas_path() -> str:
    """ptxas from the nvidia-cuda-nvcc wheel (nvidia/cu13/bin), else from PATH or /usr/local/cuda/bin."""
    import shutil
    import sys
    import sysconfig
    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path}
    candidates = [Path(root) / "nvidia/cu13/bin/ptxas" for root in roots]
    candidates += [Path(p) for p in (shutil.which("ptxas") or "", "/usr/local/cuda/bin/ptxas") if p]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise FileNotFoundError("ptxas not found (kernels with setmaxnreg need whole-program assembly): install the "
                            "nvidia-cuda-nvcc wheel (pip install 'nvidia-cuda-nvcc==13.0.*') or put CUDA's bin on PATH")


@functools.lru_cache(maxsize=None)
def _ptxas_version() -> str:
    import subprocess
    done = subprocess.run([ptxas_path(), "--version"], capture_output=True, text=True)
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 else "unknown"


def _run_ptxas(ptx: str, arch: str, options: tuple[str, ...]) -> tuple[bytes, str]:
    import subprocess
    global compile_count
    compile_count += 1
    with tempfile.TemporaryDirectory() as folder:
        source, target = Path(folder) / "kernel.ptx", Path(folder) / "kernel.cubin"
        source.write_text(ptx)
        done = subprocess.run([ptxas_path(), f"-arch={arch}", "-O3", "-v", *options, str(source), "-o", str(target)],
                              capture_output=True, text=True)
        # ptxas names the source by its temporary path in warnings: keep that path out of the cached report
        log = (done.stderr + done.stdout).replace(str(source), "kernel.ptx")
        if done.returncode != 0:
            raise PTXCompileError(log, ptx)
        return target.read_bytes(), log


def _run_nvjitlink(ptx: str, arch: str, options: tuple[str, ...]) -> tuple[bytes, str]:
    from cuda.bindings import nvjitlink
    global compile_count
    compile_count += 1
    flags = [f"-arch={arch}", "-O3", "-verbose", *options]
    handle = nvjitlink.create(len(flags), flags)
    try:
        try:
            data = ptx.encode()
            nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel.ptx")
            nvjitlink.complete(handle)
        except nvjitlink.nvJitLinkError as error:
            log = _log(nvjitlink.get_error_log_size, nvjitlink.get_error_log, handle)
            raise PTXCompileError(log or str(error), ptx) from None
        info = _log(nvjitlink.get_info_log_size, nvjitlink.get_info_log, handle)
        size = nvjitlink.get_linked_cubin_size(handle)
        image = bytearray(size)
        nvjitlink.get_linked_cubin(handle, image)
        return bytes(image), info
    finally:
        nvjitlink.destroy(handle)


def choose_assembler(ptx: str, assembler: str = "auto") -> str:
    """``assembler``, or for "auto" what the builder's module asks for: ptxas for whole-program PTX."""
    if assembler not in ("auto", "nvjitlink", "ptxas"):
        raise ValueError(f"assembler must be 'auto', 'nvjitlink' or 'ptxas', got {assembler!r}")
    if assembler != "auto":
        return assembler
    whole_program = getattr(ptx, "whole_program", None)
    if whole_program is None:
        raise TypeError("compile_ptx: this PTX is plain text, not a ptx.builder.PtxModule, so nothing says whether it "
                        "needs whole-program assembly (setmaxnreg): pass assembler='nvjitlink' or 'ptxas', or wrap "
                        "it in PtxModule(text, kernels, whole_program)")
    return "ptxas" if whole_program else "nvjitlink"


def compile_ptx(ptx: str, arch: str = DEFAULT_ARCH, options=(), assembler: str = "auto") -> Cubin:
    """Assemble ``ptx`` for ``arch``; returns a :class:`Cubin` (cached in memory and on disk).

    ``options`` go to the assembler (nvJitLink flags, or ptxas's own with ``assembler="ptxas"``); ``assembler``:
    see :func:`choose_assembler` ("auto" needs a :class:`ptx.builder.PtxModule`).
    """
    options = tuple(options)
    assembler = choose_assembler(ptx, assembler)
    version = _ptxas_version() if assembler == "ptxas" else ""
    key = cache_key(ptx, arch, (*options, assembler, version))
    if key in _MEMORY:
        return _MEMORY[key]
    cubin = _read_disk(key, ptx, arch)
    if cubin is None:
        run = _run_ptxas if assembler == "ptxas" else _run_nvjitlink
        image, info = run(ptx, arch, options)
        cubin = Cubin(image, ptx, arch, parse_resources(info), info)
        _write_disk(key, cubin)
    _MEMORY[key] = cubin
    return cubin


def clear_memory_cache() -> None:
    _MEMORY.clear()


__all__ = ["compile_ptx", "Cubin", "Resources", "PTXCompileError", "parse_resources", "cache_dir",
           "clear_memory_cache", "ptxas_path", "choose_assembler"]
