"""Is a hole the stage's own code? A comparison of syntax trees, blind to names, docstrings, comments and layout.

A solution's hole function and each of the stage's own functions for it (the reference's hole functions and the
functions the exercise's ``answer_sites`` name) are parsed, then normalised: the docstring dropped, the function's
own name, its parameters, every local variable and nested helper renamed in order of first appearance (``v0``,
``v1``, ...), every call of a non-builtin global one placeholder (a helper renamed is the same call), padding dropped
(assignments to names never read, calls of a pure builtin on arguments that call nothing), a bare ``return`` made
``return None``, every string emptied (reworded messages), and the tree dumped without positions. The similarity
does not count statements that bind a local function (an adapter around a copy's calls), and the functions of every
string constant that is Python source are compared as well (code kept in a string to be run from it). The stage's
one-statement helpers (``return expression``) are also compared pasted into their callers, as a copy may paste them. Equal dumps mean the same code with other names and formatting: reported as
copied (``python -m lessons grade --allow-copies`` lets an instructor accept them). Only functions of at least
MIN_STATEMENTS statements are compared: a short hole has one natural way to be written, and a correct one-liner
is not a copy. Restructured code (other operations, another order) is not a copy by this test: that is writing it.
"""
from __future__ import annotations

import ast
import builtins
import inspect
from collections import Counter
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILTIN_NAMES = frozenset(dir(builtins))  # calls of these keep their name: min() is not max()


class _Renamer(ast.NodeTransformer):
    """Parameters and names assigned inside the function become v0, v1, ... (globals and attributes stay)."""

    def __init__(self, local_names, anonymous: bool = False):
        self.names: dict[str, str] = {}
        self.local, self.anonymous = set(local_names), anonymous  # anonymous: every local is "v" (position-free)

    def _rename(self, name: str) -> str:
        if name not in self.local:
            return name
        if self.anonymous:
            return "v"
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_arg(self, node):
        node.arg = self._rename(node.arg)
        node.annotation = None
        return node

    def visit_Name(self, node):
        node.id = self._rename(node.id)
        return node

    def visit_Call(self, node):  # a helper called by another name is the same call: every non-builtin global is "g"
        is_global = (isinstance(node.func, ast.Name) and node.func.id not in self.local
                     and node.func.id not in BUILTIN_NAMES)  # read before the visit renames the locals
        self.generic_visit(node)
        if is_global:
            node.func.id = "g"
        return node

    def visit_Constant(self, node):  # messages and keys reworded are still the same code
        return ast.Constant("") if isinstance(node.value, str) else node

    def visit_JoinedStr(self, node):
        return ast.Constant("")


def _local_names(function: ast.AST) -> set[str]:
    names = {a.arg for a in ast.walk(function) if isinstance(a, ast.arg)}
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif node is not function and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)  # a nested helper is a local: calling it is not calling a global
    return names


def normalized(function: ast.FunctionDef | ast.Lambda) -> str:
    """The function's body and signature, names and formatting removed (see the module docstring)."""
    function = ast.parse(ast.unparse(function)).body[0]  # a private copy
    if isinstance(function, ast.Expr):
        function = function.value
    if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        body = function.body
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str):
            function.body = body[1:] or [ast.Pass()]
        function.name = "f"
        function.returns = None
        function.decorator_list = []
    return ast.dump(_canonical(function), annotate_fields=False, include_attributes=False)


def _canonical(function, anonymous: bool = False):
    """The function with no-ops and dead stores dropped, names renamed in order (or all to one name), strings
    emptied, commutative operands sorted."""
    _drop_dead(function)
    _NoOps().visit(function)
    renamer = _Renamer(_local_names(function), anonymous)
    renamer.visit(function)
    return _Commutative().visit(function)


class _Commutative(ast.NodeTransformer):
    """``b * a`` and ``a * b`` (and +, &, |, ^) are the same code: operands in a fixed order."""

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, (ast.Add, ast.Mult, ast.BitAnd, ast.BitOr, ast.BitXor)):
            left, right = sorted((node.left, node.right), key=lambda n: ast.dump(n, include_attributes=False))
            node.left, node.right = left, right
        return node


def statement_profile(function) -> dict[str, int]:
    """The multiset of the canonical function's statements (each dumped, nested ones too)."""
    tree = ast.parse(ast.unparse(function)).body[0]
    if isinstance(tree, ast.Expr):
        tree = tree.value
    tree = _canonical(tree, anonymous=True)  # an added statement must not rename every later one
    adapters = {id(n) for d in ast.walk(tree) if d is not tree and _defines_function(d) for n in ast.walk(d)}
    profile: dict[str, int] = {}
    for node in ast.walk(tree):
        # a local function (a nested def, a lambda bound to a name) adapts a copy's calls: the statements count
        if isinstance(node, ast.stmt) and node is not tree and id(node) not in adapters:
            key = ast.dump(node, annotate_fields=False, include_attributes=False)
            profile[key] = profile.get(key, 0) + 1
    return profile


def _defines_function(node) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or (
        isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda))


def similarity(a: dict[str, int], b: dict[str, int]) -> float:
    """Jaccard similarity of two statement multisets (1.0: the same statements)."""
    keys = set(a) | set(b)
    union = sum(max(a.get(k, 0), b.get(k, 0)) for k in keys)
    return sum(min(a.get(k, 0), b.get(k, 0)) for k in keys) / union if union else 0.0


class _NoOps(ast.NodeTransformer):
    """Statements that do nothing (``pass``, a bare constant such as a docstring) are not code; a bare ``return``
    is ``return None``."""

    def visit_Return(self, node):
        if node.value is None:
            node.value = ast.Constant(None)
        return node

    def generic_visit(self, node):
        super().generic_visit(node)
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                kept = [s for s in block if not isinstance(s, ast.Pass) and not (
                    isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
                setattr(node, field, kept or [ast.Pass()])
        return node


_EFFECTS = (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)
# builtins whose call changes nothing but its result (none calls a function it is given, none mutates an argument)
PURE_BUILTINS = frozenset({"abs", "all", "any", "ascii", "bin", "bool", "bytes", "callable", "chr", "complex", "dict",
                           "divmod", "float", "format", "frozenset", "hash", "hex", "id", "int", "isinstance",
                           "issubclass", "len", "list", "oct", "ord", "pow", "range", "repr", "round", "set", "slice",
                           "str", "tuple", "type"})


def _pure_call(node, local: set[str]) -> bool:
    """A call of a pure builtin (not shadowed by a local) on arguments that call nothing: ``len(())``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PURE_BUILTINS
            and node.func.id not in local
            and not any(isinstance(n, _EFFECTS + (ast.Lambda,)) for a in (*node.args, *node.keywords)
                        for n in ast.walk(a)))


def _loads(node) -> Counter:
    return Counter(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))


def _no_effect(statement, reads: Counter, local: set[str]) -> bool:
    """Whether ``statement`` changes nothing the function returns, given ``reads`` (every load of a name in the
    function): an assignment (plain, augmented, annotated) whose names nothing else reads, a bare expression without
    a call, an assert, a store to an attribute of a global (``hole.x = 0``)."""
    if isinstance(statement, ast.Assert):
        return True
    if isinstance(statement, ast.Expr):
        return (not any(isinstance(n, _EFFECTS) for n in ast.walk(statement.value))
                or _pure_call(statement.value, local))
    if not isinstance(statement, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        return False
    targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
    if statement.value is not None and any(isinstance(n, _EFFECTS) for n in ast.walk(statement.value)):
        return False
    stored = [n for t in targets for n in ast.walk(t) if isinstance(getattr(n, "ctx", None), ast.Store)]
    if any(not isinstance(n, (ast.Name, ast.Attribute, ast.Tuple, ast.List)) for n in stored):
        return False  # a subscript or a starred target: keep
    if any(isinstance(n, ast.Attribute) and (not isinstance(n.value, ast.Name) or n.value.id in local)
           for n in stored):
        return False  # an attribute of a local object is state the function may return
    own = _loads(statement)
    return not any(reads[n.id] - own[n.id] > 0 for n in stored if isinstance(n, ast.Name))


def _drop_dead(function) -> None:
    """Statements that change nothing the function returns (:func:`_no_effect`) and ``if`` on a constant (its taken
    branch kept), dropped until none is left, each block read backwards so a chain of them goes in one pass: padding
    a copy with them must not make it another function."""
    local = _local_names(function)
    reads = _loads(function)

    def sweep(node) -> bool:
        changed = False
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, field, None)
            if not (isinstance(block, list) and block and isinstance(block[0], (ast.stmt, ast.excepthandler))):
                continue
            kept = []
            for statement in reversed(block):
                if isinstance(statement, ast.If) and isinstance(statement.test, ast.Constant):
                    taken = statement.body if statement.test.value else statement.orelse
                    reads.subtract(_loads(statement.test))
                    for dropped in (statement.orelse if statement.test.value else statement.body):
                        reads.subtract(_loads(dropped))
                    kept += reversed(taken)
                    changed = True
                    continue
                if isinstance(statement, ast.stmt) and _no_effect(statement, reads, local):
                    reads.subtract(_loads(statement))
                    changed = True
                    continue
                changed |= sweep(statement)
                kept.append(statement)
            kept.reverse()
            setattr(node, field, kept or [ast.Pass()])
        return changed

    for _ in range(64):  # nested blocks may free names for an outer one: a few sweeps, bounded
        if not sweep(function):
            return


def _inlined(function: ast.AST, helpers: dict[str, ast.FunctionDef]) -> ast.AST | None:
    """``function`` with each call of a one-statement helper (``return expression``) replaced by that expression,
    its parameters bound to the call's arguments; None when it calls none. A copy that pastes the helper's body in
    place of the call is then the same code."""
    class Inline(ast.NodeTransformer):
        changed = False

        def visit_Call(self, node):
            self.generic_visit(node)
            helper = helpers.get(node.func.id) if isinstance(node.func, ast.Name) else None
            if helper is None or node.keywords or len(node.args) > len(helper.args.args):
                return node
            body = [b for b in helper.body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
            if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
                return node
            bound = {a.arg: value for a, value in zip(helper.args.args, node.args)}

            class Bind(ast.NodeTransformer):
                def visit_Name(self, name):
                    return bound.get(name.id, name)
            Inline.changed = True
            return Bind().visit(ast.parse(ast.unparse(body[0].value), mode="eval").body)

    copy = ast.parse(ast.unparse(function)).body[0]
    inline = Inline()
    copy = inline.visit(copy)
    return ast.parse(ast.unparse(copy)).body[0] if Inline.changed else None



def functions_in(source: str, strings: bool = False) -> dict[str, ast.FunctionDef]:
    """The module-level functions of ``source`` by name (nested ones too, for methods and closures). ``strings``:
    also the functions of every string constant that is Python source itself (code kept in a string to be run from
    it), named ``<string>.name``."""
    found = {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.setdefault(node.name, node)
    if strings:
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "def " in node.value:
                try:
                    inner = functions_in(textwrap.dedent(node.value))
                except (SyntaxError, ValueError):
                    continue
                for name, function in inner.items():
                    found.setdefault(f"<string>.{name}", function)
    return found


def stage_functions(exercise) -> list[ast.AST]:
    """The stage's own code for the exercise's holes: the reference's hole functions (their source) and every
    function its ``answer_sites`` name."""
    nodes = []
    try:
        reference = exercise.reference()
    except Exception:  # noqa: BLE001 - an exercise without a reference: only the answer sites count
        reference = None
    for hole in exercise.holes:
        function = getattr(reference, hole, None)
        function = getattr(function, "py_func", function)
        try:
            source = textwrap.dedent(inspect.getsource(function))
            node = ast.parse(source).body[0]
        except (TypeError, OSError, SyntaxError, IndexError):
            continue
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda):
            node = node.value
        nodes.append(node)
    for relative, names in (getattr(exercise, "answer_sites", {}) or {}).items():
        path = ROOT / relative
        if not path.is_file():
            continue
        functions = functions_in(path.read_text())
        chosen = [functions[name] for name in (functions if names is None else names) if name in functions]
        nodes += chosen
        helpers = {node.name: node for node in chosen}
        nodes += [inlined for node in chosen if (inlined := _inlined(node, helpers)) is not None]
    return nodes


MIN_STATEMENTS = 4  # below this a function has one natural way to be written (``return total + partial * s``)
SIMILAR = 0.8  # share of the same statements (canonical) that makes a copy: one edited line of six is still one


def statements(function: ast.AST) -> int:
    """Statements in the function's body once docstrings and no-ops are dropped (nested ones counted)."""
    tree = ast.parse(ast.unparse(function)).body[0]
    _NoOps().visit(tree)
    return sum(isinstance(node, ast.stmt) for node in ast.walk(tree)) - (not isinstance(tree, ast.Expr))


def copied_holes(source: str, exercise) -> list[str]:
    """The functions of ``source`` (holes and helpers) whose code is the stage's own, names and formatting aside. Only the stage's
    functions of at least MIN_STATEMENTS statements count: a correct one-liner is not a copy of another."""
    try:
        mine = functions_in(source, strings=True)
    except SyntaxError:
        return []
    theirs = []
    for node in stage_functions(exercise):
        try:
            if statements(node) >= MIN_STATEMENTS:
                theirs.append((normalized(node), statement_profile(node)))
        except SyntaxError:
            continue
    copied = []
    # every function of the file, not only the holes: a hole that calls a copied helper is a copy too
    for name, function in mine.items():
        exact, profile = normalized(function), statement_profile(function)
        if any(exact == their_exact or similarity(profile, their_profile) >= SIMILAR
               for their_exact, their_profile in theirs):
            copied.append(name)
    return copied


__all__ = ["normalized", "copied_holes", "stage_functions", "functions_in"]
