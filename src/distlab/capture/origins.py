"""Where each function of a generated worker script came from in the notebook.

A worker's traceback points into the generated script (``.../boom.py, line 14, in boom``); the
learner's code lives in a notebook cell. At launch the kernel writes ``<script>.origins.json``
beside the script: for each function and method, its line range in the script and the cell and
line it was defined at (``Cell In[3], line 2``, IPython's own words). A worker that fails adds
that place under each frame of the script, so the learner finds the cell; a warning raised on a
line of the script names that place instead of the script's line.
"""
from __future__ import annotations

import ast
import json
import linecache
import os
import re
import traceback
from pathlib import Path

SUFFIX = ".origins.json"
SCRIPT_ENTRY = "_distlab.main("  # how every generated script calls the notebook function (see script.py)


def origins_path(script: Path) -> Path:
    return Path(script).with_name(Path(script).stem + SUFFIX)


def functions_in(source: str) -> list[tuple[str, int, int]]:
    """``(qualname, first line, last line)`` of every top-level function and class method; the
    first line is that of the first decorator, as in ``code.co_firstlineno``."""
    found = []
    for node in ast.parse(source).body:
        members = [(node.name + ".", n) for n in node.body] if isinstance(node, ast.ClassDef) else [("", node)]
        for prefix, item in members:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([item.lineno] + [d.lineno for d in item.decorator_list])
                found.append((prefix + item.name, first, item.end_lineno))
    return found


def ipython_cell_label(filename: str) -> str | None:
    """``Cell In[3]`` for a file IPython compiled from a cell, the path for a real file, else None."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        named = shell.compile.format_code_name(filename) if shell is not None else None
    except Exception:
        named = None
    if named:
        return " ".join(named)
    return f'File "{filename}"' if Path(filename).is_file() else None


def origins(source: str, namespace: dict, label=ipython_cell_label) -> list[dict]:
    """For each function of the script found in ``namespace``: its script lines and notebook place."""
    out = []
    for qualname, first, last in functions_in(source):
        code = _code_of(namespace, qualname)
        where = label(code.co_filename) if code is not None else None
        if where:
            out.append({"qualname": qualname, "first": first, "last": last,
                        "where": where, "line": code.co_firstlineno})
    return out


def _code_of(namespace: dict, qualname: str):
    owner, _, name = qualname.rpartition(".")
    obj = namespace.get(owner or name)
    if owner:
        obj = getattr(obj, "__dict__", {}).get(name)
        obj = getattr(obj, "__func__", obj)  # staticmethod / classmethod
    return getattr(obj, "__code__", None)


def save(script: Path, namespace: dict, label=ipython_cell_label) -> None:
    """Write ``<script>.origins.json``; a script whose functions have no notebook place gets none.

    Only a help for reading tracebacks: if it cannot be worked out, the launch goes on without it.
    """
    try:
        found = origins(Path(script).read_text(), namespace, label)
    except Exception as e:  # e.g. an object in the namespace whose attributes raise
        import warnings

        warnings.warn(f"distlab: worker tracebacks will not name notebook cells: {e!r}", stacklevel=2)
        return
    if found:
        from distlab.folders.private import write_private

        write_private(origins_path(script), json.dumps(found, indent=1))


def place(filename: str, lineno: int, cache: dict | None = None) -> str | None:
    """``Cell In[3], line 4, in boom`` for a line of a generated script, when its origins are known."""
    cache = {} if cache is None else cache
    path = origins_path(Path(filename))
    if path not in cache:
        try:
            cache[path] = json.loads(path.read_text())
        except (OSError, ValueError):
            cache[path] = []
    inside = [o for o in cache[path] if o["first"] <= lineno <= o["last"]]
    if not inside:
        return None
    o = min(inside, key=lambda o: o["last"] - o["first"])  # the innermost: a method, not its class
    return f"{o['where']}, line {o['line'] + lineno - o['first']}, in {o['qualname']}"


FAULTHANDLER_FRAME = re.compile(r'^(\s*)File "(?P<file>[^"]+)", line (?P<line>\d+) in ')


def annotate_dump(dump: str, folder) -> str:
    """A faulthandler stack dump (a rank that hangs) with the notebook place under each frame of a
    script in the run's own ``folder``: ``File ".../stuck.py", line 18 in hang`` is followed by
    ``(from the notebook: Cell In[3], line 4, in hang)``. Frames of files elsewhere are left alone
    (an ``.origins.json`` beside them may have been written by anyone)."""
    folder, cache, lines = os.path.realpath(folder), {}, []
    for line in dump.splitlines():
        lines.append(line)
        m = FAULTHANDLER_FRAME.match(line)
        if m and os.path.dirname(os.path.realpath(m["file"])) == folder:
            where = place(m["file"], int(m["line"]), cache)
            if where:
                lines.append(f"{m.group(1)}  (from the notebook: {where})")
    return "\n".join(lines)


class _NotebookStack(traceback.StackSummary):
    """A stack that formats like Python's own (repeated frames collapse, as in a RecursionError),
    plus the notebook place under each frame of the run's own script (Python 3.11+)."""

    def format_frame_summary(self, frame) -> str:
        text = super().format_frame_summary(frame)
        ours = self._script is not None and _same_file(frame.filename, self._script)
        where = place(frame.filename, frame.lineno, self._origins) if ours else None
        return text + f"    (from the notebook: {where})\n" if where else text


def format_frames(frames, script: str | None = None) -> str:
    """``traceback.format_list`` plus, under each frame of ``script`` (the run's generated worker
    script), the notebook place. Frames of any other file are left alone: an ``.origins.json``
    beside some other ``.py`` file may have been written by anyone."""
    kept = [f for f in frames if not (f.line or "").startswith(SCRIPT_ENTRY)]  # the script's call into distlab
    stack = _NotebookStack(kept)  # (from_list would build a plain StackSummary)
    stack._origins, stack._script = {}, script
    return "".join(stack.format())


def warning_formatter(plain, script: str):
    """A ``warnings.formatwarning`` that names the notebook cell of a warning raised on a line of
    ``script`` (the run's generated worker script), in the words tracebacks use:
    ``Cell In[3], line 4, in boom: UserWarning: careful``. Any other warning is ``plain``'s.

    Without it, a warning from notebook code names a line of a script the learner never wrote.
    """
    script, cache = os.path.realpath(script), {}

    def formatwarning(message, category, filename, lineno, line=None) -> str:
        ours = isinstance(filename, str) and os.path.realpath(filename) == script
        where = place(filename, lineno, cache) if ours else None
        if where is None:
            return plain(message, category, filename, lineno, line)
        source = (linecache.getline(filename, lineno) if line is None else line).strip()
        return f"{where}: {category.__name__}: {message}\n" + (f"  {source}\n" if source else "")

    return formatwarning


def _same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)
