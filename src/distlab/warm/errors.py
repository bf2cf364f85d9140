"""Errors of warm ranks (:class:`distlab.Ranks`), with their message templates.

Each message says what failed, on which rank, and the state the ranks are left in: still
usable (the process group passed a health check, every variable is kept), or restarted
(variables lost; the message lists the cells to re-run), or stopped (run ``ranks.restart()``, when
even the restart failed), or already restarted (variables lost).
"""
from __future__ import annotations

import re

from distlab.errors import DistlabError, notebook_message

RANK_RAISED = "distlab: rank {rank} raised {name} in {where}{others}.\n{traceback}{blocked}\n{state}"
OTHERS_TOO = " (rank{s} {ranks} raised too)"
RANK_DIED = "distlab: rank {rank} died{how} in {where}.\n--- last lines of its log ---\n{log}\n{state}"
BLOCKED = "\nRanks still running after that failure, and where they were:\n{stacks}"
TIMED_OUT = (
    "distlab: {where} did not finish within timeout={timeout}s on rank{s} {ranks}.\n"
    "Where each rank was:\n{stacks}\n"
    "A rank waiting in a collective usually means another rank never called it.\n{state}"
)
INTERRUPTED = "distlab: {where} was interrupted on rank{s} {ranks}.\nWhere each rank was:\n{stacks}\n{state}"
START_FAILED = "distlab: rank {rank} could not start ({problem}).\n{detail}\nNothing is left running."
STOPPED = ("distlab: these ranks were stopped ({why}). Run ranks.restart() for fresh ranks "
           "(every variable on the ranks is lost).")
CLOSED = "distlab: these ranks are closed. Start new ones with distlab.Ranks(...), or call ranks.restart()."
BUSY = "distlab: these ranks are busy with another call (from another thread); wait for it to finish."
NO_RANKS = "distlab: no warm ranks are running. Start them first, e.g. `ranks = distlab.Ranks(2)`."

NOT_ON_THE_RANKS = (
    "\n`{name}` is defined in this notebook, not on the ranks: a %%ranks cell sees only what ran on the "
    "ranks. Run the cell that defines `{name}` with %%ranks first, or call ranks.run(f) with a function f "
    "that uses it (ranks.run sends the source of what f uses)."
)

STATE_USABLE = "The ranks are still usable: the process group passed a health check and every variable is kept."
STATE_RESTARTED = ("The process group could not be recovered ({why}), so the ranks were restarted: "
                   "every variable on them is lost. {rerun}")
RERUN = "To set them up again, re-run, in this order: {calls}."
NOTHING_TO_RERUN = "Nothing had been set up on them before this call."


def not_on_the_ranks(name: str, traceback: str, notebook: dict) -> str:
    """The hint for a ``NameError`` on a rank whose name the notebook defines (else ``""``): after a
    restart, or from the middle of a notebook, a name that reached the ranks only as a side effect
    of another cell is missing there, and a bare NameError reads as a typo."""
    if name != "NameError":
        return ""
    found = re.findall(r"NameError: name '(\w+)' is not defined", traceback)
    missing = found[-1] if found else None
    return NOT_ON_THE_RANKS.format(name=missing) if missing is not None and missing in notebook else ""


def restarted(why: str, calls: list[str]) -> str:
    """What a call that broke the group says: the ranks were restarted, and what to re-run (the
    cells and calls that set the old ranks up, oldest first); one rule whatever broke them."""
    rerun = RERUN.format(calls=", ".join(calls)) if calls else NOTHING_TO_RERUN
    return STATE_RESTARTED.format(why=why, rerun=rerun)


def plural(ranks) -> dict:
    ranks = sorted(ranks)
    return {"s": "s" if len(ranks) > 1 else "", "ranks": ", ".join(map(str, ranks))}


def format_stacks(stacks: dict[int, str]) -> str:
    return "\n".join(f"--- rank {r} ---\n{s.rstrip()}" for r, s in sorted(stacks.items()))


class RankError(DistlabError, RuntimeError):
    """Code raised on a rank (or a rank died); ``rank`` is the first that failed.

    ``usable`` tells whether the ranks can take the next call without ``restart()``.
    """

    def __init__(self, message: str, rank: int, name: str, remote_traceback: str, usable: bool):
        super().__init__(message)
        self.rank, self.name, self.remote_traceback, self.usable = rank, name, remote_traceback, usable


class RanksTimeoutError(DistlabError, TimeoutError):
    """A call did not finish in time; ``stacks[rank]`` says where each rank was."""

    def __init__(self, message: str, stacks: dict[int, str], usable: bool):
        super().__init__(message)
        self.stacks, self.usable = stacks, usable


class RanksInterrupted(KeyboardInterrupt):
    """Kernel > Interrupt during a call on warm ranks: where each rank was. Still a KeyboardInterrupt.

    IPython shows ``_render_traceback_()`` instead of a traceback: the message, not distlab's frames
    (``run_cell_magic``, ``magic.py``, ``ranks.py``) above it."""

    def _render_traceback_(self) -> list[str]:
        return notebook_message("KeyboardInterrupt", str(self))


class RanksStoppedError(DistlabError, RuntimeError):
    """The ranks are stopped or closed: ``ranks.restart()`` (or new Ranks) is the way on."""


class RanksBusyError(DistlabError, RuntimeError):
    """Another thread is in a call on the same ranks; calls do not overlap."""


class RanksStartError(DistlabError, RuntimeError):
    """A rank could not start (or join the process group)."""
