"""Source text of notebook functions and classes, checked against the live objects. Pure.

A kernel keeps every cell's text (``linecache``, ``In``), but a live class may have moved on
since its cell ran: an attribute set in a later cell, a method replaced, a class defined in one
branch of an ``if``. Shipping the text unchecked would run other code on the workers without a
word, so :func:`class_source` compares the text with the live class and reports every
difference; :mod:`distlab.capture.collect` turns them into lines of the script or a clear error.
"""
from __future__ import annotations

import ast
import inspect
import linecache
import textwrap
import types
from dataclasses import dataclass

from distlab.errors import CaptureError

LITERAL_TYPES = (int, float, complex, str, bytes, bool, type(None), tuple, list, dict, set, frozenset)
MAX_LITERAL_CHARS = 2000
DESCRIPTOR_TYPES = (types.MemberDescriptorType, types.GetSetDescriptorType)


def is_literal(value) -> bool:
    """True when ``repr(value)`` is short Python source that gives back an equal value."""
    if not _literal_types_only(value):
        return False
    text = repr(value)
    try:
        return len(text) <= MAX_LITERAL_CHARS and ast.literal_eval(text) == value
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return False


def _literal_types_only(value) -> bool:
    if type(value) not in LITERAL_TYPES:
        return False
    if isinstance(value, dict):
        return all(_literal_types_only(k) and _literal_types_only(v) for k, v in value.items())
    if isinstance(value, (tuple, list, set, frozenset)):
        return all(_literal_types_only(v) for v in value)
    return True


def unwrap(obj):
    """The function a ``functools.wraps`` decorator wrapped (``obj`` itself when not wrapped)."""
    try:
        return inspect.unwrap(obj)
    except Exception:  # a cycle of __wrapped__, or an object whose __getattr__ misbehaves
        return obj


def wrapper_layers(obj) -> int:
    """How many ``__wrapped__`` links lead from ``obj`` to the function written with ``def``."""
    chain: list = []
    inspect.unwrap(obj, stop=chain.append)  # called once per wrapper; append returns None: never stops
    return len(chain)


def function_source(fn, ns: dict) -> str | None:
    """``def`` text of a notebook function, its decorator lines included (``inspect`` unwraps)."""
    try:
        return _dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        pass
    found = _history_nodes(fn.__name__, ns, (ast.FunctionDef, ast.AsyncFunctionDef))
    return found[0].text if found else None


@dataclass
class Candidate:
    """One place a class of this name is defined: its text and where it was found."""

    text: str
    node: ast.ClassDef
    file: str | None = None
    span: tuple[int, int] | None = None  # first (decorators included) and last line in ``file``
    cell: int = 0  # newer definitions have larger numbers


@dataclass
class Difference:
    """A member where the live class and its source disagree."""

    name: str
    kind: str  # "changed", "added", "replaced" or "deleted"
    value: object = None


def class_source(cls, ns: dict) -> tuple[str, list[Difference]] | None:
    """The text that defines ``cls`` and how the live class differs from it (None: no text found).

    Candidates: the ``class`` statement around one of its methods (exact, it is where the
    method's code came from), else ``inspect``, else every definition in the input history.
    The newest one that matches the live class wins; when none matches, the closest one is
    returned with its differences.
    """
    candidates = _around_methods(cls) or _from_inspect(cls) or _history_nodes(cls.__name__, ns, ast.ClassDef)
    if not candidates:
        return None
    scored = [(c, differences(cls, c)) for c in candidates]
    matching = [c for c, diff in scored if not diff]
    if matching:
        return _one_of(cls, matching), []
    best, diff = min(scored, key=lambda item: len(item[1]))
    return best.text, diff


def _one_of(cls, matching: list[Candidate]) -> str:
    """The newest matching text; two different ones in the same cell cannot be told apart."""
    newest = [c for c in matching if c.cell == matching[0].cell]
    if len({c.text for c in newest}) > 1:
        raise CaptureError(
            f"class {cls.__name__!r}", "it is defined more than once in one cell (in branches of an `if`?) and "
            "distlab cannot tell which definition ran",
            "Define it once at the top level of a cell, or move it to a .py module and import it.",
        )
    return newest[0].text


# --- finding candidates ------------------------------------------------------------------------

def _around_methods(cls) -> list[Candidate]:
    """The ``class`` statement that contains one of the class's own methods, in that method's cell."""
    for member in vars(cls).values():
        func = _function_of(member)
        if func is None or not func.__qualname__.startswith(cls.__qualname__ + "."):
            continue
        code = func.__code__
        lines = linecache.getlines(code.co_filename)
        around = [n for n in _nodes("".join(lines), ast.ClassDef, cls.__name__)
                  if _first_line(n) <= code.co_firstlineno <= n.end_lineno]
        if around:  # the last one is the innermost (ast.walk goes level by level)
            return [_candidate(lines, around[-1], file=code.co_filename)]
    return []


def _from_inspect(cls) -> list[Candidate]:
    """``inspect.getsource`` finds classes in real files (and in kernels from Python 3.13 on)."""
    try:
        text = _dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return []
    return [Candidate(text, node) for node in _nodes(text, ast.ClassDef, cls.__name__)[:1]]


def _history_nodes(name: str, ns: dict, kind) -> list[Candidate]:
    """Every definition of ``name`` in the kernel's inputs (``In``), at any depth, newest cell first."""
    found = []
    for index, cell in reversed(list(enumerate(ns.get("In") or []))):
        lines = cell.splitlines(True)
        found += [_candidate(lines, node, cell=index) for node in _nodes(cell, kind, name)]
    return found


def _nodes(text: str, kind, name: str) -> list:
    """Definitions of ``name`` (of type ``kind``) anywhere in ``text``; none when it does not parse."""
    tree = _parse(text)
    return [n for n in ast.walk(tree) if isinstance(n, kind) and n.name == name] if tree else []


def _candidate(lines: list[str], node, **where) -> Candidate:
    """The definition ``node`` as text, decorators included; ``where``: its file or input cell."""
    first = _first_line(node)
    text = _dedent("".join(lines[first - 1:node.end_lineno]))
    tree = _parse(text)
    if tree is None:  # dedent could not remove the indentation (a string literal at column 0)
        text = ast.unparse(node) + "\n"
        tree = ast.parse(text)
    return Candidate(text, tree.body[0], span=(first, node.end_lineno), **where)


def _first_line(node) -> int:
    return min([node.lineno] + [d.lineno for d in node.decorator_list])


def _parse(text: str):
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def _dedent(text: str) -> str:
    text = textwrap.dedent(text)
    return text if text.endswith("\n") else text + "\n"


# --- comparing a candidate with the live class -------------------------------------------------

def differences(cls, candidate: Candidate) -> list[Difference]:
    """Members where ``cls`` is not what ``candidate``'s class body defines, in source order."""
    defined, annotated = _body_names(candidate.node)
    live = vars(cls)
    found = []
    for name, value_node in defined.items():
        if name not in live:  # a missing method or public plain value was deleted; other members may be
            # dropped by the class machinery itself (dataclass's field(...), Enum's _ignore_)
            if value_node == "def" or (not name.startswith("_") and _is_literal_node(value_node)):
                found.append(Difference(name, "deleted"))
        elif value_node == "def":
            if not _comes_from(live[name], cls, candidate):
                found.append(Difference(name, "replaced", live[name]))
        elif _differs_from_literal(live[name], value_node):
            found.append(Difference(name, "changed", live[name]))
    for name, value in live.items():
        if name in defined or name in annotated or isinstance(value, DESCRIPTOR_TYPES):
            continue
        if _is_cell_function(_function_of(value), cls) or not name.startswith("_"):
            found.append(Difference(name, "added", value))
    return found


def _body_names(node: ast.ClassDef) -> tuple[dict, set]:
    """Names the class body binds: ``"def"`` for functions, else the assigned expression; and
    names only annotated (``x: int``), which dataclasses and NamedTuple turn into members."""
    defined, annotated = {}, set()
    for stmt in node.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined[stmt.name] = "def"
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    defined[target.id] = stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if stmt.value is None:
                annotated.add(stmt.target.id)
            else:
                defined[stmt.target.id] = stmt.value
    return defined, annotated


def _is_literal_node(value_node) -> bool:
    try:
        ast.literal_eval(value_node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _differs_from_literal(live, value_node) -> bool:
    """Only plain data can be compared with source; anything else is assumed unchanged."""
    try:
        written = ast.literal_eval(value_node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    if type(live) not in LITERAL_TYPES:
        return False
    return type(live) is not type(written) or live != written


def _comes_from(member, cls, candidate: Candidate) -> bool:
    """Whether a method's code was written inside ``candidate`` (or wraps a function that was)."""
    func = _function_of(member)
    if func is None:
        return isinstance(member, type) and member.__qualname__.startswith(cls.__qualname__ + ".")
    inner = [c.cell_contents for c in (func.__closure__ or ()) if _cell_holds_function(c)]
    return any(_written_in(f, cls, candidate) for f in [func, *inner])


def _written_in(func, cls, candidate: Candidate) -> bool:
    if candidate.file is None:
        return func.__qualname__.startswith(cls.__qualname__ + ".")
    code = func.__code__
    return code.co_filename == candidate.file and candidate.span[0] <= code.co_firstlineno <= candidate.span[1]


def _cell_holds_function(cell) -> bool:
    try:
        return inspect.isfunction(cell.cell_contents)
    except ValueError:  # an empty cell
        return False


def _function_of(member):
    """The plain function behind a method, property, cached_property or wrapper (staticmethod and
    classmethod objects have ``__wrapped__`` since Python 3.10)."""
    for attribute in ("fget", "func"):
        inner = getattr(member, attribute, None)
        if inspect.isfunction(inner):
            member = inner
            break
    member = unwrap(member)
    return member if inspect.isfunction(member) else None


def _is_cell_function(func, cls) -> bool:
    """A function written in the class's own notebook (not made from text by a decorator, like
    dataclass's ``__init__``, nor a library's, like NamedTuple's ``_make``)."""
    if func is None or func.__module__ != cls.__module__:
        return False
    return bool(linecache.getlines(func.__code__.co_filename))
