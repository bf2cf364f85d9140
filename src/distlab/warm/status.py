"""The status line of a running ``%%ranks`` cell: on which ranks, with what limit, each rank's state.

A cell's output used to be only what its ranks print, so a cell whose ranks print nothing stayed
blank until it ended: for a ``%%ranks --timeout 2`` cell, seconds with no sign of what runs where.
In a Jupyter frontend (JupyterLab, Notebook: :func:`distlab.view.display.live_frontend`) the cell now
starts with one line, redrawn in place (a display with an id) at most every REFRESH_S::

    distlab: ranks 0, 1 · limit 2 s · 1.3 s · rank 0 running · rank 1 done in 0.00 s
    distlab: ranks 0, 1 · limit none · 4.0 s · rank 0 running · rank 1 waiting in recv for rank 0
    distlab: ranks 0, 1 · limit 2 s · 2.0 s · limit reached: collecting where each rank is… · …

When the call succeeds the line is emptied (the cell looks as it always did); when it fails it
keeps how it ended above the error (``… · timed out at 2.13 s · rank 0 blocked in all_reduce ·
rank 1 done in 0.00 s``). Where nobody watches a cell run (nbclient: CI and the book build; a
terminal) nothing is drawn. :class:`CallStatus` is the pure part (what the line says);
:class:`LiveStatus` draws it.
"""
from __future__ import annotations

import time
import uuid

REFRESH_S = 0.25  # the line is redrawn at most this often while nothing but the clock changes
EMPTY = {"text/plain": ""}


class CallStatus:
    """What one call on some ranks is doing, as one line of text."""

    def __init__(self, ranks: list[int], limit: float | None, clock=time.monotonic):
        self.ranks, self.limit, self.clock = list(ranks), limit, clock
        self.t0 = clock()
        self.states: dict[int, str] = {r: "running" for r in self.ranks}
        self.phase = ""
        self.ended = ""

    def finished(self, rank: int, kind: str) -> None:
        """``kind`` is a reply's kind: ``done``, ``error`` (after the call was cut short: the
        interrupt stopped it) or ``died``."""
        if self.states.get(rank, "").startswith(("running", "waiting", "blocked")):
            took = self.clock() - self.t0
            raised = "stopped" if self.phase else "raised"
            said = {"done": f"done in {took:.2f} s", "error": f"{raised} at {took:.2f} s"}
            self.states[rank] = said.get(kind, "died")

    def blocked(self, rank: int, function: str) -> None:
        """The interrupt found ``rank`` waiting inside ``torch.distributed.<function>``."""
        if self.states.get(rank, "").startswith(("running", "waiting")):
            self.states[rank] = f"blocked in {function}"

    def waiting(self, rank: int, function: str, peers: list[int]) -> None:
        """``rank`` has sat in ``torch.distributed.<function>`` for a while (it said so while it
        waits, not only once an interrupt finds it there); ``peers``: the ranks it waits for."""
        if self.states.get(rank, "").startswith(("running", "waiting")):
            others = [p for p in peers if p != rank]
            who = f" for rank{'s' * (len(others) != 1)} {', '.join(map(str, others))}" if others else ""
            self.states[rank] = f"waiting in {function}{who}"

    def set_phase(self, text: str) -> None:
        """What the kernel does now that the call is cut short (collecting stacks, restarting…)."""
        self.phase = text

    def end(self, how: str) -> None:
        """The call is over: ``how`` it ended (``timed out``, ``interrupted``, ``failed``)."""
        self.ended = f"{how} at {self.clock() - self.t0:.2f} s"
        self.states = {r: ("still running" if s == "running" else s) for r, s in self.states.items()}
        self.phase = ""

    def line(self) -> str:
        limit = "none" if self.limit is None else f"{self.limit:g} s"
        head = f"distlab: rank{'s' * (len(self.ranks) != 1)} {', '.join(map(str, self.ranks))} · limit {limit}"
        now = self.ended or f"{self.clock() - self.t0:.1f} s"
        parts = [head, now] + ([self.phase] if self.phase else [])
        return " · ".join(parts + [f"rank {r} {s}" for r, s in sorted(self.states.items())])


def bundle(line: str) -> dict:
    """The line as plain text, and as HTML in which a frontend may wrap it only between its parts:
    a narrow JupyterLab column broke the plain line mid-word (``rank 1 runn`` / ``ing``)."""
    import html

    parts = "<span> · </span>".join(f'<span style="white-space: nowrap">{html.escape(p)}</span>'
                                    for p in line.split(" · "))
    return {"text/plain": line, "text/html": f'<div style="font-family: var(--jp-code-font-family, monospace); '
                                              f'font-size: var(--jp-code-font-size, 13px)">{parts}</div>'}


class LiveStatus:
    """Draws a :class:`CallStatus` as one display output of the running cell, updated in place.

    ``shower`` has ``show(bundle, display_id)`` and ``replace(bundle, display_id)``
    (:class:`distlab.view.display.IPythonDisplay`; a list-keeping fake in tests).
    """

    def __init__(self, status: CallStatus, shower=None):
        from distlab.view.display import IPythonDisplay

        self.status, self.shower = status, shower or IPythonDisplay()
        self.display_id = uuid.uuid4().hex
        self.shown = self.status.line()
        self.drawn_at = self.status.clock()
        self.shower.show(bundle(self.shown), self.display_id)

    def finished(self, rank: int, kind: str) -> None:
        self.status.finished(rank, kind)
        self.tick()

    def blocked(self, rank: int, function: str) -> None:
        self.status.blocked(rank, function)
        self.tick()

    def waiting(self, rank: int, function: str, peers: list[int]) -> None:
        self.status.waiting(rank, function, peers)
        self.tick(force=True)

    def phase(self, text: str) -> None:
        self.status.set_phase(text)
        self.tick(force=True)  # the seconds after a limit are when a learner most wants to know

    def tick(self, force: bool = False) -> None:
        """Redraw when the line changed, at most every REFRESH_S unless ``force``."""
        if not force and self.status.clock() - self.drawn_at < REFRESH_S:
            return
        line = self.status.line()
        if line != self.shown:
            self.shower.replace(bundle(line), self.display_id)
            self.shown = line
        self.drawn_at = self.status.clock()

    def end(self, how: str | None) -> None:
        """Empty the line after a call that succeeded (``how`` None); else keep how it ended."""
        if how is None:
            self.shower.replace(EMPTY, self.display_id)
            return
        self.status.end(how)
        self.tick(force=True)


class NoStatus:
    """Where no frontend watches the cell (``ranks.exec`` in a script, nbclient, a terminal)."""

    def finished(self, rank: int, kind: str) -> None:
        pass

    def blocked(self, rank: int, function: str) -> None:
        pass

    def waiting(self, rank: int, function: str, peers: list[int]) -> None:
        pass

    def phase(self, text: str) -> None:
        pass

    def tick(self, force: bool = False) -> None:
        pass

    def end(self, how: str | None) -> None:
        pass


NO_STATUS = NoStatus()
