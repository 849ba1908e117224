"""Stage 10's FFMA interleave pass (ptx/passes.py): bit helpers by hand, then real kernels, CPU only.

The two kernels are the cases the reference measured with ptxas 13.0: a 384-thread CTA (ptxas already
alternates yield/no-reuse) and a 256-thread CTA (no yields at all).
"""
import subprocess
import tempfile
from pathlib import Path

import pytest

from gemm.heuristics import H100, choose_config
from gemm.kernel import KernelConfig, generate
from ptx.compile import compile_ptx
from ptx.passes import (ENV_VAR, FLIP_MASK, PatchVerificationError, choose_flips, count_yielding_ffma, ffma_runs,
                        flipped_encoding, interleave_ffma, is_yield, pass_from_environment, reuse_b,
                        second_source_register, verify_patch)
from ptx.sass import Instruction, disassemble, nvdisasm_path, parse_listing, patch_instructions

# ptxas's promotion FFMA "FFMA R8, R25, R207.reuse, R8": high word 0x080fe2...: byte 0x08 = bit 59 (reuse b);
# digit 11 from the right is 0xe = 0b1110, so bit 45 (no-yield) is 1. Its yielding neighbours read 0x000fc2...
NO_YIELD_REUSE_HIGH = 0x080FE20000000008
YIELD_HIGH = 0x000FC20000000008
LOW = 0x0000_00CF_1908_7223  # any low word: the pass must never touch it


def ffma(offset, rb, reuse, yields=False, function="k"):
    high = 0x000FC20000000000 | (1 << 59 if reuse else 0) | (0 if yields else 1 << 45)
    text = f"FFMA R{offset // 16}, R1, {rb}{'.reuse' if reuse else ''}, R0"
    return Instruction(function, offset, text, "FFMA", LOW | high << 64)


def test_bits_worked_by_hand():
    assert FLIP_MASK == 0x0800200000000000
    reusing = LOW | NO_YIELD_REUSE_HIGH << 64
    assert reuse_b(reusing) and not is_yield(reusing)
    assert flipped_encoding(reusing) == LOW | YIELD_HIGH << 64  # == DeepGEMM's XOR here
    assert is_yield(LOW | YIELD_HIGH << 64) and not reuse_b(LOW | YIELD_HIGH << 64)
    assert not is_yield(1 << (64 + 45)) and is_yield(0) and reuse_b(1 << (64 + 59)) and not reuse_b(1 << 59)
    assert flipped_encoding(LOW | YIELD_HIGH << 64) == LOW | YIELD_HIGH << 64  # already yielding: unchanged


@pytest.mark.parametrize("text, rb", [
    ("FFMA R8, R25, R207.reuse, R8", "R207"), ("@!P0 FFMA.FTZ R1, R2, -R3, R4", "R3"),
    ("FFMA R1, R2, RZ, R4", "RZ"), ("FFMA R1, R2, 0.5, R4", None), ("FFMA R1, R2, c[0x0][0x10], R4", None),
    ("FFMA R1, R2, R3", None), ("IADD3 R4, P1, R2, 0x30, RZ", None)])
def test_second_source_register(text, rb):
    assert second_source_register(text) == rb


def test_runs_and_counts_synthetic():
    run = [ffma(16 * k, "R4", reuse=True, yields=k == 3) for k in range(8)]
    other = Instruction("k", 128, "IADD3 R4, P1, R2, 0x30, RZ", "IADD3", 0)
    gap = [ffma(16 * k, "R4", True) for k in range(9, 17)]  # no instruction at 0x80 (128): offsets not consecutive
    assert count_yielding_ffma(run + [other]) == (1, 8)
    assert [len(r) for r in ffma_runs(run + [other] + gap)] == [8, 8]
    assert ffma_runs(run + gap) == [run, gap]
    assert ffma_runs(run[:7]) == [] and ffma_runs(run[:7], min_run=7) == [run[:7]]
    moved = run[:4] + [ffma(i.offset, "R4", True, function="j") for i in run[4:]]
    assert ffma_runs(moved, min_run=4) == [run[:4], moved[4:]]  # a new function starts a new run


def test_rules_synthetic():
    # 8 FFMAs on R4 then 8 on R5, all with reuse: the head is 16*9//16 = 9 FFMAs (0..8). R4: 0 is new (flip),
    # 1 follows a flipped one (keep), 2 follows a kept one with the same Rb (flip) ...; 8 is the first R5.
    run = [ffma(16 * k, "R4" if k < 8 else "R5", reuse=True) for k in range(16)]
    assert [i.offset // 16 for i in choose_flips(run, "deepgemm")] == [0, 2, 4, 6, 8]
    assert [i.offset // 16 for i in choose_flips(run, "every_other")] == list(range(0, 16, 2))
    # ptxas's >8-warp pattern (yield without reuse, then reuse on an Rb seen): DeepGEMM flips nothing.
    ptxas = [ffma(16 * k, "R4", reuse=k % 2 == 1, yields=k % 2 == 0) for k in range(16)]
    assert choose_flips(ptxas, "deepgemm") == []
    assert [i.offset // 16 for i in choose_flips(ptxas, "every_other")] == [1, 5, 9, 13]
    with pytest.raises(ValueError):
        choose_flips(run, "sometimes")


@pytest.fixture(scope="module")
def kernels():
    """{threads: (cubin, listing)} for the 384-thread default config and a 256-thread BLOCK_M=64 one."""
    configs = {384: choose_config(4096, 4096, 7168, H100), 256: KernelConfig(block_m=64, block_n=128, stages=4)}
    result = {}
    for threads, config in configs.items():
        cubin = compile_ptx(generate(config, 4096, 7168))
        result[threads] = (cubin, disassemble(cubin))
    return result


def test_counts_on_real_kernels(kernels):
    for threads, (_, listing) in kernels.items():
        runs = ffma_runs(listing)
        yielding, total = count_yielding_ffma(listing)
        assert runs and all(len(r) >= 8 and all(i.opcode == "FFMA" for i in r) for r in runs)
        assert sum(map(len, runs)) <= total and 0 <= yielding <= total
    # The reference's ptxas 13.0 facts: yields only for CTAs of more than 8 warps.
    assert count_yielding_ffma(kernels[384][1])[0] > 0
    assert count_yielding_ffma(kernels[256][1])[0] == 0


def _nvdisasm_cleanly(image: bytes) -> list[Instruction]:
    """The listing, after checking that nvdisasm exits 0 and prints nothing on stderr."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "k.cubin"
        path.write_bytes(image)
        done = subprocess.run([nvdisasm_path(), "-hex", "-c", str(path)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr.strip() == ""
    return parse_listing(done.stdout)


@pytest.mark.parametrize("threads", [384, 256])
def test_every_other_flips_exactly_the_intended_bits(kernels, threads):
    cubin, before = kernels[threads]
    image, report = interleave_ffma(cubin, rule="every_other", listing=before)
    after = _nvdisasm_cleanly(image)
    # The rule recomputed here from the helpers alone: every other Rb-reuse FFMA of each run.
    intended = {(i.function, i.offset) for run in ffma_runs(before)
                for i in [i for i in run if reuse_b(i.encoding)][::2]}
    assert intended and set(report.flipped_offsets) == intended and report.flipped == len(intended)
    assert len(after) == len(before) and [i.opcode for i in after] == [i.opcode for i in before]
    for old, new in zip(before, after):
        assert (old.function, old.offset) == (new.function, new.offset)
        if (old.function, old.offset) in intended:
            assert reuse_b(old.encoding) and not is_yield(old.encoding)
            assert not reuse_b(new.encoding) and is_yield(new.encoding)
            assert old.encoding ^ new.encoding == FLIP_MASK << 64
            assert ".reuse" not in new.text.split(",")[2] and new.text == old.text.replace(".reuse", "", 1)
        else:
            assert new.encoding == old.encoding and new.text == old.text
    assert report.yielding_after == report.yielding_before + report.flipped
    assert (report.yielding_after, report.ffma_total) == count_yielding_ffma(after)
    assert cubin.image != image  # a copy was patched, not the caller's cubin


@pytest.mark.parametrize("threads", [384, 256])
def test_deepgemm_report_is_consistent(kernels, threads):
    cubin, before = kernels[threads]
    image, report = interleave_ffma(cubin, kernel="fp8_gemm", rule="deepgemm", listing=before)
    runs = ffma_runs(before)
    assert report.runs == len(runs) and report.ffma_in_runs == sum(map(len, runs))
    assert (report.yielding_before, report.ffma_total) == count_yielding_ffma(before)
    assert report.flipped == len(report.flipped_offsets) == report.yielding_after - report.yielding_before
    heads = {(i.function, i.offset) for run in runs for i in run[:len(run) * 9 // 16]}
    assert set(report.flipped_offsets) <= heads  # only the first 9/16 of each run
    if threads == 256:  # no ptxas yields: chains of R4 then R5 on all FFMAs, so the rule has work to do
        assert report.flipped > 0
    again, second = interleave_ffma(image, rule="deepgemm")
    assert second.flipped == 0 and again == image  # the rule is idempotent


def test_verification_catches_a_corrupted_patch(kernels):
    cubin, before = kernels[256]
    run = ffma_runs(before)[0]
    patches = {(i.function, i.offset): flipped_encoding(i.encoding) for i in choose_flips(run, "every_other")}
    good = patch_instructions(cubin, patches)
    assert len(verify_patch(cubin.image, good, patches, before=before)) == len(before)
    victim = next(i for i in before if i.opcode not in ("FFMA", "NOP"))
    corrupted = patch_instructions(good, {(victim.function, victim.offset): victim.encoding ^ 1 << (64 + 45)})
    with pytest.raises(PatchVerificationError, match=f"{victim.offset:#x}"):
        verify_patch(cubin.image, corrupted, patches, before=before)
    with pytest.raises(PatchVerificationError):  # an intended patch that did not land
        verify_patch(cubin.image, cubin.image, patches, before=before)
    with pytest.raises(PatchVerificationError, match="file offset"):  # bytes outside .text count too
        verify_patch(cubin.image, good + b"\0" * 16, patches, before=before)


def test_environment_switch():
    assert pass_from_environment({}) is None
    for off in ("off", "0", "", "OFF", "none"):
        assert pass_from_environment({ENV_VAR: off}) is None
    assert pass_from_environment({ENV_VAR: "deepgemm"}) == "deepgemm"
    assert pass_from_environment({ENV_VAR: " Every_Other "}) == "every_other"
    with pytest.raises(ValueError):
        pass_from_environment({ENV_VAR: "yes"})
