"""The ``%%ranks`` cell magic: run one cell on the warm ranks of the current :class:`distlab.Ranks`.

    %load_ext distlab
    ranks = distlab.Ranks(2)

    %%ranks              every rank
    %%ranks 0,2          ranks 0 and 2 only
    %%ranks --timeout 5  give up after 5 s (with each rank's stack); default: the Ranks' timeout
    %%ranks --push x,y   first copy the notebook's variables x and y to the cell's ranks (ranks.push)

Only cells that start with ``%%ranks`` go to the ranks. Their output appears live in that cell,
``[rank1] ...``; each rank's last expression is the cell's value (``{rank: value}``, shown one
rank per line). A traceback from a rank names the cell and its own line numbers. In JupyterLab the
cell starts with a status line, redrawn while it runs: its ranks, its limit, each rank's state
(:mod:`distlab.warm.status`).
"""
from __future__ import annotations

from distlab.warm.errors import RanksStoppedError
from distlab.warm.proto import cell_source
from distlab.warm.ranks import DEFAULT, current

USAGE = "usage: %%ranks [RANK,RANK,...] [--timeout SECONDS] [--push NAME,NAME,...]"


def parse_line(line: str) -> tuple[list[int] | None, object, list[str]]:
    """``"0,2 --timeout 5 --push x,y"`` -> ``([0, 2], 5.0, ["x", "y"])``; ranks None means all,
    timeout DEFAULT the Ranks' own, an empty list pushes nothing."""
    from IPython.core.error import UsageError

    words = line.replace("=", " ").split()
    ranks, timeout, push = None, DEFAULT, []
    while words:
        word = words.pop(0)
        if word in ("--timeout", "--push") and not words:
            raise UsageError(f"%%ranks: {word} needs {'a number of seconds' if word == '--timeout' else 'names'}. "
                             f"{USAGE}")
        if word == "--timeout":
            timeout = _number(words.pop(0), UsageError)
        elif word == "--push":
            push += _names(words.pop(0), UsageError)
        elif ranks is None:
            ranks = _ranks(word, UsageError)
        else:
            raise UsageError(f"%%ranks: unexpected {word!r}. {USAGE}")
    return ranks, timeout, push


def _names(text: str, error) -> list[str]:
    names = [part for part in text.split(",") if part]
    bad = [name for name in names if not name.isidentifier()]
    if bad or not names:
        raise error(f"%%ranks: --push takes variable names written x,y (no spaces), not {text!r}. {USAGE}")
    return names


def pushed_values(names: list[str], user_ns: dict) -> dict:
    """The notebook's variables ``--push`` names; a missing one is a UsageError naming it."""
    from IPython.core.error import UsageError

    missing = [name for name in names if name not in user_ns]
    if missing:
        raise UsageError(f"%%ranks --push: the notebook has no variable {missing[0]!r} (run the cell that sets it "
                         "first).")
    return {name: user_ns[name] for name in names}


def _number(text: str, error):
    if text.lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise error(f"%%ranks: --timeout must be a number of seconds or None, not {text!r}. {USAGE}") from None


def _ranks(text: str, error) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise error(f"%%ranks: ranks are written 0,2 (no spaces), not {text!r}. {USAGE}") from None


def ranks_magic(line: str, cell: str):
    """Run the cell on the ranks; return ``{rank: last expression}`` (None when no rank has one)."""
    __tracebackhide__ = True
    from IPython import get_ipython
    from IPython.core.error import UsageError

    selected, timeout, push = parse_line(line)
    try:
        ranks = current()
    except RanksStoppedError as e:
        raise UsageError(str(e)) from None  # shown as one line, no traceback
    shell = get_ipython()
    if push:
        ranks.push(pushed_values(push, shell.user_ns if shell is not None else {}), ranks=selected, timeout=timeout)
    number = shell.execution_count - 1 if shell is not None else 0  # IPython counts the cell before it runs
    values = ranks._exec(cell_source(cell), f"Cell In[{number}]", f"Cell In[{number}]", selected, timeout, live=True)
    if isinstance(values, BaseException):
        raise values  # a rank's traceback is in the message; distlab's own frames stay out of the way
    shown = type(values)({r: v for r, v in values.items() if v is not None})
    return shown or None


def register(ipython) -> None:
    ipython.register_magic_function(ranks_magic, "cell", "ranks")
