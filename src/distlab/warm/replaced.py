"""Ranks a notebook replaced end with the cell that replaced them (kernel).

Outside IPython, re-running ``ranks = distlab.Ranks(2)`` drops the last reference to the old
:class:`~distlab.warm.ranks.Ranks`, and its finalizer ends the old ranks at once. In a notebook, a
cell that showed ``ranks`` left it in IPython's output history (``Out``, ``_``, ``_7``, the display
hook), so each re-run left one more group of idle ranks holding memory and cores. IPython's history
is not the learner's: after each cell, a Ranks that a notebook variable named after an earlier cell,
that no variable names now and that nothing but IPython's history still holds is closed. Anything
else that holds it (``old = ranks``, a list, a running frame) keeps it open, as it would in Python.
"""
from __future__ import annotations

import functools
import gc
import re
import sys
import weakref

# IPython's own names for its history: _, __, ___, _7, _i, _ii, _iii, _i7, In, Out, _ih, _oh, _dh
HISTORY_NAME = re.compile(r"_{1,3}|_\d+|_i{1,3}|_i\d+|In|Out|_ih|_oh|_dh")
_named: weakref.WeakSet = weakref.WeakSet()  # open Ranks a notebook variable named after the last cell
_watched: weakref.WeakSet = weakref.WeakSet()  # shells whose cells end with end_replaced


def watch(open_ranks) -> None:
    """In an IPython shell, check after every cell for replaced Ranks (registered once per shell).

    ``open_ranks``: a function returning every open Ranks (passed in: this module does not import
    :mod:`distlab.warm.ranks`, which imports it).
    """
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or shell in _watched:
        return
    shell.events.register("post_run_cell", functools.partial(end_replaced, shell, open_ranks))
    _watched.add(shell)


def end_replaced(shell, open_ranks, result=None) -> None:
    """Close each Ranks the notebook named before this cell, names no longer, and holds only in history."""
    for ref in _let_go(shell.user_ns, open_ranks):
        ranks = ref()
        if ranks is not None and held_only_by_history(ranks, shell):
            ranks.close()


def _let_go(user_ns: dict, open_ranks) -> list:
    """Weak references to the open Ranks a variable named after the last cell but none names now.

    Weak, so that the caller's frame is not one more holder when :func:`held_only_by_history` looks.
    """
    alive = {id(r): r for r in open_ranks() if r.state != "closed"}
    named = {id(value) for name, value in list(user_ns.items())
             if id(value) in alive and not HISTORY_NAME.fullmatch(name)}
    dropped = [weakref.ref(r) for key, r in alive.items() if key not in named and r in _named]
    _named.clear()
    _named.update(alive[key] for key in named)
    return dropped


def held_only_by_history(obj, shell) -> bool:
    """True when every object that refers to ``obj`` is part of IPython's history (or this module).

    ``gc.get_referrers`` sees containers, instances and frame objects; the caller checked that no
    notebook variable names ``obj`` (the namespace holds it under history names only).
    """
    from IPython.core.displayhook import DisplayHook
    from IPython.core.interactiveshell import ExecutionResult

    history = (shell.user_ns, getattr(shell, "user_ns_hidden", None), shell.history_manager.output_hist)
    for holder in gc.get_referrers(obj):
        if any(holder is h for h in history) or isinstance(holder, (DisplayHook, ExecutionResult)):
            continue
        if _is_history_dict(holder, shell) or _is_own_frame(holder):
            continue
        return False
    return True


def _is_history_dict(holder, shell) -> bool:
    """The attribute dict of IPython's display hook or last result, where Python made one."""
    if not isinstance(holder, dict):
        return False
    owners = (shell.displayhook, getattr(shell, "last_execution_result", None))
    return any(getattr(owner, "__dict__", None) is holder for owner in owners)


def _is_own_frame(holder) -> bool:
    """A frame of this module (frames become objects under a debugger, a profiler or coverage)."""
    code = getattr(holder, "f_code", None)
    return code is not None and code.co_filename == __file__
