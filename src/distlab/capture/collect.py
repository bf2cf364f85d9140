"""Notebook code -> a readable worker script. Pure: reads objects and source, starts nothing.

``torch.multiprocessing.spawn`` pickles ``fn`` by reference (``__main__.fn``), and a fresh
interpreter has no notebook ``__main__`` to find it in. So distlab writes the code itself into
a script: the function, the notebook classes and helpers it uses (found by the global names
its bytecode loads, annotations and decorators included), the imports and aliases those names
come from, and simple constants. Values that are not source (tensors, objects) travel next to
the script as a data file.
"""
from __future__ import annotations
import __future__

import ast
import builtins
import dis
import functools
import importlib
import inspect
import io
import pickle
import sys
import types
from dataclasses import dataclass, field

from distlab.capture import source
from distlab.capture.source import is_literal  # noqa: F401  (part of this module's interface)
from distlab.errors import CaptureError

FUTURE_ANNOTATIONS = __future__.annotations.compiler_flag


@dataclass
class Captured:
    """Everything a worker script needs, in the order it must appear."""

    entry: str
    imports: list[str] = field(default_factory=list)
    constants: list[str] = field(default_factory=list)
    definitions: list[str] = field(default_factory=list)
    values: dict[str, object] = field(default_factory=dict)
    call: str = ""  # the name of a rebuilt functools.partial for main(); empty: main() calls the entry
    bind: str = ""  # the line that rebuilds a functools.partial, after the values are loaded
    future_annotations: bool = False  # the notebook compiled with `from __future__ import annotations`
    _seen: set = field(default_factory=set, repr=False)

    def add(self, section: list[str], line: str) -> None:
        if line not in section:
            section.append(line)


def capture(fn, args: tuple = ()) -> Captured:
    """Collect ``fn`` and everything it reaches from the notebook's globals (``fn.__globals__``).

    ``fn`` may be decorated (``functools.wraps``) or a ``functools.partial`` of such a function.
    """
    func = fn.func if isinstance(fn, functools.partial) else fn
    ns = source.unwrap(func).__globals__
    cap = Captured(entry=func.__name__)
    cap.future_annotations = ns.get("annotations") is __future__.annotations
    _visit(func, ns, cap)
    if isinstance(fn, functools.partial):
        _bind_partial(fn, ns, cap)
    for cls in notebook_classes_in(args, ns):
        _visit(cls, ns, cap)
    return cap


def _bind_partial(partial: functools.partial, ns: dict, cap: Captured) -> None:
    """Rebuild ``functools.partial(fn, ...)`` in the script: inline when its arguments are literals."""
    name = f"{cap.entry}_partial"
    cap.add(cap.imports, "import functools")
    if is_literal((partial.args, partial.keywords)) and all(k.isidentifier() for k in partial.keywords):
        bound = [repr(a) for a in partial.args] + [f"{k}={v!r}" for k, v in partial.keywords.items()]
        cap.bind = f"{name} = functools.partial({', '.join([cap.entry, *bound])})"
    else:
        what = f"the arguments functools.partial binds to {cap.entry!r}"
        for cls in notebook_classes_in((partial.args, partial.keywords), ns, what):
            _visit(cls, ns, cap)
        cap.values[f"{name}_args"] = compact(partial.args)
        cap.values[f"{name}_keywords"] = compact(partial.keywords)
        cap.bind = f"{name} = functools.partial({cap.entry}, *{name}_args, **{name}_keywords)"
    cap.call = name


def _visit(obj, ns: dict, cap: Captured) -> None:
    """Add ``obj`` (a notebook function or class) after everything its source refers to."""
    if id(obj) in cap._seen:
        return
    cap._seen.add(id(obj))
    if inspect.isclass(obj):
        text, differences = _class_text(obj, ns)
    else:
        text, differences = _function_text(obj, ns, cap), []
    _resolve_names(text, ns, cap)
    patches = [_patch(obj, d, ns, cap) for d in differences]
    if patches:
        text += "# changed in the notebook after the class was defined:\n" + "".join(p + "\n" for p in patches)
    cap.add(cap.definitions, text)


def _resolve_names(text: str, ns: dict, cap: Captured) -> None:
    for used in global_names(text):
        if used in ns:  # else a builtin, or a name the code defines at run time
            _resolve(used, ns[used], ns, cap)


def _resolve(name: str, value, ns: dict, cap: Captured) -> None:
    if isinstance(value, types.ModuleType):
        cap.add(cap.imports, import_line(value.__name__, None, name, reached_by_attributes(value.__name__)))
    elif is_notebook_object(value, ns):
        _visit(value, ns, cap)
        if value.__name__ != name:  # an alias: after the definition it names
            cap.add(cap.definitions, f"{name} = {value.__name__}\n")
    elif (where := importable_location(value)) is not None:
        cap.add(cap.imports, import_line(where[0], where[1], name))
    elif is_literal(value):
        cap.add(cap.constants, f"{name} = {value!r}")
    else:
        for cls in notebook_classes_in(value, ns, f"the global {name!r} ({type(value).__name__})"):
            _visit(cls, ns, cap)
        cap.values[name] = compact(value)


def global_names(text: str) -> list[str]:
    """Global names the code loads, in order of first use (bytecode, so locals never count).

    Compiled without this module's own ``from __future__ import annotations`` (``dont_inherit``):
    with it, annotations would be strings and the names they use would never be shipped.
    """
    return list(_global_names(text))


@functools.lru_cache(maxsize=256)
def _global_names(text: str) -> tuple[str, ...]:
    """Cached by text: a cell that launches the same function again (a loop over world sizes, a
    rerun) does not compile and disassemble it again (2-3 ms a launch)."""
    found: dict[str, None] = {}
    stack = [compile(text, "<distlab-capture>", "exec", dont_inherit=True)]
    while stack:
        code = stack.pop(0)
        instructions = list(dis.get_instructions(code))
        stored = {i.argval for i in instructions if i.opname == "STORE_NAME"}
        for ins in instructions:
            if ins.opname == "LOAD_GLOBAL" or (ins.opname == "LOAD_NAME" and ins.argval not in stored):
                if not (ins.argval.startswith("__") and ins.argval.endswith("__")):
                    found.setdefault(ins.argval)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return tuple(n for n in found if not hasattr(builtins, n))


def is_notebook_object(value, ns: dict) -> bool:
    """Functions and classes defined in the notebook's own namespace (module ``__main__``),
    also behind a ``functools.wraps`` decorator (``lru_cache``, ``torch.no_grad()``)."""
    target = source.unwrap(value)
    if not (inspect.isfunction(target) or inspect.isclass(target)):
        return False
    return target.__module__ == ns.get("__name__")


def importable_location(value) -> tuple[str, str] | None:
    """(module, qualname) when a fresh interpreter can import ``value`` by name."""
    try:
        module, qualname = value.__module__, value.__qualname__
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception:
        return None
    return (module, qualname) if obj is value else None


def reached_by_attributes(module: str, modules=None) -> bool:
    """Whether ``import a.b.c as x`` binds module ``a.b.c``: Python finds it by attribute lookups from ``a``,
    and a package attribute of the same name hides a subpackage (``distlab.launch``, the function, hides the
    package ``distlab.launch``, so ``import distlab.launch.compat as compat`` fails in the worker)."""
    modules = sys.modules if modules is None else modules
    top, *rest = module.split(".")
    found = modules.get(top)
    for part in rest:
        found = getattr(found, part, None)
    return found is not None and found is modules.get(module)


def import_line(module: str, qualname: str | None, name: str, reachable: bool = True) -> str:
    """The line that binds ``name`` as the notebook had it. ``reachable``: a module is found by
    attributes from its top package (:func:`reached_by_attributes`); if not, importlib imports it."""
    if qualname is None:
        if module == name:
            return f"import {module}"
        if not reachable:
            return f"import importlib; {name} = importlib.import_module({module!r})"
        return f"import {module} as {name}"
    head = qualname.split(".")[0]
    if head != qualname:
        return f"from {module} import {head}; {name} = {qualname}"
    return f"from {module} import {qualname}" if qualname == name else f"from {module} import {qualname} as {name}"


def notebook_classes_in(value, ns: dict, what: str = "an argument") -> list:
    """Notebook classes/functions a pickled value refers to; the script defines them before loading it.

    Pickling once here also proves the value can travel: what cannot raises a CaptureError naming it.
    A pickler hook sees every object pickled by reference (pickle memoises the module name, so
    scanning the bytes for ``__main__`` would miss all but the first reference).
    """
    found: list = []

    class Finder(pickle.Pickler):
        def reducer_override(self, obj):  # called for an instance's class too (it is pickled by reference)
            if is_notebook_object(obj, ns) and all(obj is not f for f in found):
                found.append(obj)
            return NotImplemented

    try:
        Finder(io.BytesIO()).dump(value)
    except Exception as e:
        raise CaptureError(
            what, f"it is neither source code nor picklable ({type(e).__name__}: {e})",
            "Create it inside the function instead, or pass something picklable through args=.",
        ) from e
    return found




# --- source of functions and classes ---------------------------------------------------------

def _function_text(fn, ns: dict, cap: Captured) -> str:
    """A notebook function's ``def``, with its decorator lines; refused when that text would not
    make the same function on the workers (a closure, a lambda, a wrapper applied by hand)."""
    name = fn.__name__
    if name == "<lambda>":
        raise CaptureError("a lambda", "a lambda has no name to call it by in a script", "Define it with def.")
    written = source.unwrap(fn)
    if written.__code__.co_freevars:
        raise CaptureError(
            f"function {name!r}", f"it is a closure over {', '.join(written.__code__.co_freevars)}",
            "Define it at the top level of a cell and pass those values through args= "
            "(a decorator must use functools.wraps for distlab to ship what it decorates).",
        )
    cap.future_annotations |= bool(written.__code__.co_flags & FUTURE_ANNOTATIONS)
    text = source.function_source(fn, ns)
    if text is None:
        raise _not_found("function", name)
    decorators = len(ast.parse(text).body[0].decorator_list)
    if source.wrapper_layers(fn) > decorators:
        raise CaptureError(
            f"function {name!r}", f"it is wrapped {source.wrapper_layers(fn)} time(s) but its source has "
            f"{decorators} decorator line(s): it was wrapped by a call outside its def",
            "Write the wrapper as a decorator line (@wrapper) above the def, and re-run that cell.",
        )
    return text


def _class_text(cls, ns: dict) -> tuple[str, list]:
    found = source.class_source(cls, ns)
    if found is None:
        raise _not_found("class", cls.__name__)
    return found


def _not_found(kind: str, name: str) -> CaptureError:
    return CaptureError(f"{kind} {name!r}", "its source code could not be found",
                        "Re-run the cell that defines it, or move it to a .py module and import it.")


def _patch(cls, difference, ns: dict, cap: Captured) -> str:
    """A line that makes the shipped class what the live class became after its cell ran."""
    target, value = f"{cls.__name__}.{difference.name}", difference.value
    if difference.kind == "deleted":
        return f"del {target}"
    if is_literal(value):
        return f"{target} = {value!r}"
    if inspect.isfunction(value) and is_notebook_object(value, ns) and ns.get(value.__name__) is value:
        _visit(value, ns, cap)
        return f"{target} = {value.__name__}"
    raise CaptureError(
        f"class {cls.__name__!r}",
        f"{target} was {difference.kind} after the class was defined (it is now a {type(value).__name__}), "
        "so the class's source no longer describes it and that change cannot be written as source",
        "Make the change inside the class body and re-run that cell, or move the class to a .py module.",
    )


# --- data that travels next to the script ----------------------------------------------------

def compact(value, _memo: dict | None = None):
    """``value`` with every tensor view that is smaller than its storage replaced by a copy.

    ``torch.save`` writes a tensor's whole storage: a 4-element view of a large tensor would
    write all of it. Tuples (namedtuples too), lists and dicts are searched; other objects are
    kept as they are. A tensor passed twice stays one tensor (``_memo``: id -> its copy).
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return value
    memo = {} if _memo is None else _memo
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, torch.Tensor):
        result = _compact_tensor(torch, value)
    elif type(value) in (list, tuple):
        result = type(value)(compact(v, memo) for v in value)
    elif isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        result = type(value)(*(compact(v, memo) for v in value))
    elif type(value) is dict:
        result = {k: compact(v, memo) for k, v in value.items()}
    else:
        result = value
    memo[id(value)] = result
    return result


def _compact_tensor(torch, tensor):
    try:
        stored = tensor.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):  # sparse, meta and other storage-less tensors
        return tensor
    if stored <= tensor.numel() * tensor.element_size():
        return tensor
    copy = tensor.detach().clone()
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(copy, requires_grad=tensor.requires_grad)
    return copy.requires_grad_(tensor.requires_grad)
