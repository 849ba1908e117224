"""Each kind of attempt to pass without doing the exercise (issue 19's list), against the real grader on CPU.

The target is exercise 05 (one value hole, ``descriptor_bits``; graded in about a second): an attempt passes only if
it makes the judge accept a descriptor it did not compute. Every attempt below either changes nothing the judge
sees (it runs in the sandboxed oracle, not in the judge), finds the answer stripped from the sandbox's copy of the
project, or is refused by the sandbox, and the report says FAILED. The honest solution, written from the prompt,
passes; it is here only as the control of the same harness (the course's honest solutions stay out of the
repository).
"""
from __future__ import annotations

import hashlib
import os
import textwrap
from pathlib import Path

import pytest

from lessons.grading import grader
from lessons.grading.sandbox import Oracle

ROOT = Path(__file__).resolve().parent.parent
UNFILLED = '''
def descriptor_bits(start_address, leading_byte_offset, stride_byte_offset, swizzle=128):
    raise NotImplementedError("fill in")
'''


def run(tmp_path, source: str, stage: int = 5, **kwargs) -> dict:
    path = tmp_path / "attempt.py"
    path.write_text(textwrap.dedent(source).replace("ROOT", str(ROOT)))
    return grader.grade(stage, path, mode="cpu", seeds=1, secret="", **kwargs)


def failed_details(report) -> str:
    return " | ".join(c["detail"] for c in report["checks"] if c["graded"] and not c["passed"])


def test_the_control_an_honest_descriptor_passes(tmp_path):
    report = run(tmp_path, '''
        def descriptor_bits(start_address, leading_byte_offset, stride_byte_offset, swizzle=128):
            mode = {0: 0, 128: 1, 64: 2, 32: 3}[swizzle]
            field = lambda value: (value >> 4) & 0x3FFF
            return (field(start_address) | field(leading_byte_offset) << 16 | field(stride_byte_offset) << 32
                    | mode << 62)
    ''')
    assert report["passed"], grader.summary(report)


# ------------------------------------------------------------------------------- tampering with the judge
@pytest.mark.parametrize("tamper", [
    "import __main__\n__main__.judge = lambda *a, **k: {'correct': True, 'why': 'forged'}\n",
    "import json\njson.dumps = lambda *a, **k: '{\"id\": 1, \"ok\": {\"descriptor_bits\": true}}'\n",
    "import gemm.fp8\ngemm.fp8.calc_diff = lambda *a, **k: 0.0\n",
    "import sys\nfor m in list(sys.modules.values()):\n    if hasattr(m, 'judge'):\n        m.judge = lambda *a: None\n",
])
def test_patching_the_judge_changes_nothing(tmp_path, tamper):
    """`import __main__` and patching json, calc_diff or the judge's functions reach only the oracle's process."""
    report = run(tmp_path, tamper + UNFILLED)
    assert not report["passed"] and report["score"]["points"] == 0, grader.summary(report)


def test_reading_the_judges_frames_finds_nothing(tmp_path):
    """No nonce, pipe or expected output exists in the oracle to read off a stack frame or the garbage collector."""
    report = run(tmp_path, '''
        import gc, inspect
        found = [o for o in gc.get_objects() if isinstance(o, dict) and ("expected" in o or "nonce" in o)]
        found += [f.frame.f_locals for f in inspect.stack() if "expected" in f.frame.f_locals]

        def descriptor_bits(start_address, leading_byte_offset, stride_byte_offset, swizzle=128):
            for scope in found:
                value = scope.get("expected")
                if isinstance(value, int):
                    return value
            return 0
    ''')
    assert not report["passed"], grader.summary(report)


# ------------------------------------------------------------------------------- the answer out of reach
@pytest.mark.parametrize("reach", [
    "import runpy\n_own = runpy.run_module('ptx.vocab.wgmma')['descriptor_bits']\n",
    "import runpy\n_own = runpy.run_path('ROOT/ptx/vocab/wgmma.py')['descriptor_bits']\n",
    "import ptx.vocab.wgmma as w\n_own = getattr(w, 'descriptor_' + 'bits')\n",
    "import importlib\n_own = importlib.import_module('lessons.exercises.ex05_descriptor').reference().descriptor_bits\n",
    "import lessons\n_own = lessons.stage(5).descriptor_bits\n",
    "_ns = {}\nexec(open('ROOT/ptx/vocab/wgmma.py').read(), _ns)\n_own = _ns['descriptor_bits']\n",
    "import sys\nsys.path.insert(0, 'ROOT')\nfrom ptx.vocab.wgmma import descriptor_bits as _own\n",
])
def test_every_path_to_the_stages_own_answer_leads_to_a_hole(tmp_path, reach):
    """runpy, getattr, importlib, exec and sys.path games: the sandbox's copy has the answer stripped, and the real
    repository cannot be read from the sandbox."""
    report = run(tmp_path, '''
        try:
    ''' + textwrap.indent(reach, "    ") + '''
        except BaseException as error:  # an attempt that is refused is still no answer
            _own = None

        def descriptor_bits(start_address, leading_byte_offset, stride_byte_offset, swizzle=128):
            if _own is None:
                return 0
            return _own(start_address, leading_byte_offset, stride_byte_offset, swizzle)
    ''')
    assert not report["passed"], grader.summary(report)


def test_a_verbatim_copy_with_other_names_is_flagged(tmp_path):
    source = (ROOT / "ptx" / "vocab" / "wgmma.py").read_text()
    from lessons.grading.copies import functions_in
    import ast
    copied = ast.unparse(functions_in(source)["descriptor_bits"])
    for old, new in (("start_address", "s"), ("leading_byte_offset", "lbo"), ("stride_byte_offset", "sbo")):
        copied = copied.replace(old, new)
    report = run(tmp_path, copied + "\n")
    check = next(c for c in report["checks"] if c["name"] == "own work (not a copy)")
    assert not check["passed"] and check["copied"] == ["descriptor_bits"] and not report["passed"]
    allowed = run(tmp_path, copied + "\n", allow_copies=True)
    check = next(c for c in allowed["checks"] if c["name"] == "own work (not a copy)")
    assert not check["graded"] and "allowed by the instructor" in check["detail"]


# ------------------------------------------------------------------------------- the environment
def test_the_grader_on_disk_cannot_be_edited(tmp_path):
    target = ROOT / "lessons" / "grading" / "judge.py"
    before = hashlib.sha256(target.read_bytes()).hexdigest()
    report = run(tmp_path, f"open({str(target)!r}, 'a').write('# PASSED for everyone')\n" + UNFILLED)
    assert hashlib.sha256(target.read_bytes()).hexdigest() == before
    assert "refuses writing" in failed_details(report), grader.summary(report)


@pytest.mark.parametrize("start", [
    "import os\nif os.fork() == 0:\n    import time\n    time.sleep(3600)\n",
    "import subprocess\nsubprocess.Popen(['sleep', '3600'])\n",
    "import os\nos.system('sleep 3600 &')\n",
    "import multiprocessing\n",
    "import ctypes\nctypes.CDLL(None).system(b'sleep 3600 &')\n",
    "import numpy\nnumpy.ctypeslib.ctypes.CDLL(None).system(b'sleep 3600 &')\n",
])
def test_no_process_is_started(tmp_path, start):
    report = run(tmp_path, start + UNFILLED)
    assert not report["passed"] and "the grading sandbox refuses" in failed_details(report), grader.summary(report)


def test_nothing_outlives_grading(tmp_path):
    """A thread spinning forever in the solution dies with the oracle's process group when grading ends."""
    path = tmp_path / "spinner.py"
    path.write_text("import threading\nthreading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=False)"
                    ".start()\n" + UNFILLED)
    from lessons.exercises import exercise
    oracle = Oracle(path, exercise(5))
    assert oracle.defined_holes() == {"descriptor_bits": True}
    pid = oracle.process.pid
    oracle.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not oracle.temp.exists()


def test_other_students_files_cannot_be_read(tmp_path):
    """A class graded in parallel: each oracle's files live in a private temporary folder the others cannot read."""
    from lessons.exercises import exercise
    neighbour = tmp_path / "neighbour.py"
    neighbour.write_text("def descriptor_bits(a, b, c, d=128):\n    return 42\n")
    with Oracle(neighbour, exercise(5)) as other:
        spy = tmp_path / "spy.py"
        spy.write_text(f'''
import glob
def descriptor_bits(a, b, c, d=128):
    try:
        return len(open(glob.glob({str(other.temp)!r} + "/work/*.py")[0]).read())
    except Exception as error:
        return type(error).__name__
''')
        with Oracle(spy, exercise(5)) as oracle:
            answer = oracle.solution().descriptor_bits(0, 16, 1024, 128)
    assert not isinstance(answer, int), answer


def test_an_expression_that_explodes_is_refused(tmp_path):
    """Squaring forty times makes a tree of 2^40 leaves (shared in memory, not in JSON): the answer is refused,
    and the judge neither hangs nor runs out of memory."""
    path = tmp_path / "bomb.py"
    path.write_text("def promote(total, partial, sa_value, sb_value):\n    x = partial\n    for _ in range(40):\n"
                    "        x = x * x\n    return total + x\n")
    report = grader.grade(1, path, mode="cpu", seeds=1, secret="", timeout=120)
    assert not report["passed"], grader.summary(report)


# ------------------------------------------------------------------------------- the red team's routes (session 19)
@pytest.mark.parametrize("route, refusal", [
    # a directory descriptor and a path relative to it: the audit event shows only the relative path
    # (refused as a read since only the system's directories are readable; as a directory descriptor before that)
    ("import os\n_d = os.open('/', os.O_RDONLY)\n_own = os.open('work/main/ptx/vocab/wgmma.py', os.O_RDONLY, dir_fd=_d)\n",
     "refuses reading /"),
    ("import os\n_own = open('../../../../work/main/ptx/vocab/wgmma.py').read()\n", "no '..'"),
    # other processes: the parent's environment holds the grader's secret, the judge's memory its nonce
    ("import os\n_own = open(f'/proc/{os.getppid()}/environ', 'rb').read()\n", "refuses reading /proc/"),
    ("import os\n_own = open(f'/proc/{os.getppid()}/mem', 'rb')\n", "refuses reading /proc/"),
    ("import os, resource\nresource.prlimit(os.getppid(), resource.RLIMIT_CPU, (1, 1))\n", "another process's limits"),
    ("import resource\nresource.setrlimit(resource.RLIMIT_CPU, (10**6, 10**6))\n", "changing its limits"),
    ("import sqlite3\nsqlite3.connect('/tmp/fp8_redteam.db')\n", "databases outside the working directory"),
    # the second red team: a rename's destination, links, /proc listing, a site-packages directory descriptor
    ("import os\nopen('x.txt', 'w').write('')\nos.rename('x.txt', '/tmp/fp8_redteam_renamed.py')\n",
     "refuses os.rename on /tmp"),
    # the fifth: code written as text, renamed to a module in the working directory (then importable)
    ("import os\nopen('x.txt', 'w').write('')\nos.rename('x.txt', 'x.py')\n", "a file Python can import or run"),
    ("open('x.py', 'w').write('')\n", "code written at run time"),
    ("import os\nos.symlink('/work', 'w')\n", "refuses os.symlink"),
    ("import os\nopen('x', 'w').write('')\nos.link('x', '/tmp/fp8_redteam_link')\n", "refuses os.link"),
    ("import os\n_own = os.listdir('/proc')\n", "refuses os.listdir on /proc"),
    ("import os, numpy\n_d = os.open(os.path.dirname(numpy.__file__), os.O_RDONLY)\n",
     "refuses opening the directory"),
    ("import os\n_d = os.open('.', os.O_RDONLY)\nos.rename('a', 'b', src_dir_fd=_d)\n", "directory descriptor"),
    # a raw disk holds the repository's bytes under no path the hook knows
    ("import glob\n_own = [open(d, 'rb').read(64) for d in sorted(glob.glob('/dev/[sv]d?') + glob.glob('/dev/nvme*'))"
     " + ['/dev/mem']]\n", "/dev/"),
])
def test_the_red_teams_routes_out_are_refused(tmp_path, route, refusal):
    report = run(tmp_path, route + UNFILLED)
    assert not report["passed"] and refusal in failed_details(report), grader.summary(report)
    assert not Path("/tmp/fp8_redteam.db").exists() and not Path("/tmp/fp8_redteam_renamed.py").exists()
    assert not Path("/tmp/fp8_redteam_link").exists()


def test_a_doubled_or_failed_judge_answer_is_an_integrity_failure(tmp_path, monkeypatch):
    """The parent takes exactly one framed answer from a judge that ended well: a second (forged) block, or a judge
    that was killed after printing, is a failed check with a reason, never a traceback or a PASSED."""
    import subprocess as real_subprocess
    path = tmp_path / "any.py"
    path.write_text(UNFILLED)

    def forged(returncode, blocks):
        def fake_run(command, input, **kwargs):
            nonce = __import__("json").loads(input)["nonce"]
            body = "".join(nonce + '{"checks": [], "exercise": "forged"}' + nonce for _ in range(blocks))
            return real_subprocess.CompletedProcess(command, returncode, body, "")
        return fake_run

    for returncode, blocks in ((0, 2), (-9, 1), (0, 0)):
        monkeypatch.setattr(grader.subprocess, "run", forged(returncode, blocks))
        report = grader.grade(5, path, mode="cpu", seeds=1, secret="")
        check = next(c for c in report["checks"] if c["name"] == "child process")
        assert not report["passed"] and not check["passed"], (returncode, blocks, check)


def test_a_copy_hidden_in_a_helper_is_flagged_and_an_honest_one_liner_is_not(tmp_path):
    """The hole calls the stage's own rule pasted in as a helper: every function is compared, not only holes. A
    short hole (here exercise 01's promotion) has one natural way to be written: it is not compared at all."""
    import ast
    from lessons.grading.copies import functions_in
    helper = ast.unparse(functions_in((ROOT / "ptx" / "passes.py").read_text())["_select_deepgemm"])
    source = ("from __future__ import annotations\nfrom ptx.passes import reuse_b, second_source_register\n\n"
              + helper.replace("_select_deepgemm", "my_rule") + "\n\n\ndef select_flips(run):\n    return my_rule(run)\n")
    report = run(tmp_path, source, stage=10)
    check = next(c for c in report["checks"] if c["name"] == "own work (not a copy)")
    assert not check["passed"] and check["copied"] == ["my_rule"] and not report["passed"]
    honest = run(tmp_path, "def promote(total, partial, sa_value, sb_value):\n"
                           "    return total + partial * (sa_value * sb_value)\n", stage=1)
    assert honest["passed"], grader.summary(honest)


def test_a_lightly_disguised_copy_is_still_a_copy_and_independent_code_is_not(tmp_path):
    """The stage's tile_coords with renamed names, one commutative product swapped and a no-op added is a copy (same
    canonical statements); the same function written independently, with other statements, is not."""
    import ast
    from lessons.grading.copies import functions_in
    own = ast.unparse(functions_in((ROOT / "gemm" / "kernel" / "tile_scheduler.py").read_text())["tile_coords"])
    disguised = (own.replace("raster_group", "rg").replace("group * rg", "rg * group")
                 .replace("width = ", "unused = 0\n    width = "))
    assert disguised != own
    report = run(tmp_path, disguised + "\n", stage=8)
    check = next(c for c in report["checks"] if c["name"] == "own work (not a copy)")
    assert not check["passed"] and check["copied"] == ["tile_coords"]
    independent = run(tmp_path, '''
        def tile_coords(tile, m_blocks, n_blocks, raster_group):
            if raster_group == 0:
                return tile // n_blocks, tile % n_blocks
            per_group = raster_group * m_blocks
            g = tile // per_group
            start = g * raster_group
            w = min(raster_group, n_blocks - start)
            r = tile - g * per_group
            return r // w, start + r % w
    ''', stage=8)
    assert independent["passed"], grader.summary(independent)


COPY_WITH_HELPER = """
def lead_share(r, s, kb, ld=0):
    if not ld:
        return r * kb // s, (r + 1) * kb // s
    fe = _end(s, kb, ld)
    rem, p = kb - fe, s - 1
    if r == 0:
        return 0, fe
    return fe + (r - 1) * rem // p, fe + r * rem // p


def _end(s, kb, ld):
    return max(1, min(kb // s + ld, kb - (s - 1)))
"""


PADDINGS = {  # a second review's paddings of the same copy (2026-11-29): each changes nothing the function returns
    "dead stores added": "    junk = 0\n    junk2 = 1\n",
    "augmented dead stores": "    junk = 0\n    junk += 1\n    junk += 2\n",
    "a chain of dead stores": "    a = 0\n    b = a\n    c = 1\n    d = c\n",
    "bare expressions": "    0 + 0\n    1 + 1\n",
    "asserts": "    assert True\n    assert 1\n",
    "an if on a constant": "    if False:\n        r = 0\n",
    "attributes of a global": "    lead_share.x = 0\n    lead_share.y = 1\n",
}


@pytest.mark.parametrize("disguise", ["helper renamed", "helper inlined", *PADDINGS])
def test_a_copy_of_k_share_is_a_copy_however_its_helper_is_hidden(disguise):
    """The fourth red team (2026-11-29) on exercise 19: k_share copied with its one-line helper under another name,
    pasted into the call, or with unused assignments added, passed as own work (a renamed global call, an inlined
    helper and padding each moved the statements below the similarity bar). Each is a copy now; an honest
    formulation of the same rule is not."""
    from lessons.exercises.ex19_lead_shares import EXERCISE
    from lessons.grading.copies import copied_holes
    source = {"helper renamed": COPY_WITH_HELPER,
              "helper inlined": COPY_WITH_HELPER.replace("fe = _end(s, kb, ld)",
                                                         "fe = max(1, min(kb // s + ld, kb - (s - 1)))"),
              **{name: COPY_WITH_HELPER.replace("    if not ld:", padding + "    if not ld:")
                 for name, padding in PADDINGS.items()}}[disguise]
    assert "lead_share" in copied_holes(source, EXERCISE)
    honest = """
def lead_share(rank, split_k, k_blocks, lead):
    peers = split_k - 1
    if lead == 0:
        return (rank * k_blocks // split_k, (rank + 1) * k_blocks // split_k)
    own = min(k_blocks // split_k + lead, k_blocks - peers)
    if rank == 0:
        return (0, own)
    left = k_blocks - own
    start = own + (rank - 1) * left // peers
    return (start, own + rank * left // peers)
"""
    assert copied_holes(honest, EXERCISE) == []


# ------------------------------------------------- the fifth red team (2026-11-29), on exercise 20
RULE_COPY = """
def _blocks(m, n, sms, tiles_for):
    if not DECODE_MAX_M < m <= PAIR_SPLIT_MAX_M or sms < 2:
        return None
    if tiles_for(sms)[1] > PAIR_SPLIT_MAX_BLOCK_N:
        return None
    halved = tiles_for(sms // 2)
    return halved if 2 * ceil_div(m, halved[0]) * ceil_div(n, halved[1]) <= sms else None


def pair_tiles(m, n, sms, one_wave, half_wave):
    return _blocks(m, n, sms, lambda ctas: one_wave if ctas == sms else half_wave)
"""
NESTED = """
def pair_tiles(m, n, sms, one_wave, half_wave):
    def tiles_for(ctas):
        return one_wave if ctas == sms else half_wave
    if not DECODE_MAX_M < m <= PAIR_SPLIT_MAX_M or sms < 2:
        return None
    if tiles_for(sms)[1] > PAIR_SPLIT_MAX_BLOCK_N:
        return None
    halved = tiles_for(sms // 2)
    return halved if 2 * ceil_div(m, halved[0]) * ceil_div(n, halved[1]) <= sms else None
"""
RULE_DISGUISES = {
    "the adapter a nested def": NESTED,
    "the adapter a lambda, one call of a builtin added": NESTED.replace(
        "    def tiles_for(ctas):\n        return one_wave if ctas == sms else half_wave\n",
        "    tiles_for = lambda ctas: one_wave if ctas == sms else half_wave\n    len(())\n"),
    "two calls of a builtin added": RULE_COPY.replace("        return None\n", "        return None\n    len(())\n"),
    "return None as a bare return": RULE_COPY.replace("        return None\n", "        return\n"),
    "the copy kept in a string": "_SRC = '''" + RULE_COPY + "'''\n",
}


@pytest.mark.parametrize("disguise", RULE_DISGUISES)
def test_a_copy_of_the_pair_rule_is_a_copy_however_it_is_adapted(disguise):
    """The fifth red team: pair_split_blocks copied into exercise 20 passed as own work behind a nested def or a
    lambda adapting its calls, calls of a builtin whose results nothing reads (len(())), a bare return for return
    None, or kept in a string and run with runpy. Each is a copy now."""
    from lessons.exercises.ex20_pair_tiles import EXERCISE
    from lessons.grading.copies import copied_holes
    assert copied_holes(RULE_DISGUISES[disguise], EXERCISE), disguise


HONEST_PAIR_RULES = ["""
def pair_tiles(m, n, sms, one_wave, half_wave):
    if m <= 32 or m > 128 or sms < 2:
        return None
    if one_wave[1] > 32:
        return None
    tiles = -(-m // half_wave[0]) * -(-n // half_wave[1])
    if 2 * tiles > sms:
        return None
    return (half_wave[0], half_wave[1])
""", """
def pair_tiles(m, n, sms, one_wave, half_wave):
    rows, cols = half_wave
    fits = 2 * (-(-m // rows)) * (-(-n // cols)) <= sms
    return tuple(half_wave) if 32 < m <= 128 and sms >= 2 and one_wave[1] <= 32 and fits else None
""", """
import math


def _count(m, n, tile):
    return math.ceil(m / tile[0]) * math.ceil(n / tile[1])


def pair_tiles(m, n, sms, one_wave, half_wave):
    narrow = one_wave[1] <= 32
    between = 32 < m <= 128
    if not (narrow and between) or sms < 2:
        return None
    if 2 * _count(m, n, half_wave) > sms:
        return None
    return (int(half_wave[0]), int(half_wave[1]))
"""]


def test_honest_pair_rules_are_not_copies():
    """Honest solutions to exercise 20 in three styles pass the copy check."""
    from lessons.exercises.ex20_pair_tiles import EXERCISE
    from lessons.grading.copies import copied_holes
    assert all(copied_holes(source, EXERCISE) == [] for source in HONEST_PAIR_RULES)


RUNPY_COPY = '''import os
import runpy

_SRC = """
from gemm.heuristics import DECODE_MAX_M, PAIR_SPLIT_MAX_M, PAIR_SPLIT_MAX_BLOCK_N, ceil_div
''' + RULE_COPY + '''"""
_path = os.path.join(os.getcwd(), "rule_copy.py")
with open(_path, "w") as _f:
    _f.write(_SRC)
_rule = runpy.run_path(_path)["_blocks"]


def pair_tiles(m, n, sms, one_wave, half_wave):
    return _rule(m, n, sms, lambda ctas: one_wave if ctas == sms else half_wave)
'''


def test_code_written_to_a_file_and_run_is_refused(tmp_path):
    """The fifth red team: the copy written to the working directory at run time and run with runpy. runpy is a
    forbidden module, the string's functions are compared, and the sandbox refuses writing a .py file."""
    path = tmp_path / "runpy_copy.py"
    path.write_text(RUNPY_COPY)
    report = grader.grade(20, path, mode="cpu", seeds=1, secret="", timeout=300)
    failed = {c["name"]: c["detail"] for c in report["checks"] if c["passed"] is False}
    assert not report["passed"]
    assert "imports runpy" in failed["no vendor GEMM (source)"], failed
    assert "<string>._blocks" in failed["own work (not a copy)"], failed
    assert "refuses writing" in failed["loads"], failed


UTF7_COPY = (
    b'# -*- coding: utf-7 -*-\n'
    b"# Attack: a UTF-7 coding cookie. The grader's source scans read the file as UTF-8 (every line below is a\n"
    b'# comment there); the sandbox import decodes UTF-7, where a plus-AAo-minus run is a newline: the hidden lines are code:\n'
    b"# production's pair_split_blocks, verbatim.\n"
    b'#+AAo-from gemm.heuristics import DECODE_MAX_M, PAIR_SPLIT_MAX_M, PAIR_SPLIT_MAX_BLOCK_N, ceil_div\n'
    b'#+AAo-\n'
    b'#+AAo-\n'
    b'#+AAo-def pair_split_blocks(m, n, sms, tiles_for):\n'
    b'#+AAo-    if not DECODE_MAX_M < m <= PAIR_SPLIT_MAX_M or sms < 2:\n'
    b'#+AAo-        return None\n'
    b'#+AAo-    if tiles_for(sms)[1] > PAIR_SPLIT_MAX_BLOCK_N:\n'
    b'#+AAo-        return None\n'
    b'#+AAo-    halved = tiles_for(sms // 2)\n'
    b'#+AAo-    return halved if 2 * ceil_div(m, halved[0]) * ceil_div(n, halved[1]) <= sms else None\n'
    b'#+AAo-\n'
    b'#+AAo-\n'
    b'#+AAo-def pair_tiles(m, n, sms, one_wave, half_wave):\n'
    b'#+AAo-    return pair_split_blocks(m, n, sms, lambda ctas: one_wave if ctas == sms else half_wave)\n')


def test_a_file_that_declares_another_encoding_fails(tmp_path):
    """The fifth red team: a file under a UTF-7 coding cookie is all comments to the scans (they read UTF-8) and a
    copy of the rule to Python's import (it decodes UTF-7), which passed every source scan. Any encoding but UTF-8
    fails the source check now."""
    path = tmp_path / "utf7.py"
    path.write_bytes(UTF7_COPY)
    report = grader.grade(20, path, mode="cpu", seeds=1, secret="", timeout=300)
    check = next(c for c in report["checks"] if c["name"] == "no vendor GEMM (source)")
    assert not check["passed"] and "declares the encoding utf-7" in check["detail"], check
    assert not report["passed"]


def test_a_file_the_copy_check_cannot_take_apart_fails_it(tmp_path):
    """The same review: a helper nested past the recursion limit (a sum of 600 zeros) made the copy comparison
    raise, and the grader took that for "no copy" (80/80 with k_share copied). It fails the check now."""
    path = tmp_path / "padded.py"
    path.write_text(COPY_WITH_HELPER + "\n\ndef _pad():\n    return " + " + ".join(["0"] * 600) + "\n")
    report = grader.grade(19, path, mode="cpu", seeds=1, secret="", timeout=300)
    check = next(c for c in report["checks"] if c["name"] == "own work (not a copy)")
    assert not check["passed"] and "could not be compared" in check["detail"], check
    assert not report["passed"]


def test_exercise_13_solutions_may_import_the_library_and_see_tuples(tmp_path):
    """Red-team finds on exercise 13: a solution that imports gemm (whose prebuild used to load multiprocessing,
    which the sandbox refuses) and treats its argument as the tuple it is locally (the judge's JSON made it a list)
    is graded like any other, and the stripped rule cannot be read through the import (if it could, this solution
    would answer wrong and fail)."""
    report = run(tmp_path, '''
        import inspect

        from gemm.kernel.math_warpgroups import PER_THREAD_VALUES, MathWarpgroups

        try:
            LEAK = "warpgroup_offset" in inspect.getsource(MathWarpgroups.warp_uniform_values)
        except Exception:
            LEAK = False


        def warp_uniform(values):
            if LEAK:
                return ()
            return tuple(v for v in values if v == PER_THREAD_VALUES[3]) + values[1:2]
    ''', stage=13)
    assert report["passed"], grader.summary(report)


def test_exercise_14_the_library_s_own_ring_rule_is_stripped(tmp_path):
    """A red-team find: ptx.vocab.barriers.advance has exercise 14's signature and rule (and steps exercise 06's
    pipeline_slot); the sandbox's copy has it stripped, so calling it answers nothing."""
    report = run(tmp_path, '''
        from ptx.vocab.barriers import advance


        def next_full(stage, parity, stages):
            return advance(stage, parity, stages)
    ''', stage=14)
    assert not report["passed"], grader.summary(report)


def test_a_huge_answer_makes_a_short_report():
    from lessons.grading.rubric import DETAIL_LIMIT, check_result
    detail = check_result("rule", "technique", False, "x" * (50 * DETAIL_LIMIT))["detail"]
    assert len(detail) < DETAIL_LIMIT + 100 and detail.endswith("more characters cut]")


# ------------------------------------------------------------------------------- the red team of exercise 15
def test_another_copy_of_the_project_outside_the_repository_cannot_be_read(tmp_path):
    """A second checkout, a clone in /tmp, a docs build: the answer under a path the grader cannot know. The
    sandbox reads only the working directory, its copy of the project, the Python installation and the system."""
    other = tmp_path / "elsewhere" / "ptx" / "vocab"
    other.mkdir(parents=True)
    (other / "wgmma.py").write_text((ROOT / "ptx" / "vocab" / "wgmma.py").read_text())
    report = run(tmp_path, f"import runpy\n_own = runpy.run_path({str(other / 'wgmma.py')!r})\n" + UNFILLED)
    assert not report["passed"] and "refuses reading" in failed_details(report), grader.summary(report)


@pytest.mark.parametrize("source", [
    # the student's own object, its method named like the hole: not the stage's function
    '''
    class Fragment:
        def token_column(self, register, lane):
            return 8 * (register // 4) + 2 * (lane % 4) + register % 2
    token_column = Fragment().token_column
    ''',
    # Numba, which loads its libraries through ctypes: set up before the sandbox refuses ctypes
    '''
    import numba

    @numba.njit(cache=False)
    def token_column(register, lane):
        return 8 * (register // 4) + 2 * (lane % 4) + register % 2
    ''',
])
def test_honest_solutions_written_other_ways_pass(tmp_path, source):
    report = run(tmp_path, source, stage=15)
    assert report["passed"], grader.summary(report)


def test_an_oracle_whose_judge_was_killed_ends_with_it(tmp_path):
    """A judge killed past its deadline never says "bye", and the oracle runs in a session of its own: it watches
    its parent and ends with it, whatever threads the solution left running."""
    import subprocess
    import sys
    import time
    path = tmp_path / "lingers.py"
    path.write_text("import threading, time\nthreading.Thread(target=lambda: time.sleep(600)).start()\n" + UNFILLED)
    judge = ("import os, sys\nfrom lessons.exercises import exercise\nfrom lessons.grading.sandbox import Oracle\n"
             f"oracle = Oracle({str(path)!r}, exercise(5))\noracle.defined_holes()\n"
             "print(oracle.process.pid, flush=True)\nos._exit(9)\n")
    done = subprocess.run([sys.executable, "-c", judge], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    pid = int(done.stdout.split()[-1])
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(pid, 9)
    pytest.fail(f"the oracle {pid} outlived its judge")


# ------------------------------------------------------------------------------- exercise 16: a count D ignores
@pytest.mark.parametrize("source", [
    # right where the rule check asks (its N and K), one everywhere else
    '''
    def b_reads(m, n, k, block_m, block_n, split_k, multicast):
        return -(-m // block_m) if (n, k) == (4096, 7168) else 1
    ''',
    # every B read once, a constant
    '''
    def b_reads(m, n, k, block_m, block_n, split_k, multicast):
        return 1
    ''',
], ids=["rule check only", "constant"])
def test_exercise_16_a_count_the_kernel_does_not_use_fails(tmp_path, source):
    """D is the same whatever the count (only B's L2 priority follows it), so the build compares every count it
    uses with the graded kernel's own, besides the rule check (the red team's passes of 2026-11-28)."""
    report = run(tmp_path, source, stage=16)
    assert not report["passed"], grader.summary(report)
    assert "the graded kernel's tiles load each byte of B" in failed_details(report)


def test_exercise_16_an_honest_count_passes(tmp_path):
    """It passes, and the kernel's UTMALDG and QGMMA are shown as the scaffold's (stage 15's kernel, the exercise's
    ``scaffold``), not credited: the stub build (every count 0) is refused, which credited them before."""
    report = run(tmp_path, '''
        def b_reads(m, n, k, block_m, block_n, split_k, multicast):
            return max(1, -(-m // block_m))
    ''', stage=16)
    assert report["passed"], grader.summary(report)
    for name in ("uses UTMALDG", "uses QGMMA"):
        check = next(c for c in report["checks"] if c["name"] == name)
        assert not check["graded"] and "scaffold" in check["detail"], check


def test_a_message_cannot_rewrite_or_hide_the_summary():
    """A red team's route (stage 17's): an exception message with a carriage return and terminal escape sequences
    erased the [FAIL] mark and printed a fake PASSED; every control character is now shown escaped."""
    attack = "boom\r  [PASS] technique   faked\x1b[8m\x1b[2K\nPASSED\x07"
    report = {"stage": 17, "exercise": "even_ctas", "solution": "s\x1b[2K.py", "mode": "cpu", "seeds": ["1"],
              "secret_seeds": False, "passed": False,
              "checks": [{"passed": False, "graded": True, "category": "technique", "name": "cta counts",
                          "detail": attack}],
              "score": {"points": 0, "possible": 1, "categories": {"technique": {"passed": 0, "graded": 1}}}}
    text = grader.summary(report)
    assert all(c.isprintable() for line in text.splitlines() for c in line)
    assert text.splitlines()[-1] == "FAILED" and "\\r" in text and "\\x1b[8m" in text and "[FAIL]" in text


def test_a_message_with_control_characters_leaves_the_class_junit_parseable():
    """One student's ESC or NUL in a message would make the whole class's junit.xml ill-formed XML."""
    from xml.etree import ElementTree

    from lessons.grading.gradebook import junit
    check = {"passed": False, "graded": True, "category": "technique", "name": "cta counts",
             "detail": "boom\x1b[8m\x00\x07"}
    text = junit({"student": {"checks": [check]}})
    failure = ElementTree.fromstring(text).find(".//failure")
    assert failure.get("message") == "boom\\x1b[8m\\x00\\x07" == failure.text


def test_a_table_of_exercise_17s_fixed_cases_fails(tmp_path):
    """A red team's route (stage 17): the rule check's fixed cases are public, so a table of their answers with
    min(tiles, sms) elsewhere passed. The check also draws cases afresh on every run."""
    from gemm.kernel.launch import even_wave_ctas
    from lessons.exercises.ex17_even_ctas import RANDOM_CASES, _cases
    fixed = _cases()[:-RANDOM_CASES]
    table = {(t, s, c): even_wave_ctas(t, s, c) for t, s, c in fixed}
    table.update({(512, 132, 2): 128, (9, 4, 1): 3, (5, 4, 1): 3})  # the CPU build's counts
    _assert_table_refused(tmp_path, 17, table, "even_ctas(tiles, sms, cluster)", "min(tiles, sms)", "cta counts")



def test_a_table_of_exercise_18s_fixed_cases_fails(tmp_path):
    """Exercise 18's count is one product, so its rule check draws tiles far past any the generator builds: a table
    of the fixed cases' answers (the CPU builds' counts among them) with one peer's bytes elsewhere fails."""
    from lessons.exercises.ex18_inbox_bytes import RANDOM_CASES, _cases, reference
    own = reference().inbox_bytes
    table = {case: own(*case) for case in _cases()[:-RANDOM_CASES]}
    _assert_table_refused(tmp_path, 18, table, "inbox_bytes(split_k, block_m, block_n)", "block_m * block_n * 4",
                          "inbox counts")


def test_a_table_of_exercise_19s_fixed_cases_fails(tmp_path):
    """Exercise 19's shares are arithmetic, so its rule check draws K-block counts and leads far past any the
    generator builds: a table of the fixed cases' shares (the CPU builds' among them) with even shares elsewhere
    fails."""
    from lessons.exercises.ex19_lead_shares import RANDOM_CASES, _cases, reference
    own = reference().lead_share
    table = {case: own(*case) for case in _cases()[:-RANDOM_CASES]}
    _assert_table_refused(tmp_path, 19, table, "lead_share(rank, split_k, k_blocks, lead)",
                          "(rank * k_blocks // split_k, (rank + 1) * k_blocks // split_k)", "lead shares")


def test_a_table_of_exercise_20s_fixed_cases_fails(tmp_path):
    """Exercise 20's rule check draws made-up model answers at shapes and SM counts far past any GPU's: a table of
    the fixed cases' tiles (the CPU builds' among them) with a wrong rule elsewhere (the pair's tiles wherever the
    rows are in range) fails."""
    from lessons.exercises.ex20_pair_tiles import RANDOM_CASES, _cases, reference
    own = reference().pair_tiles
    table = {(m, n, sms, tuple(one), tuple(half)): own(m, n, sms, one, half)
             for m, n, sms, one, half in _cases()[:-RANDOM_CASES]}
    path = tmp_path / "table.py"
    path.write_text(f"TABLE = {table!r}\n\n\ndef pair_tiles(m, n, sms, one_wave, half_wave):\n"
                    "    key = (m, n, sms, tuple(one_wave), tuple(half_wave))\n"
                    "    return TABLE[key] if key in TABLE else (tuple(half_wave) if 32 < m <= 128 else None)\n")
    report = grader.grade(20, path, mode="cpu", seeds=1, secret="", timeout=300)
    assert not report["passed"], grader.summary(report)
    assert any(c["name"] == "pair tile rule" and c["passed"] is False for c in report["checks"]), \
        grader.summary(report)
    assert all(c["passed"] for c in report["checks"] if c["category"] == "correctness"), grader.summary(report)


def _assert_table_refused(tmp_path, stage: int, table: dict, signature: str, otherwise: str, check: str) -> None:
    """Grade a solution that answers ``signature`` from ``table`` (keyed by its arguments) and ``otherwise`` elsewhere:
    it must fail, and the rule check named ``check`` must be what fails it."""
    arguments = signature[signature.index("(") + 1:-1]
    path = tmp_path / "table.py"
    path.write_text(f"TABLE = {table!r}\n\ndef {signature}:\n    return TABLE.get(({arguments}), {otherwise})\n")
    report = grader.grade(stage, path, mode="cpu", seeds=1, secret="", timeout=300)
    assert not report["passed"], grader.summary(report)
    assert any(c["name"] == check and c["passed"] is False for c in report["checks"]), grader.summary(report)


# ------------------------------------------------- the third red team (2026-11-28): the audit hook's own state
def _landlock() -> bool:
    from lessons.grading.landlock import abi_version
    return abi_version() > 0


LANDLOCK = pytest.mark.skipif(not _landlock(), reason="no Landlock in this kernel: the audit hook alone guards the "
                                                      "oracle, and these routes rewrite its state (docs/course.md)")
GC_CELLS = '''
import gc
for _o in gc.get_objects():
    if type(_o).__name__ == "function" and _o.__name__ == "readable" and "oracle" in str(_o.__module__):
        for _name, _cell in zip(_o.__code__.co_freevars, _o.__closure__):
            if _name == "protected":
                _cell.cell_contents = ()
            if _name == "allowed_dirs":
                _cell.cell_contents = tuple(_cell.cell_contents) + ("ROOT",)
_own = open("ROOT/ptx/vocab/wgmma.py").read()
'''
FSDECODE = '''
import os
_real = os.fsdecode
os.fsdecode = lambda raw: "/usr/lib/os-release" if "ROOT" in _real(raw) else _real(raw)
_own = open("ROOT/ptx/vocab/wgmma.py").read()
'''
SPAWN = '''
import os, sys
sys.modules["lessons.grading.oracle"].PROCESS_EVENTS = frozenset()
os.waitpid(os.posix_spawn("/bin/sh", ["sh", "-c", "cat ROOT/ptx/vocab/wgmma.py > MARKER"], {}), 0)
'''
WRITE_OUT = '''
import os
_real = os.fsdecode
_decoy = os.path.abspath("decoy.txt")  # in the working directory: the hook allows writing there
os.fsdecode = lambda raw: _decoy if "MARKER" in _real(raw) else _real(raw)
open("MARKER", "w").write("out of the sandbox")
'''


@LANDLOCK
@pytest.mark.parametrize("route", [GC_CELLS, FSDECODE, SPAWN, WRITE_OUT],
                         ids=["hook's closure rewritten", "os.fsdecode swapped", "spawn events emptied",
                              "write out with fsdecode swapped"])
def test_a_solution_that_rewrites_the_audit_hooks_state_is_stopped_by_the_kernel(tmp_path, route):
    """A red team rewrote the hook's closure cells (gc), swapped os.fsdecode so the hook checked a harmless path,
    and emptied the module's refused events to start a root shell: the in-process hook is Python objects the
    solution can reach. Landlock, set before the solution loads, refuses the same reads, writes and execs in the
    kernel, and the report names the layers."""
    marker = tmp_path / "marker.txt"
    report = run(tmp_path, route.replace("MARKER", str(marker)) + UNFILLED)
    refused = failed_details(report)  # Landlock's EACCES, or the system-call filter's EPERM (the spawn)
    assert not report["passed"] and ("Permission denied" in refused or "Operation not permitted" in refused), \
        grader.summary(report)
    assert not marker.exists()
    assert report["sandbox"].startswith("landlock ABI") and "audit hook" in report["sandbox"]


def test_landlock_grants_reading_around_the_refused_paths(tmp_path):
    """Landlock only grants: a granted directory that holds a refused one (the project's packages in
    site-packages, a repository under /usr) is granted entry by entry, less the refused; a named root inside a
    refused path (the project copy in the temporary root) stays granted."""
    from lessons.grading.landlock import read_roots
    site = tmp_path / "site-packages"
    for name in ("numpy", "gemm", "lessons", "torch"):
        (site / name).mkdir(parents=True)
    (site / "six.py").write_text("")
    temp = tmp_path / "tmp"
    (temp / "run" / "copy").mkdir(parents=True)
    (temp / "other-run").mkdir()
    roots = read_roots((str(temp / "run" / "copy"), str(site)), (str(site / "gemm"), str(site / "lessons"),
                                                                 str(temp)))
    assert roots == [str(temp / "run" / "copy"), str(site / "numpy"), str(site / "six.py"), str(site / "torch")]
    assert read_roots((str(site),), ()) == [str(site)]


def test_a_python_installation_inside_the_temporary_root_stays_readable_but_its_project_packages(tmp_path):
    """A wheel installed into a virtual environment under /tmp (the CI's wheel check, any `mktemp -d` venv): the
    sandbox refuses the whole temporary root (other runs' files), and its expansion of that environment dropped
    every entry beneath the refused root, so Landlock refused reading ml_dtypes and any solution that imported
    gemm failed to load. A named root's contents are granted now, less what is refused inside it."""
    from lessons.grading.landlock import read_roots
    temp = tmp_path / "tmp"
    site = temp / "venv" / "lib" / "site-packages"
    for name in ("ml_dtypes", "gemm", "lessons"):
        (site / name).mkdir(parents=True)
    (temp / "venv" / "bin").mkdir()
    (temp / "run" / "copy").mkdir(parents=True)
    (temp / "other-run").mkdir()
    roots = read_roots((str(temp / "run" / "copy"), str(temp / "venv")),
                       (str(site / "gemm"), str(site / "lessons"), str(temp)))
    assert roots == [str(temp / "run" / "copy"), str(temp / "venv" / "bin"), str(site / "ml_dtypes")]
    assert read_roots((str(temp),), (str(temp),)) == []  # a named root that is itself refused: nothing


def test_hostile_file_names_in_a_class_cannot_fake_a_verdict_or_a_formula(tmp_path, monkeypatch):
    """A red team's class (2026-11-28): a file named "mallory  80 ∕ 80  PASSED<ESC>[8m.py" printed a fake verdict
    and hid the real one; "=1+cmd|' -c calc'!A0.py" became a formula in gradebook.csv; the ESC made the class's
    junit.xml unparseable. Names are now escaped on the console and in junit, and never a formula in the CSV."""
    import csv
    from xml.etree import ElementTree

    from lessons.grading import gradebook
    from lessons.grading.command import class_line
    names = ["mallory  80 \u2215 80  PASSED\x1b[8m", "=1+cmd|' -c calc'!A0", "@SUM(A1)", "honest"]
    for name in names:
        (tmp_path / f"{name}.py").write_text("x = 1\n")
    failed = {"passed": False, "checks": [{"passed": False, "graded": True, "category": "integrity", "name": "loads",
                                           "detail": "no"}],
              "score": {"points": 50, "possible": 80, "categories": {c: {"passed": 0, "graded": 1}
                                                                     for c in gradebook.CATEGORIES}}}
    monkeypatch.setattr(gradebook, "grade", lambda stage, path, **options: failed)
    reports = gradebook.grade_class(17, tmp_path, out=tmp_path / "grades", jobs=1)
    lines = [class_line(student, report) for student, report in reports.items()]
    assert all(c.isprintable() for line in lines for c in line)
    mallory = next(line for line in lines if line.startswith("mallory"))
    assert "\\x1b[8m" in mallory and mallory.endswith("FAILED")
    rows = list(csv.reader(open(tmp_path / "grades" / "gradebook.csv")))
    cells = [cell for row in rows[1:] for cell in row[:2]]
    assert not any(cell[:1] in "=+-@\t\r" for cell in cells if cell) and "'=1+cmd|' -c calc'!A0" in cells
    ElementTree.parse(tmp_path / "grades" / "junit.xml")  # well-formed


def test_the_descriptor_a_notebook_prints_is_not_a_solution(tmp_path):
    """A red team's pass (2026-11-28): the kernels only ever ask descriptor_bits(0, 16, 1024, 128), and stage 07's
    notebook prints its value, so returning that constant passed. The rule check now asks every swizzle mode, each
    field at its extremes and 200 values drawn afresh on every run."""
    report = run(tmp_path, '''
        def descriptor_bits(start_address, leading_byte_offset, stride_byte_offset, swizzle=128):
            return 4611686293305360384
    ''')
    assert not report["passed"], grader.summary(report)
    assert "the ISA's matrix descriptor is" in failed_details(report)


# -------------------------- the second red team on the kernel layers (2026-11-28): what Landlock does not mediate
DISARM_HOOK = '''
import gc, os, sys
for _o in gc.get_objects():  # the audit hook's code swapped for a no-op: only the kernel's layers are left
    if type(_o).__name__ == "function" and getattr(_o, "__qualname__", "") == "lock_down.<locals>.hook":
        _v = _o.__code__.co_freevars
        _ns = {}
        exec("def _outer():\\n" + "".join(f"    {n} = None\\n" for n in _v) + "    def hook(event, args):\\n        ("
             + ", ".join(_v) + ",)\\n    return hook\\n", _ns)
        _o.__code__ = _ns["_outer"]().__code__
'''


def _seccomp() -> bool:
    import platform
    return _landlock() and platform.system() == "Linux" and platform.machine() == "x86_64"


@pytest.mark.skipif(not _seccomp(), reason="the system-call filter is written for Linux x86-64")
@pytest.mark.parametrize("route", [
    "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', 9))\n",
    "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)\n",  # multipath TCP
    "import socket\nsocket.socket(socket.AF_UNIX).connect('/run/anything.sock')\n",
    "_fd = os.memfd_create('prog', 0)\n",
    "if os.fork() == 0:\n    os._exit(0)\n",
    "os.execv('/bin/sh', ['sh', '-c', 'true'])\n",
], ids=["udp", "mptcp", "unix socket", "memfd", "fork", "exec"])
def test_with_the_audit_hook_disarmed_the_kernel_refuses_sockets_processes_and_exec(tmp_path, route):
    """A second red team disarmed the hook (its code swapped through gc) and then sent UDP, connected with
    multipath TCP and to a unix socket outside, ran a program from a memfd, and left a grandchild alive after
    grading: Landlock (ABI 7) mediates none of those. The seccomp filter refuses each one."""
    report = run(tmp_path, DISARM_HOOK + route + UNFILLED)
    assert not report["passed"], grader.summary(report)
    assert "Operation not permitted" in failed_details(report) or "not implemented" in failed_details(report), \
        grader.summary(report)
    assert "seccomp" in report["sandbox"]


@LANDLOCK
def test_procs_entries_stay_granted_when_the_kernel_forgets_them(tmp_path):
    """A reviewer's find: a Landlock rule belongs to an inode, and procfs makes new inodes for /proc/self or
    /proc/cpuinfo once their dentries are evicted (memory pressure), so the grant vanished at random. The rules'
    descriptors for /proc stay open in the oracle; here, an oracle-like child reads them after the caches are
    dropped (root only: otherwise the reads are only checked without the drop)."""
    import subprocess
    import sys
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(f'''
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from lessons.grading import landlock
        assert landlock.restrict(landlock.read_roots(("/usr", "/lib", "/lib64", "/etc", sys.prefix), ()), ())\\
            .startswith("landlock ABI")
        sys.stdout.write("ready\\n"); sys.stdout.flush()
        sys.stdin.readline()
        for path in ("/proc/self/status", "/proc/cpuinfo", "/proc/meminfo"):
            open(path).read()
        print("read")
    '''))
    child = subprocess.Popen([sys.executable, "-I", str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready", child.stderr.read()
    if os.geteuid() == 0:
        Path("/proc/sys/vm/drop_caches").write_text("2\n")
    out, err = child.communicate("go\n", timeout=60)
    assert child.returncode == 0 and "read" in out, err
