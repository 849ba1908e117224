"""The PTX toolchain on the CPU: nvJitLink compile + resources + caches, nvdisasm listing + patching, TMA
argument checks, kernel-argument packing. The GPU half runs ptx.smoke's items (python -m ptx smoke), one test each."""
import ctypes
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ptx.compile as compile_module
from ptx.builder import KernelBuilder, PtxModule, module
from ptx.compile import PTXCompileError, compile_ptx, parse_resources
from ptx.device import has_gpu
from ptx.sass import disassemble, opcode_counts, patch_instruction, read_instruction
from ptx.smoke import ITEMS as SMOKE_ITEMS

REPO = Path(__file__).resolve().parents[1]

SCALE_PTX = PtxModule(""".version 8.5
.target sm_90a
.address_size 64
.visible .entry scale(.param .u64 data, .param .f32 factor, .param .u32 count)
{
    .reg .b32 %r<6>; .reg .b64 %rd<4>; .reg .f32 %f<3>; .reg .pred %p<2>;
    ld.param.u64 %rd1, [data]; ld.param.f32 %f1, [factor]; ld.param.u32 %r1, [count];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x; mad.lo.u32 %r2, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r2, %r1;
    @%p1 bra $done;
    mul.wide.u32 %rd2, %r2, 4; add.s64 %rd1, %rd1, %rd2;
    ld.global.f32 %f2, [%rd1]; mul.f32 %f2, %f2, %f1; st.global.f32 [%rd1], %f2;
$done:
    ret;
}
""", {"scale": [("u64", 0), ("f32", 0), ("u32", 0)]})  # written by hand: its parameters stated, not parsed


def unique_ptx(tag: str) -> PtxModule:
    """A PTX module nobody compiled before (a comment changes the cache key, not the code)."""
    return PtxModule(SCALE_PTX + f"// {tag} {os.urandom(8).hex()}\n", SCALE_PTX.kernels)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FP8LADDER_CACHE_DIR", str(tmp_path / "cache"))
    compile_module.clear_memory_cache()
    yield tmp_path / "cache"
    compile_module.clear_memory_cache()


# -- compile -----------------------------------------------------------------------------------------
def test_compile_reports_resources(cache_dir):
    cubin = compile_ptx(unique_ptx("resources"))
    assert cubin.image[:4] == b"\x7fELF" and cubin.arch == "sm_90a"
    res = cubin.resources["scale"]
    assert res.registers > 0
    assert res.spill_stores == res.spill_loads == res.stack_frame == res.local_bytes == 0
    assert res.shared_bytes == 0


def test_parse_resources_reads_spills_and_smem():
    log = textwrap.dedent("""\
        ptxas info    : Compiling entry function 'k' for 'sm_90a'
        ptxas info    : Function properties for k
        ptxas         .     24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
        ptxas info    : Used 168 registers, used 1 barriers, 4096 bytes smem
        info    : Function properties for 'k':
        info    : used 168 registers, used 1 barriers, 24 stack, 5120 bytes smem, 548 bytes cmem[0], 16 bytes lmem
        """)
    res = parse_resources(log)["k"]
    assert (res.registers, res.barriers, res.stack_frame) == (168, 1, 24)
    assert (res.spill_stores, res.spill_loads, res.spills) == (8, 12, 20)
    assert (res.shared_bytes, res.local_bytes, res.constant_bytes) == (4096, 16, 548)


def test_memory_cache_hit(cache_dir):
    source = unique_ptx("memory")
    first = compile_ptx(source)
    count = compile_module.compile_count
    again = compile_ptx(source)
    assert again is first and compile_module.compile_count == count


def test_disk_cache_respects_env_and_hits(cache_dir):
    source = unique_ptx("disk")
    first = compile_ptx(source)
    assert not first.from_cache
    files = sorted(p.suffix for p in cache_dir.iterdir())
    assert files == [".cubin", ".json"]
    compile_module.clear_memory_cache()
    count = compile_module.compile_count
    second = compile_ptx(source)
    assert second.from_cache and compile_module.compile_count == count
    assert second.image == first.image and second.resources == first.resources


def test_cache_key_covers_options(cache_dir):
    source = unique_ptx("options")
    plain = compile_ptx(source)
    count = compile_module.compile_count
    compile_ptx(source, options=("-lineinfo",))
    assert compile_module.compile_count == count + 1
    assert compile_ptx(source) is plain


def test_corrupt_cache_entry_is_recompiled(cache_dir):
    source = unique_ptx("corrupt")
    good = compile_ptx(source)
    for path in cache_dir.glob("*.cubin"):
        path.write_bytes(b"garbage")
    compile_module.clear_memory_cache()
    again = compile_ptx(source)
    assert not again.from_cache and again.image == good.image


WRITER = """
import sys
import ptx.compile as c
base = open(sys.argv[1]).read()
for round in range(6):
    for variant in range(4):
        c.clear_memory_cache()
        c.compile_ptx(base + f"// variant {variant}\\n", assembler="nvjitlink")
"""


def test_concurrent_writers_leave_a_valid_cache(cache_dir, tmp_path):
    source_file = tmp_path / "kernel.ptx"
    source_file.write_text(unique_ptx("race"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "FP8LADDER_CACHE_DIR": str(cache_dir)}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(source_file)], env=env,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for writer in writers:
        _, err = writer.communicate(timeout=300)
        assert writer.returncode == 0, err
    names = sorted(p.name for p in cache_dir.iterdir())
    assert not [n for n in names if n.endswith(".tmp")], names
    assert len(names) == 8  # 4 variants x (cubin, json)
    for report_path in cache_dir.glob("*.json"):
        report = json.loads(report_path.read_text())
        image = report_path.with_suffix(".cubin").read_bytes()
        import hashlib
        assert hashlib.sha256(image).hexdigest() == report["image_sha256"]
    compile_module.clear_memory_cache()
    for variant in range(4):
        assert compile_ptx(source_file.read_text() + f"// variant {variant}\n", assembler="nvjitlink").from_cache


def test_compile_error_names_the_line(cache_dir):
    broken = unique_ptx("broken").replace("mul.f32 %f2, %f2, %f1;", "mul.f32 %f2, %f9, %f1;")
    with pytest.raises(PTXCompileError) as caught:
        compile_ptx(broken, assembler="nvjitlink")  # str.replace made plain text: the assembler is named
    error = caught.value
    line = next(i + 1 for i, text in enumerate(broken.splitlines()) if "%f9" in text)
    assert error.lines == [line]
    assert "%f9" in str(error) and f"{line:5d} |" in str(error)
    assert "ptxas" in error.log


# -- SASS --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def scale_cubin():
    return compile_ptx(SCALE_PTX)


def test_disassemble_lists_offsets_and_encodings(scale_cubin):
    instructions = disassemble(scale_cubin)
    assert {i.function for i in instructions} == {"scale"}
    offsets = [i.offset for i in instructions]
    assert offsets == list(range(0, 16 * len(offsets), 16))
    assert all(0 <= i.encoding < 1 << 128 for i in instructions)
    assert any(i.encoding >> 64 for i in instructions)  # the high word is really there
    # The encoding is the 16 bytes stored in the cubin (first hex word = low 64 bits).
    for i in instructions:
        assert read_instruction(scale_cubin, "scale", i.offset) == i.encoding
    counts = opcode_counts(instructions)
    assert counts["EXIT"] >= 1 and counts["FMUL"] == 1 and counts["LDG"] == 1 and counts["STG"] == 1
    assert disassemble(scale_cubin.image, function="scale") == instructions
    with pytest.raises(KeyError):
        disassemble(scale_cubin, function="nope")


def test_patch_round_trip_is_identity(scale_cubin):
    for i in disassemble(scale_cubin)[:8]:
        assert patch_instruction(scale_cubin, "scale", i.offset, i.encoding) == scale_cubin.image


def test_patch_a_bit_shows_in_disassembly(scale_cubin):
    # "LDC R1, c[0x0][0x28]" (the stack pointer set-up): bits 16..23 hold the destination register.
    first = disassemble(scale_cubin)[0]
    assert first.text.startswith("LDC R1,")
    patched = patch_instruction(scale_cubin, "scale", first.offset, first.encoding ^ (1 << 17))
    assert len(patched) == len(scale_cubin.image)
    changed = disassemble(patched)[0]
    assert changed.encoding == first.encoding ^ (1 << 17)
    assert changed.text.startswith("LDC R3,")
    rest_before = [i.encoding for i in disassemble(scale_cubin)[1:]]
    assert [i.encoding for i in disassemble(patched)[1:]] == rest_before


def test_patch_rejects_bad_targets(scale_cubin):
    encoding = disassemble(scale_cubin)[0].encoding
    with pytest.raises(KeyError, match="scale"):
        patch_instruction(scale_cubin, "missing", 0, encoding)
    with pytest.raises(ValueError):
        patch_instruction(scale_cubin, "scale", 8, encoding)
    with pytest.raises(ValueError):
        patch_instruction(scale_cubin, "scale", 1 << 20, encoding)
    with pytest.raises(ValueError):
        patch_instruction(b"not an elf" * 10, "scale", 0, encoding)


# -- TMA argument checks (no GPU: they fail before the driver is called) ----------------------------
from ptx.tensor_maps import TensorMap, tensor_map_2d, validate_2d  # noqa: E402

GOOD = dict(ptr=0x7F0000000000, dtype=np.uint8, shape=(256, 512), row_stride_bytes=512, box=(64, 128), swizzle=128)


def test_tma_validation_accepts_a_good_map():
    dtype, shape, box = validate_2d(**GOOD)
    assert dtype == np.uint8 and shape == (256, 512) and box == (64, 128)
    validate_2d(**{**GOOD, "dtype": "bfloat16", "row_stride_bytes": 1024, "box": (64, 64)})
    validate_2d(**{**GOOD, "dtype": np.float32, "row_stride_bytes": 2048, "box": (64, 32), "oob_fill_nan": True})
    validate_2d(**{**GOOD, "box": (256, 256), "swizzle": 0})


@pytest.mark.parametrize("change, message", [
    (dict(ptr=0x7F0000000008), "16-byte aligned"),
    (dict(ptr=0), "positive device address"),
    (dict(row_stride_bytes=520), "multiple of 16"),
    (dict(row_stride_bytes=256), "smaller than a row"),
    (dict(box=(257, 128)), "box rows must be in 1..256"),
    (dict(box=(64, 0)), "box cols must be in 1..256"),
    (dict(box=(64, 8)), "multiple of 16 bytes"),
    (dict(swizzle=64), "at most 64 bytes"),
    (dict(dtype=np.uint16, row_stride_bytes=1024, box=(64, 128)), "at most 128 bytes"),
    (dict(swizzle=96), "swizzle must be 0, 32, 64 or 128"),
    (dict(dtype=np.float64), "unsupported dtype"),
    (dict(oob_fill_nan=True), "floating-point"),
    (dict(shape=(0, 512)), "shape must be positive"),
])
def test_tma_validation_errors(change, message):
    with pytest.raises((ValueError, TypeError), match=message):
        tensor_map_2d(**{**GOOD, **change})


def test_tensor_map_is_128_bytes():
    with pytest.raises(ValueError, match="128 bytes"):
        TensorMap(b"\0" * 64, np.dtype(np.uint8), (1, 16), (1, 16), 0)


# -- kernel arguments (packed on the CPU; launched on the GPU) ---------------------------------------
def test_runtime_imports_without_a_gpu():
    result = subprocess.run([sys.executable, "-c", "import ptx.runtime, ptx.tensor_maps, ptx.sass, ptx.compile"],
                            env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_params_come_from_the_builder_and_are_packed_by_type():
    from ptx.runtime import kernel_params, pack_args
    k = KernelBuilder("scale", params=[("u64", "data"), ("tmap", "tmap"), ("f32", "factor"), ("u32", "count")])
    params = kernel_params(module([k]), "scale")
    assert params == [("u64", 0), ("b8", 128), ("f32", 0), ("u32", 0)]
    with pytest.raises(KeyError, match="no .entry other"):
        kernel_params(module([k]), "other")
    with pytest.raises(TypeError, match="plain text"):
        kernel_params(str(module([k])), "scale")
    tensor_map = TensorMap(bytes(range(128)), np.dtype(np.uint8), (1, 16), (1, 16), 0)
    storage, pointers = pack_args(params, [0x1234, tensor_map, 2.5, 7])
    assert [ctypes.sizeof(s) for s in storage] == [8, 128, 4, 4]
    assert storage[0].value == 0x1234 and bytes(storage[1]) == bytes(range(128))
    assert storage[2].value == 2.5 and storage[3].value == 7
    assert [pointers[i] for i in range(4)] == [ctypes.addressof(s) for s in storage]
    with pytest.raises(TypeError, match="takes 4 arguments, got 3"):
        pack_args(params, [0x1234, tensor_map, 2.5])
    with pytest.raises(TypeError, match="host memory"):
        pack_args(params, [np.zeros(4), tensor_map, 2.5, 7])
    with pytest.raises(TypeError, match="128 bytes"):
        pack_args(params, [0x1234, b"short", 2.5, 7])


def test_launch_shapes_are_checked():
    from ptx.runtime import _dims, stream_handle
    assert _dims(5, "grid") == (5, 1, 1) and _dims((2, 3), "grid") == (2, 3, 1)
    with pytest.raises(ValueError):
        _dims((0, 1), "grid")
    assert stream_handle(None) == 0 and stream_handle(1234) == 1234
    with pytest.raises(TypeError):
        stream_handle("default")


def _types_accepted(call):
    """Without a driver, cuda.bindings converts every argument and then fails to dlopen libcuda: a TypeError
    here means our Python values are not what the binding wants (which a GPU run would only find later)."""
    try:
        call()
    except TypeError as error:
        pytest.fail(f"cuda.bindings rejected an argument type: {error}")
    except RuntimeError:
        pass


def _driver_library_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


# A driver with no visible GPU (CUDA_VISIBLE_DEVICES=) is not enough: the calls would run on null handles and crash.
@pytest.mark.skipif(has_gpu() or _driver_library_present(),
                    reason="no-driver check (with a driver these calls would run on null handles)")
def test_driver_calls_accept_our_argument_types(scale_cubin):
    from cuda.bindings import driver
    from ptx.runtime import kernel_params, launch_config, pack_args
    from ptx.tensor_maps import _data_type, _encode
    config = launch_config((4, 2), (128, 1), shared_bytes=200 * 1024, cluster=(2, 1), stream=5)
    assert (config.gridDimX, config.gridDimY, config.blockDimX, config.sharedMemBytes) == (4, 2, 128, 200 * 1024)
    assert config.numAttrs == 1 and config.attrs[0].value.clusterDim.x == 2
    with pytest.raises(ValueError, match="multiple of the cluster"):
        launch_config(3, 128, cluster=2)
    storage, pointers = pack_args(kernel_params(SCALE_PTX, "scale"), [0x1000, 2.0, 5])
    _types_accepted(lambda: driver.cuLaunchKernelEx(config, driver.CUfunction(0), ctypes.addressof(pointers), 0))
    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    _types_accepted(lambda: driver.cuFuncSetAttribute(driver.CUfunction(0), attribute, 200 * 1024))
    _types_accepted(lambda: driver.cuKernelGetFunction(driver.CUkernel(0)))
    _types_accepted(lambda: driver.cuLibraryLoadData(scale_cubin.image, None, None, 0, None, None, 0))
    _types_accepted(lambda: driver.cuLibraryGetKernel(driver.CUlibrary(0), b"scale"))
    for swizzle, fill in [(0, False), (128, True)]:
        dtype = np.dtype(np.float32)
        _types_accepted(lambda: _encode(_data_type(dtype), 0x7F0000000000, (64, 256), 1024, (32, 32),
                                        swizzle, fill))


# -- on the GPU: the smoke items, one test each ------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name, item", SMOKE_ITEMS, ids=[n for n, _ in SMOKE_ITEMS])
def test_runtime_on_gpu(name, item):
    detail = item()
    print(f"{name}: {detail}")


def test_argument_packer_writes_what_pack_args_writes():
    """The per-kernel packer (buffers reused between launches) lays out the same bytes as pack_args, call after
    call with new values."""
    import ctypes

    from ptx.runtime import ArgumentPacker, pack_args
    from ptx.tensor_maps import TensorMap
    params = [("b8", 128), ("b8", 128), ("u64", 0), ("u32", 0), ("f32", 0)]
    packer = ArgumentPacker(params)
    for seed in range(3):
        maps = [TensorMap(bytes((seed + i + j) % 256 for j in range(128)), np.dtype(np.uint8), (1, 1), (1, 1), 0)
                for i in range(2)]
        args = [*maps, 0x7000_0000_0000 + seed, 64 + seed, 0.5 + seed]
        storage, reference = pack_args(params, args)
        packed = packer.pack(args)
        for i, (kind, length) in enumerate(params):
            size = length or ctypes.sizeof(ctypes.c_uint64 if kind == "u64" else ctypes.c_uint32)
            assert ctypes.string_at(packed[i], size) == ctypes.string_at(reference[i], size), (seed, i)
    with pytest.raises(TypeError, match="takes 5 arguments"):
        packer.pack(args[:-1])
