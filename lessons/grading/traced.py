"""A student's hole as plain data: arithmetic traced into a tree, PTX emission recorded into a transcript.

The judge never runs a student's function. The sandboxed oracle (:mod:`lessons.grading.oracle`) runs it and sends
back what it *computes*, as JSON-able data, and the judge rebuilds an equivalent function from that data alone:

* **expression holes** (exercises 01, 03, 04: a device function, or a function the generator calls on registers):
  the oracle calls the function on :class:`Symbol` arguments, each operator records a node, and the result is a tree
  ``["arg", i] | ["const", number] | [op, left, right] | ["neg", x] | ["cast", "uint64", x]`` (the numpy / Numba
  scalar types of CASTS, which the stages use for unsigned indexing). :func:`function_from_tree` turns a checked
  tree back into a Python function made of the same operators, which works on numbers, on Numba values and on the
  generator's registers alike. Branching on an argument cannot be traced and says so (the prompts ask for
  straight-line arithmetic).
* **emitter holes** (exercise 00: PTX text written into a ``KernelBuilder``): the oracle hands the function a
  :class:`RecordingBuilder` and sends back the registers it asked for, the lines it emitted and the register it
  returned; :func:`replay_emitter` replays them into the judge's real builder.
* **value holes** (the rest: integers in, integers or tuples out) need no tracing: the judge asks for each call.

This module imports nothing but the standard library: it runs on both sides of the trust boundary.
"""
from __future__ import annotations

import math
import re

BINARY = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%", "and": "&", "or": "|",
          "xor": "^", "lshift": "<<", "rshift": ">>"}
CASTS = ("uint64", "int64", "uint32", "int32", "float32", "float64")  # numpy / Numba scalar types a hole may call
MAX_NODES = 20000
MAX_DEPTH = 200  # nesting the judge rebuilds (Python's parser and compiler recurse)
MAX_INT = 1 << 64


class TraceError(Exception):
    """The function did something a trace cannot record (a branch on an argument, a call on it)."""


class Symbol:
    """A traced value: every arithmetic operator returns a new Symbol holding the operation's tree."""

    __slots__ = ("tree",)

    def __init__(self, tree):
        self.tree = tree

    def _binary(self, op, other, reflected=False):
        other = other.tree if isinstance(other, Symbol) else constant(other)
        return Symbol([op, other, self.tree] if reflected else [op, self.tree, other])

    def __neg__(self):
        return Symbol(["neg", self.tree])

    def __pos__(self):
        return self

    def __bool__(self):
        raise TraceError("the hole branches on an argument (`if`, `and`/`or`, a comparison used as a condition): "
                         "write it as straight-line arithmetic, as the prompt asks")

    def __index__(self):
        raise TraceError("the hole uses an argument as a Python index or count (range, a list index): write it as "
                         "straight-line arithmetic, as the prompt asks")

    __int__ = __float__ = __index__

    def __call__(self, *args, **kwargs):
        raise TraceError("the hole calls one of its arguments")

    def __getattr__(self, name):
        if name.startswith("__"):  # protocol probes (numpy's __array_priority__, ...): not there, as for any object
            raise AttributeError(name)
        raise TraceError(f"the hole reads .{name} of an argument: only arithmetic on the arguments can be traced")


def _binary_method(op, reflected):
    return lambda self, other: self._binary(op, other, reflected)


for _op in BINARY:
    _name = _op
    setattr(Symbol, f"__{_name}__", _binary_method(_op, False))
    setattr(Symbol, f"__r{_name}__", _binary_method(_op, True))


def constant(value):
    """A number as a tree leaf: ints of at most 64 bits and finite floats (numpy scalars included)."""
    if isinstance(value, bool):
        value = int(value)
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        value = value.item()
    if isinstance(value, int) and -MAX_INT < value < MAX_INT:
        return ["const", value]
    if isinstance(value, float) and math.isfinite(value):
        return ["const", value]
    raise TraceError(f"the hole uses a constant the trace cannot record: {value!r} (ints of 64 bits, finite floats)")


def _cast(name: str):
    def cast(value):
        tree = value.tree if isinstance(value, Symbol) else constant(value)
        return Symbol(["cast", name, tree])
    return cast


def _cast_name(value) -> str | None:
    """The scalar type ``value`` is (numpy.uint64, numba.uint64, ...), if it is one of CASTS."""
    module = getattr(type(value), "__module__", "") + getattr(value, "__module__", "")
    name = getattr(value, "__name__", None) or getattr(value, "name", None)
    return name if name in CASTS and ("numpy" in module or "numba" in module) else None


class _ModuleWithCasts:
    """numpy (or numba) as a hole sees it while traced: its scalar types record a cast, the rest is the module."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        value = getattr(self._module, name)
        return _cast(name) if _cast_name(value) == name else value


def trace(function, arity: int):
    """The tree of ``function(arg0, ..., arg{arity-1})`` (the oracle's side). The scalar types the function's module
    uses (``uint64(x)``, ``np.float32(x)``) record a cast while it runs."""
    scope = getattr(function, "__globals__", {})
    saved = {}
    for name, value in list(scope.items()):
        if _cast_name(value) is not None:
            saved[name], scope[name] = value, _cast(_cast_name(value))
        elif type(value).__name__ == "module" and getattr(value, "__name__", "") in ("numpy", "numba"):
            saved[name], scope[name] = value, _ModuleWithCasts(value)
    try:
        result = function(*(Symbol(["arg", i]) for i in range(arity)))
    finally:
        scope.update(saved)
    return result.tree if isinstance(result, Symbol) else constant(result)


def check_tree(tree, arity: int) -> None:
    """Raise ValueError unless ``tree`` is a well-formed tree over ``arity`` arguments (the judge's side: the tree
    came from untrusted code)."""
    count = 0
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ValueError(f"the traced expression has more than {MAX_NODES} operations")
        if depth > MAX_DEPTH:
            raise ValueError(f"the traced expression nests more than {MAX_DEPTH} deep")
        if not isinstance(node, list) or not node or not isinstance(node[0], str):
            raise ValueError(f"malformed traced expression node {str(node)[:80]}")
        kind = node[0]
        if kind == "arg":
            if len(node) != 2 or type(node[1]) is not int or not 0 <= node[1] < arity:
                raise ValueError(f"malformed argument node {node}")
        elif kind == "const":
            value = node[1] if len(node) == 2 else None
            if type(value) not in (int, float) or (type(value) is int and not -MAX_INT < value < MAX_INT) or (
                    type(value) is float and not math.isfinite(value)):
                raise ValueError(f"malformed constant node {str(node)[:80]}")
        elif kind == "neg" and len(node) == 2:
            stack.append((node[1], depth + 1))
        elif kind == "cast" and len(node) == 3 and node[1] in CASTS:
            stack.append((node[2], depth + 1))
        elif kind in BINARY and len(node) == 3:
            stack.extend((child, depth + 1) for child in node[1:])
        else:
            raise ValueError(f"unknown operation {kind!r} in the traced expression")


def source_of(tree, names) -> str:
    """The expression as Python source over ``names`` (fully parenthesised: the order of operations is the tree's)."""
    kind = tree[0]
    if kind == "arg":
        return names[tree[1]]
    if kind == "const":
        return repr(tree[1])
    if kind == "neg":
        return f"(-{source_of(tree[1], names)})"
    if kind == "cast":
        return f"{tree[1]}({source_of(tree[2], names)})"
    return f"({source_of(tree[1], names)} {BINARY[kind]} {source_of(tree[2], names)})"


def function_from_tree(tree, names, name: str = "hole"):
    """A function of ``names`` computing the checked ``tree`` with Python's operators, nothing else (no builtins):
    it runs on ints and floats, Numba compiles it, and the PTX generator's registers overload the same operators."""
    check_tree(tree, len(names))
    if not all(re.fullmatch(r"[A-Za-z_]\w*", n) for n in names) or not re.fullmatch(r"[A-Za-z_]\w*", name):
        raise ValueError(f"bad names {names!r} / {name!r}")
    text = f"def {name}({', '.join(names)}):\n    return {source_of(tree, names)}\n"
    namespace: dict = {"__builtins__": {}}
    if '"cast"' in repr(tree).replace("'", '"'):
        import numpy
        namespace.update({cast: getattr(numpy, cast) for cast in CASTS})
    exec(compile(text, f"<traced {name}>", "exec"), namespace)  # noqa: S102 - our own text, from a checked tree
    function = namespace[name]
    function.traced_source = text
    return function


# -- emitter holes ------------------------------------------------------------------------------------------
PLACEHOLDER = "%__hole_r"
_PLACEHOLDER_RE = re.compile(re.escape(PLACEHOLDER) + r"(\d+)")
# a line may use {a, b} vector operands, never open or close a block, nor declare anything
_FORBIDDEN_PTX = re.compile(r"^\s*[{}]|[{}]\s*$|;.*\S|\.(entry|func|visible|extern|global|version|target|"
                            r"address_size|reg|shared|local|param|const)\b")


class RecordingBuilder:
    """The part of ``ptx.builder.KernelBuilder`` an emitter hole uses (reg, regs, label, emit, comment), recording
    instead of building: new registers are placeholders the judge renames."""

    def __init__(self):
        self.events: list = []
        self._count = 0

    def _new(self, what: str, kind: str, hint) -> str:
        name = f"{PLACEHOLDER}{self._count}"
        self._count += 1
        self.events.append([what, kind, hint if isinstance(hint, str) else None, name])
        return name

    def reg(self, ptx_type: str, hint: str | None = None) -> str:
        return self._new("reg", str(ptx_type), hint)

    def regs(self, ptx_type: str, count: int, hint: str | None = None) -> list[str]:
        return [self.reg(ptx_type, hint) for _ in range(int(count))]

    def label(self, hint: str = "L") -> str:
        return self._new("label", "", hint)

    def emit(self, *lines: str) -> None:
        self.events.append(["emit", [str(line) for line in lines]])

    def comment(self, text: str) -> None:
        self.events.append(["comment", str(text)])


def record_emitter(function, *args) -> dict:
    """Run an emitter hole against a :class:`RecordingBuilder` (the oracle's side): its events and return value."""
    builder = RecordingBuilder()
    result = function(builder, *args)
    return {"events": builder.events, "result": result if isinstance(result, str) else None}


def replay_emitter(transcript: dict, kb, inputs) -> str | None:
    """Replay a recorded emitter into the judge's real builder ``kb``; ``inputs``: the register names the oracle was
    given (the only other names its lines may use). Returns the result register, renamed. Raises ValueError on
    anything that is not a plain instruction line."""
    if not isinstance(transcript, dict) or not isinstance(transcript.get("events"), list):
        raise ValueError("malformed emitter transcript")
    names: dict[str, str] = {}

    def rename(text: str) -> str:
        def one(match):
            if match.group(0) not in names:
                raise ValueError(f"the emitted PTX uses {match.group(0)} before asking for it")
            return names[match.group(0)]
        return _PLACEHOLDER_RE.sub(one, text)

    if len(transcript["events"]) > 2000:
        raise ValueError("the emitter hole recorded more than 2000 events")
    for event in transcript["events"]:
        kind = event[0] if isinstance(event, list) and event else None
        if kind in ("reg", "label") and len(event) == 4:
            _, ptx_type, hint, placeholder = event
            if not re.fullmatch(r"[a-z0-9]{1,6}", ptx_type or "x") or not isinstance(placeholder, str):
                raise ValueError(f"bad register request {event}")
            hint = hint if isinstance(hint, str) and re.fullmatch(r"[A-Za-z_]\w{0,20}", hint) else None
            names[placeholder] = kb.reg(ptx_type, hint) if kind == "reg" else kb.label(hint or "L")
        elif kind == "emit" and len(event) == 2 and isinstance(event[1], list):
            lines = []
            for line in event[1]:
                if not isinstance(line, str) or len(line) > 400 or "\n" in line or _FORBIDDEN_PTX.search(line):
                    raise ValueError(f"the emitter hole may emit instruction lines only, got {str(line)[:80]!r}")
                lines.append(rename(line))
            kb.emit(*lines)
        elif kind == "comment" and len(event) == 2 and isinstance(event[1], str):
            kb.comment(event[1].replace("\n", " ")[:200])
        else:
            raise ValueError(f"malformed emitter event {str(event)[:80]}")
    result = transcript.get("result")
    if result is None:
        return None
    if result in inputs:
        return result
    return rename(result)


__all__ = ["Symbol", "TraceError", "trace", "check_tree", "function_from_tree", "source_of", "RecordingBuilder",
           "record_emitter", "replay_emitter", "constant"]
