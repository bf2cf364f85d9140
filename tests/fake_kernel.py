"""Simulate a Jupyter kernel's namespace without a kernel: what capture sees in a notebook.

IPython compiles each cell under a synthetic file name registered in ``linecache``, runs it in
one shared namespace whose ``__name__`` is ``"__main__"``, and keeps the inputs in ``In``; a
``from __future__`` import in one cell holds for the cells after it (``codeop.Compile``, as IPython).
On Python 3.11 ``inspect.getsource`` of a class made this way raises ``OSError``, as in a kernel.
"""
import codeop
import linecache
import textwrap
import types
import uuid


def run_cells(*cells: str) -> dict:
    """Run cells like a kernel; returns the namespace (a module's ``__dict__``, as in IPython)."""
    ns = types.ModuleType("__main__").__dict__
    ns["In"] = [""]
    compiler = codeop.Compile()
    for cell in cells:
        source = textwrap.dedent(cell)
        filename = f"/tmp/ipykernel_0/{uuid.uuid4().hex}.py"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        ns["In"].append(source)
        exec(compiler(source, filename, "exec"), ns)
    return ns


def as_main(monkeypatch, ns: dict) -> None:
    """Make ``ns`` the process's ``__main__`` (IPython does this), so pickle finds its classes."""
    import sys

    module = types.ModuleType("__main__")
    module.__dict__.update(ns)
    monkeypatch.setitem(sys.modules, "__main__", module)
