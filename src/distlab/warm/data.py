"""Values between the kernel and warm ranks: what ``push``, ``scatter``, ``pull`` and ``gather`` send. Pure.

Two verbs, so that a list is never guessed at:

- ``ranks.push(x=v)``: every selected rank gets the same ``v`` (a list stays a list on each rank);
- ``ranks.scatter(x=[v0, v1])``: one value per rank, in the order of the selected ranks (or a dict
  ``{rank: value}``), as ipyparallel's and ``dist.scatter``'s one-piece-per-rank.

Values are pickled here, in the kernel, and sent over each rank's private pipe with the request
(:mod:`distlab.warm.proto`): no file, no socket anyone else could open. A value that cannot be
pickled fails here, before anything is sent, with its name in the error.
"""
from __future__ import annotations

import inspect
import keyword
import pickle

from distlab.errors import CaptureError, LaunchArgumentError

PREDEFINED = ("torch", "dist", "rank", "world_size", "device")  # what every rank needs to stay usable


def check_names(names, what: str) -> list[str]:
    """Names a rank can hold: identifiers, not keywords; and, to set (push, scatter), not the predefined ones."""
    names = list(names)
    if not names:
        example = 'ranks.pull("x")' if what == "pull" else f"ranks.{what}(x=...)"
        raise LaunchArgumentError(what, names, "names no variable", f"For example {example}.")
    for name in names:
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise LaunchArgumentError(what, name, "is not a Python variable name")
        if name in PREDEFINED and what != "pull":
            raise LaunchArgumentError(what, name, "is predefined on every rank and must stay as it is",
                                      "Choose another name.")
    return names


def merge(namespace, values: dict, what: str) -> dict:
    """``push({"ranks": 1}, y=2)`` -> ``{"ranks": 1, "y": 2}``: a dict holds names that clash with keywords."""
    if namespace is not None and not isinstance(namespace, dict):
        raise LaunchArgumentError(what, namespace, f"the positional argument must be a dict of names, not "
                                  f"{type(namespace).__name__}", f"For example ranks.{what}(x=...).")
    both = {**(namespace or {}), **values}
    check_names(both, what)
    return both


def pack(values: dict) -> bytes:
    """Pickle ``{name: value}``; a value that cannot travel is named before anything is sent.

    A function or class defined in the notebook pickles here (by reference, ``__main__.name``) but
    a rank cannot find it: it is refused with the same error as a lambda. (``ranks.push`` sends a
    notebook function's source instead, before it gets here; a class alone it cannot.)"""
    for name, value in values.items():
        if _defined_in_notebook(value):
            kind = "class" if isinstance(value, type) else "function"
            raise CaptureError(f"the value of {name!r}", f"{value.__name__} is a {kind} defined in the notebook, "
                               "and a rank has no notebook to find it in",
                               f"Define it on the ranks: run the cell that defines {value.__name__} with %%ranks, "
                               "or call ranks.run(f) with a function f that uses it (both send its source).")
    try:
        return pickle.dumps(values)
    except Exception:
        pass  # find which value it was (pickling twice costs time only on this path)
    for name, value in values.items():
        try:
            pickle.dumps(value)
        except Exception as e:
            raise CaptureError(f"the value of {name!r}", f"it cannot be pickled ({type(e).__name__}: {e})",
                               "Send data (tensors, numbers, lists, dicts); define functions and classes on "
                               "the ranks instead (a %%ranks cell or ranks.run).") from None
    return pickle.dumps(values)


def notebook_function(value) -> bool:
    """A function defined in the notebook: ``ranks.push`` sends its source (:func:`distlab.warm.ranks.shipped`)."""
    return inspect.isfunction(value) and getattr(value, "__module__", None) == "__main__"


def _defined_in_notebook(value) -> bool:
    return (inspect.isfunction(value) or inspect.isclass(value)) and getattr(value, "__module__", None) == "__main__"


def split(values: dict, selected: list[int]) -> dict[int, dict]:
    """``scatter``'s ``{name: one value per rank}`` -> ``{rank: {name: its value}}``."""
    per_rank: dict[int, dict] = {r: {} for r in selected}
    for name, value in values.items():
        for rank, piece in _pieces(name, value, selected).items():
            per_rank[rank][name] = piece
    return per_rank


def _pieces(name: str, value, selected: list[int]) -> dict:
    n = len(selected)
    if isinstance(value, dict):
        if set(value) != set(selected):  # (not sorted(): keys of mixed types, {0: x, 'a': y}, would raise TypeError)
            raise LaunchArgumentError(name, value, f"a dict to scatter needs one key per selected rank, "
                                      f"exactly {selected}, not {sorted(value, key=repr)}")
        return dict(value)
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise LaunchArgumentError(name, _short(value), f"scatter needs one value per selected rank: "
                                      f"{n} value{'s' * (n != 1)}, not {len(value)}",
                                      "To give every rank the same value, use ranks.push.")
        return dict(zip(selected, value, strict=True))
    raise LaunchArgumentError(name, _short(value), f"scatter needs a list (one value per rank, {n} here) or a "
                              f"dict {{rank: value}}, not {type(value).__name__}",
                              "A tensor: list(t.chunk(n)). The same value everywhere: ranks.push.")


class _short:  # noqa: N801 (reads as a function at the call sites)
    """A value in an error message, its repr cut at 80 characters."""

    def __init__(self, value):
        self.text = repr(value)

    def __repr__(self) -> str:
        return self.text if len(self.text) <= 80 else self.text[:80] + "..."
