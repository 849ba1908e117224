"""The builder's PtxModule carries each kernel's parameters and whether it needs whole-program assembly, which the
toolchain reads instead of parsing the text back. Checked against what the text itself says, for every stage and
production kernel that tests/test_ptx_identity.py hashes, and against hand-made kernels."""
import pickle
import re
import sys
from pathlib import Path

import pytest

from ptx.builder import KernelBuilder, PtxModule, module

sys.path.insert(0, str(Path(__file__).parent))  # tests/test_ptx_identity.py: the kernels it hashes
from test_ptx_identity import _cases  # noqa: E402

# What ptx.runtime used to read from the text: each .entry's parameter list (type, array length).
_ENTRY = re.compile(r"\.entry\s+([\w$]+)\s*\((.*?)\)", re.S)
_PARAM = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+[\w$]+(?:\[(\d+)\])?")


def _read_back(text: str) -> dict:
    return {name: tuple((t, int(n or 0)) for t, n in _PARAM.findall(params)) for name, params in _ENTRY.findall(text)}


@pytest.mark.parametrize("name, make", sorted(_cases().items()), ids=sorted(_cases()))
def test_generated_modules_say_what_their_text_says(name, make, monkeypatch):
    monkeypatch.delenv("FP8LADDER_FFMA_INTERLEAVE", raising=False)
    ptx = make()
    assert isinstance(ptx, PtxModule), f"{name}: the generator returned a plain {type(ptx).__name__}"
    assert ptx.kernels == _read_back(ptx)
    assert ptx.whole_program == ("setmaxnreg" in ptx)  # what ptx.compile's assembler choice used to search for


def test_builder_records_parameters_and_whole_program_instructions():
    k = KernelBuilder("scale", params=[("u64", "data"), ("tmap", "tmap"), ("f32", "factor"), ("u32", "count")])
    k.comment("setmaxnreg in a comment is no instruction")
    plain = module([k])
    assert plain.kernels == {"scale": (("u64", 0), ("b8", 128), ("f32", 0), ("u32", 0))} == _read_back(plain)
    assert not plain.whole_program
    k.emit("@%p1 setmaxnreg.inc.sync.aligned.u32 232;")
    assert module([k]).whole_program
    copied = pickle.loads(pickle.dumps(plain))
    assert copied == plain and copied.kernels == plain.kernels and copied.whole_program is False


def test_plain_text_needs_an_explicit_assembler():
    from ptx.compile import choose_assembler
    text = module([KernelBuilder("k", params=[])])
    assert choose_assembler(text) == "nvjitlink"
    with pytest.raises(TypeError, match="assembler='nvjitlink' or 'ptxas'"):
        choose_assembler(str(text) + "// edited\n")
    assert choose_assembler(str(text), "ptxas") == "ptxas"
    assert choose_assembler(PtxModule(str(text), text.kernels, whole_program=True)) == "ptxas"


def test_hand_written_smoke_modules_state_their_parameters_truly():
    from ptx import smoke
    modules = [smoke.PTX_FILL, smoke.PTX_BIG_SMEM, smoke.PTX_CLUSTER, smoke.PTX_TMA, smoke.PTX_TMA_SWIZZLED,
               smoke.PTX_COPY, smoke.PTX_INCREMENT]
    for ptx in modules:
        assert ptx.kernels == _read_back(ptx) and not ptx.whole_program
