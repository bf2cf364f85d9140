"""What warm ranks and the kernel agree on. Pure: no processes, no sockets, no torch.

The kernel (:mod:`distlab.warm.ranks`) and every rank (:mod:`distlab.warm.loop`) exchange small
pickled tuples over a ``multiprocessing`` pipe. Kernel to rank::

    ("exec", req, source, filename)              run cell source; reply with its last expression
    ("run", req, units, values, entry, args)     define captured code, call entry(*args) (entry "": only define)
    ("push", req, pickled_values)                set these variables ({name: value}) in the namespace
    ("pull", req, names)                         reply with the value of a name (a tuple for several)
    ("probe", req)                               all-reduce a one: is the process group healthy?
    ("close", req)                               leave the group and exit

Rank to kernel::

    ("out", req, stream, text)       printed text, tagged with the call that printed it
    ("done", req, pickled_value)     the call finished; the value may be a Shown placeholder
    ("error", req, name, traceback)  the call raised; traceback shows the user's frames only
    ("blocked", req, function, ranks) an interrupt found it waiting in torch.distributed.<function>
                                     for these global ranks (:mod:`distlab.warm.watch`)
    ("ready", pid) / ("start-failed", traceback)   once, at start

Tagging output with the call that printed it is what keeps one cell's output out of another.
"""
from __future__ import annotations

import ast
import functools
import pickle
import traceback
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the type only: a rank never needs the capture code
    from distlab.capture.collect import Captured


OUT, DONE, ERROR, READY, START_FAILED, BLOCKED = "out", "done", "error", "ready", "start-failed", "blocked"
WAITING = "waiting"  # ("waiting", req, function, ranks): a rank sits in a collective (status only)
EXEC, RUN, PUSH, PULL, PROBE, CLOSE = "exec", "run", "push", "pull", "probe", "close"
# Names each rank owns (set when it joins the group): what a cell ships never replaces them. The
# tutorials' code sets `rank = 0` in the notebook; shipped with a function, it made every rank rank 0.
RANK_OWNED = ("rank", "world_size", "device")


# --- running source --------------------------------------------------------------------------

@functools.lru_cache(maxsize=256)
def compile_cell(source: str, filename: str):
    """(body, last_expression) code objects, like IPython: the last expression's value is shown.

    Compiled under ``filename`` with the source's own line numbers, so a traceback or a stack
    dump says ``File "Cell In[5]", line 3``: the line of the cell the learner sees. Cached:
    compiling costs more than a loopback all-reduce, and loops send the same source again.
    """
    tree = ast.parse(source, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, filename, "exec")
    return body, (compile(last, filename, "eval") if last is not None else None)


def cell_source(cell: str) -> str:
    """A ``%%ranks`` cell body padded by one line: the magic's own line is line 1 of the cell."""
    return "\n" + cell


def locate(text: str, lines: list[str]) -> int | None:
    """1-based line where ``text`` starts inside ``lines`` (a cell's lines), or None."""
    wanted = text.splitlines()
    if not wanted:
        return None
    have = [line.rstrip("\n") for line in lines]
    for start in range(len(have) - len(wanted) + 1):
        if have[start:start + len(wanted)] == wanted:
            return start + 1
    return None


def captured_head(cap: Captured) -> str:
    """Imports and constants of a capture, in the order a generated script has them; a constant
    that would replace a name each rank owns (:data:`RANK_OWNED`) is left out."""
    lines = sorted(cap.imports, key=lambda line: (line.startswith("from"), line))
    constants = [line for line in cap.constants if line.split(" = ", 1)[0] not in RANK_OWNED]
    return "\n".join(lines + constants) + "\n"


def shipped_rank_names(cap: Captured) -> list[str]:
    """The names each rank owns that ``cap`` would ship from the notebook (left out when sent)."""
    constants = {line.split(" = ", 1)[0] for line in cap.constants}
    return [name for name in RANK_OWNED if name in constants or name in cap.values]


def defined_name(source: str) -> str | None:
    """Name of the function or class a captured definition defines."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return None
    node = body[0] if body else None
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    return None


def pulled(names: tuple[str, ...], ns: dict):
    """A rank's answer to ``pull``: the value of one name, a tuple for several; a clear NameError else."""
    missing = [name for name in names if name not in ns]
    if missing:
        raise NameError(f"name {missing[0]!r} is not defined on this rank (set it in a %%ranks cell, "
                        f"or with ranks.push / ranks.scatter)")
    values = tuple(ns[name] for name in names)
    return values[0] if len(values) == 1 else values


# --- what comes back -------------------------------------------------------------------------

class Shown:
    """Stands for a rank's value that cannot travel to the kernel; shows the rank's own repr."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __call__(self, *args, **kwargs):
        raise TypeError(f"{self.text} is what a rank showed of its value, not the value: it cannot be called here. "
                        "Call it on the ranks (a %%ranks cell, or ranks.run of a function that calls it).")

    def __eq__(self, other) -> bool:
        return isinstance(other, Shown) and other.text == self.text

    __hash__ = None


def shown_text(value, text: str) -> str:
    """What stands in the kernel for a rank's ``value`` that cannot travel, shown as ``text`` (its repr): a
    function or class says that it stays on the rank, so that its repr is never taken for the thing itself."""
    if callable(value) and (isinstance(value, type) or hasattr(value, "__code__") or hasattr(value, "__func__")):
        return f"<only shown: {text}, defined on the rank, stays there>"
    return text


def load_value(data: bytes):
    """A rank's value, or a Shown saying why this kernel cannot load it."""
    try:
        return pickle.loads(data)
    except Exception as e:
        return Shown(f"<a value this kernel cannot load: {type(e).__name__}: {e}>")


class RankValues(dict):
    """``{rank: value}``, displayed one rank per line: ``[rank0] 2.0``."""

    def __repr__(self) -> str:
        return "\n".join(prefix_lines(rank, repr(value)) for rank, value in sorted(self.items()))

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(repr(self))


def prefix_lines(rank: int, text: str) -> str:
    return "\n".join(f"[rank{rank}] {line}" for line in (text.split("\n") or [""]))


def user_traceback(exc: BaseException, runtime: tuple[str, ...]) -> str:
    """The traceback without distlab's frames (files ending in ``runtime``)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.endswith(runtime)]
    text = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames)) if frames else ""
    return text + "".join(traceback.format_exception_only(type(exc), exc))


class LineJoiner:
    """Cuts a stream of text chunks into whole lines; keeps an unfinished line until later."""

    def __init__(self):
        self._partial: dict = {}

    def feed(self, key, text: str) -> list[str]:
        lines = (self._partial.pop(key, "") + text).split("\n")
        rest = lines.pop()
        if rest:
            self._partial[key] = rest
        return lines

    def take_redrawn(self, key) -> str:
        """The unfinished line of ``key`` when it redraws itself (a ``\\r`` in it: a progress bar),
        handed over now instead of at its newline, so the kernel can show the bar as it moves."""
        rest = self._partial.get(key, "")
        if "\r" not in rest:
            return ""
        del self._partial[key]
        return rest

    def drain(self) -> list[tuple[object, str]]:
        """Every unfinished line, as (key, line); called when a call ends."""
        items = sorted(self._partial.items(), key=lambda kv: repr(kv[0]))
        self._partial.clear()
        return items
