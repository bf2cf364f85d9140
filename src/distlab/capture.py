"""Notebook code -> a readable worker script. Pure: reads objects and source, starts nothing.

``torch.multiprocessing.spawn`` pickles ``fn`` by reference (``__main__.fn``), and a fresh
interpreter has no notebook ``__main__`` to find it in. So distlab writes the code itself into
a script: the function, the notebook classes and helpers it uses (found by the global names
its bytecode loads), the imports and aliases those names come from, and simple constants.
Values that are not source (tensors, objects) travel next to the script as a data file.
"""
from __future__ import annotations

import ast
import builtins
import dis
import importlib
import inspect
import io
import linecache
import pickle
import re
import textwrap
import types
from dataclasses import dataclass, field

from .errors import CaptureError

LITERAL_TYPES = (int, float, complex, str, bytes, bool, type(None), tuple, list, dict, set, frozenset)
MAX_LITERAL_CHARS = 2000


@dataclass
class Captured:
    """Everything a worker script needs, in the order it must appear."""

    entry: str
    imports: list[str] = field(default_factory=list)
    constants: list[str] = field(default_factory=list)
    definitions: list[str] = field(default_factory=list)
    values: dict[str, object] = field(default_factory=dict)
    _seen: set = field(default_factory=set, repr=False)

    def add(self, section: list[str], line: str) -> None:
        if line not in section:
            section.append(line)


def capture(fn, args: tuple = (), namespace: dict | None = None) -> Captured:
    """Collect ``fn`` and everything it reaches from ``namespace`` (the notebook's globals)."""
    if fn.__code__.co_freevars:
        raise CaptureError(
            f"function {fn.__name__!r}", f"it is a closure over {', '.join(fn.__code__.co_freevars)}",
            "Define it at the top level of a cell and pass those values through args=.",
        )
    ns = fn.__globals__ if namespace is None else namespace
    cap = Captured(entry=fn.__name__)
    _visit(fn, fn.__name__, ns, cap)
    for cls in notebook_classes_in(args, ns):
        _visit(cls, cls.__name__, ns, cap)
    return cap


def _visit(obj, name: str, ns: dict, cap: Captured) -> None:
    """Add ``obj`` (a notebook function or class) after everything its source refers to."""
    if id(obj) in cap._seen:
        return
    cap._seen.add(id(obj))
    source = source_of(obj, ns)
    for used in global_names(source):
        if used not in ns:
            continue  # a builtin, or a name the code defines at run time
        _resolve(used, ns[used], ns, cap)
    cap.add(cap.definitions, source)


def _resolve(name: str, value, ns: dict, cap: Captured) -> None:
    if isinstance(value, types.ModuleType):
        cap.add(cap.imports, import_line(value.__name__, None, name))
    elif is_notebook_object(value, ns):
        _visit(value, value.__name__, ns, cap)
        if value.__name__ != name:
            cap.add(cap.constants, f"{name} = {value.__name__}")
    elif (where := importable_location(value)) is not None:
        cap.add(cap.imports, import_line(where[0], where[1], name))
    elif is_literal(value):
        cap.add(cap.constants, f"{name} = {value!r}")
    else:
        for cls in notebook_classes_in(value, ns, f"the global {name!r} ({type(value).__name__})"):
            _visit(cls, cls.__name__, ns, cap)
        cap.values[name] = value


def global_names(source: str) -> list[str]:
    """Global names the code loads, in order of first use (bytecode, so locals never count)."""
    found: dict[str, None] = {}
    stack = [compile(source, "<distlab-capture>", "exec")]
    while stack:
        code = stack.pop(0)
        instructions = list(dis.get_instructions(code))
        stored = {i.argval for i in instructions if i.opname == "STORE_NAME"}
        for ins in instructions:
            if ins.opname == "LOAD_GLOBAL" or (ins.opname == "LOAD_NAME" and ins.argval not in stored):
                if not (ins.argval.startswith("__") and ins.argval.endswith("__")):
                    found.setdefault(ins.argval)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return [n for n in found if not hasattr(builtins, n)]


def is_notebook_object(value, ns: dict) -> bool:
    """Functions and classes defined in the notebook's own namespace (module ``__main__``)."""
    if not (inspect.isfunction(value) or inspect.isclass(value)):
        return False
    return getattr(value, "__module__", None) == ns.get("__name__", "__main__")


def importable_location(value) -> tuple[str, str] | None:
    """(module, qualname) when a fresh interpreter can import ``value`` by name."""
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception:
        return None
    return (module, qualname) if obj is value else None


def import_line(module: str, qualname: str | None, name: str) -> str:
    if qualname is None:
        if module == name:
            return f"import {module}"
        return f"import {module} as {name}"
    head = qualname.split(".")[0]
    if head != qualname:
        return f"from {module} import {head}; {name} = {qualname}"
    return f"from {module} import {qualname}" if qualname == name else f"from {module} import {qualname} as {name}"


def is_literal(value) -> bool:
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


def notebook_classes_in(value, ns: dict, what: str = "an argument") -> list:
    """Notebook classes/functions a pickled value refers to; the script defines them before loading it.

    Pickling once here also proves the value can travel: what cannot raises a CaptureError naming it.
    A pickler hook sees every object pickled by reference (pickle memoises the module name, so
    scanning the bytes for ``__main__`` would miss all but the first reference).
    """
    found: list = []

    class Finder(pickle.Pickler):
        def reducer_override(self, obj):
            for candidate in (obj, type(obj)):
                if is_notebook_object(candidate, ns) and all(candidate is not f for f in found):
                    found.append(candidate)
            return NotImplemented

    try:
        Finder(io.BytesIO()).dump(value)
    except Exception as e:
        raise CaptureError(
            what, f"it is neither source code nor picklable ({type(e).__name__}: {e})",
            "Create it inside the function instead, or pass something picklable through args=.",
        ) from e
    return found


# --- source recovery -------------------------------------------------------------------------

def source_of(obj, ns: dict) -> str:
    """Source of a notebook function or class.

    Functions: ``inspect.getsource`` (IPython registers each cell in ``linecache``).
    Classes: on Python 3.11 ``getsource`` raises ``OSError`` for a class made in a kernel cell,
    so find its ``class`` line above one of its methods in that cell's ``linecache`` entry,
    and last of all search the kernel's input history (``In``).
    """
    if getattr(obj, "__name__", "") == "<lambda>":
        raise CaptureError("a lambda", "a lambda has no name to call it by in a script", "Define it with def.")
    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        pass
    if inspect.isclass(obj) and (text := _class_source_from_methods(obj)):
        return text
    if text := _source_from_history(obj.__name__, ns):
        return text
    raise CaptureError(
        f"{'class' if inspect.isclass(obj) else 'function'} {obj.__name__!r}",
        "its source code could not be found",
        "Re-run the cell that defines it, or move it to a .py module and import it.",
    )


def _class_source_from_methods(cls) -> str | None:
    pattern = re.compile(rf"^\s*class\s+{re.escape(cls.__name__)}\b")
    for member in vars(cls).values():
        func = getattr(member, "__func__", getattr(member, "fget", member))
        code = getattr(func, "__code__", None)
        if code is None or not func.__qualname__.startswith(cls.__qualname__ + "."):
            continue
        lines = linecache.getlines(code.co_filename)
        for start in range(min(code.co_firstlineno, len(lines)) - 1, -1, -1):
            if pattern.match(lines[start]):
                while start > 0 and lines[start - 1].lstrip().startswith("@"):
                    start -= 1
                return textwrap.dedent("".join(inspect.getblock(lines[start:])))
    return None


def _source_from_history(name: str, ns: dict) -> str | None:
    """The last kernel input that defines ``name`` at top level (IPython keeps them in ``In``)."""
    for cell in reversed(ns.get("In", []) or []):
        try:
            tree = ast.parse(cell)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                return "\n".join(cell.splitlines()[first - 1:node.end_lineno]) + "\n"
    return None
