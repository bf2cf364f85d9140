"""Each rank's state and output during a run, and the static record a cell keeps when it ends. Pure.

Both are plain HTML with a text/plain fallback, never a widget: a widget is drawn from its model in
the kernel, so a notebook saved with one in it shows ``Error displaying widget: model not found``
once reopened. The live view (:func:`live_bundle`: a headline, then each rank's state and latest
lines) is one display output redrawn in place, so whatever moment a notebook is saved, the file
holds what the ranks had printed by then. When the run ends the record replaces it (one
collapsible ``<details>`` block per rank, the rank that failed first on top and open). Both render
in JupyterLab, VS Code, nbviewer, GitHub and the built book without any JavaScript.

Nothing here starts processes or imports Jupyter: the views in ``display.py`` feed a :class:`Board`
and show what this module renders, so the rendering is tested without a browser.
"""
from __future__ import annotations

import html
import pprint
from collections import deque
from dataclasses import dataclass, field

from distlab.view.streams import rendered_lines

LIVE_TAIL_LINES = 500  # kept per rank during a run (the record reads the complete log when the run ends)
LIVE_SHOWN_LINES = 40  # the live view shows this many of the latest lines, shared out among the ranks
LIVE_MIN_LINES = 3  # ... but never fewer than this many per rank
RECORD_TAIL_LINES = 200  # per rank in the saved record (the full log stays in res.logs / the run folder)
RECORD_SHOWN_LINES = 25  # of those, shown without a click: the end, where a traceback is
TEXT_TAIL_LINES = 40  # per rank in the text/plain fallback
MAX_LINE_CHARS = 1000
RETURN_CHARS = 600  # per rank in the record (res.returns holds every value whole)
OPEN_RANKS_WHEN_DONE = 4  # a successful run shows every rank's block open up to this many ranks

# No scroll boxes in the record: JupyterLab's sanitizer, GitHub and nbviewer keep or drop CSS as they
# please, so the end of a rank's output (its traceback) must be in view by structure, not by style.
PRE_STYLE = "margin:0;padding:0.3em 0.5em;line-height:1.35;white-space:pre-wrap;word-break:break-word"
FAILED_STYLE = "color:var(--jp-error-color1,#c62828);font-weight:bold"


@dataclass
class RankState:
    """What the learner should know about one rank at a glance."""

    rank: int
    phase: str = "starting"  # starting, running, done, failed, stopped, interrupted, timed out
    done_s: float | None = None  # seconds after launch when it finished (known for successful ranks)
    exitcode: int | None = None
    lines: deque = field(default_factory=lambda: deque(maxlen=LIVE_TAIL_LINES))
    count: int = 0  # lines printed in all (``lines`` keeps only the latest)
    bar_at: int | None = None  # the line (counted from 0) that a progress bar of the rank redraws
    step: int | None = None
    total: int | None = None
    metrics: dict = field(default_factory=dict)  # the latest other numbers it reported (loss, ...)
    name: str = ""  # what prints into this log when it is not one rank (a script that starts its own ranks)

    def who(self) -> str:
        """``rank 1``, or the name of what printed into this log (``ddp_train.py``)."""
        return self.name or f"rank {self.rank}"

    def label(self) -> str:
        """``starting``, ``running``, ``done in 2.1 s``, ``✗ failed first (exit code 1)``, ..."""
        if self.phase == "done" and self.done_s is not None:
            return f"done in {self.done_s:.1f} s"
        if self.phase == "failed":
            code = f" (exit code {self.exitcode})" if self.exitcode is not None else ""
            return f"✗ failed first{code}"
        if self.phase == "stopped":
            return "stopped by distlab"
        return self.phase


@dataclass
class Outcome:
    """How a run ended, reduced to what the record shows."""

    kind: str  # done, failed, timed out, interrupted, ended (the engine did not say)
    wall_s: float | None = None
    failed_rank: int | None = None
    exitcode: int | None = None
    logs: dict[int, str] | None = None  # complete logs read from the run folder, when known
    returns: dict | None = None
    run_dir: str = ""
    message: str = ""  # for any other end: the first line of what the engine raised

    def headline(self, world_size: int) -> str:
        after = f" after {self.wall_s:.1f} s" if self.wall_s is not None else ""
        if self.kind == "done":
            return f"{world_size} rank{'s' * (world_size != 1)} done in {self.wall_s or 0:.1f} s"
        if self.kind == "failed":
            code = f" (exit code {self.exitcode})" if self.exitcode is not None else ""
            return f"rank {self.failed_rank} failed first{code}{after}; the other ranks were stopped"
        if self.kind == "timed out":
            return f"timed out{after}; all ranks were stopped"
        if self.kind == "interrupted":  # what distlab did, and where the run is: the error's, under the record
            return f"interrupted{after}"
        return self.message or f"ended{after}"


def outcome_of(value, wall_s: float | None = None) -> Outcome:
    """Read an :class:`Outcome` off what the engine returned or raised (duck-typed, so this
    module needs none of them): a RunResult, WorkerFailedError, WorkerTimeoutError or an interrupt."""
    result = getattr(value, "result", None) if isinstance(value, BaseException) else value
    logs = getattr(result, "logs", None) or None
    common = dict(wall_s=getattr(result, "wall_s", None) or wall_s, logs=logs,
                  run_dir=str(getattr(result, "run_dir", "") or ""))
    if isinstance(value, KeyboardInterrupt):
        return Outcome("interrupted", **common)
    if isinstance(value, TimeoutError):
        return Outcome("timed out", **common)
    if isinstance(value, BaseException) and hasattr(value, "rank"):
        return Outcome("failed", failed_rank=value.rank, exitcode=getattr(value, "exitcode", None), **common)
    if isinstance(value, BaseException):  # e.g. a cancelled run, or the agent itself failing
        first = (str(value).splitlines() or [""])[0].split(" Run folder: ")[0]
        return Outcome("ended", message=first.removeprefix("distlab: ") or type(value).__name__, **common)
    return Outcome("done", returns=getattr(result, "returns", None), **common)


class Board:
    """Every rank's state during a run. The view feeds it; times are seconds after launch."""

    def __init__(self, world_size: int, names: dict[int, str] | None = None):
        self.world_size = world_size
        self.names = names or {}  # rank -> what printed into its log, when not that rank (RankState.who)
        self.ranks = [RankState(r, name=self.names.get(r, "")) for r in range(world_size)]
        self.outcome: Outcome | None = None

    def line(self, rank: int, text: str) -> None:
        state = self._rank(rank)
        state.lines.append(clip(text))
        state.count += 1
        if state.phase == "starting":
            state.phase = "running"

    def progress(self, rank: int, text: str, done: bool) -> None:
        """A progress bar the rank redraws in place (:mod:`distlab.view.streams`): one line that
        changes; once done it stays as an ordinary line (an empty final state removes it)."""
        state = self._rank(rank)
        at = state.bar_at
        index = None if at is None else at - (state.count - len(state.lines))
        if index is None or not 0 <= index < len(state.lines):  # a new bar (or one scrolled out of the tail)
            self.line(rank, text)
            index, state.bar_at = len(state.lines) - 1, state.count - 1
        state.lines[index] = clip(text)
        if done:
            state.bar_at = None
            if not text and index == len(state.lines) - 1:
                state.lines.pop()
                state.count -= 1

    def metric(self, rank: int, row: dict) -> bool:
        """Keep the latest progress; True when the row carries progress (``step`` and ``total``)."""
        state = self._rank(rank)
        state.metrics.update({k: v for k, v in row.items() if k not in ("rank", "time", "step", "total")})
        if "step" not in row or "total" not in row:
            return False
        state.step, state.total = int(row["step"]), int(row["total"])
        if state.phase == "starting":
            state.phase = "running"
        return True

    def started(self, rank: int) -> bool:
        """The rank's process is up; True when that changed its state (its pane must say so too)."""
        if self._rank(rank).phase == "starting":
            self._rank(rank).phase = "running"
            return True
        return False

    def returned(self, rank: int, at_s: float) -> bool:
        state = self._rank(rank)
        if state.phase in ("starting", "running"):
            state.phase, state.done_s = "done", at_s
            return True
        return False

    def finish(self, outcome: Outcome) -> None:
        """Every rank's final state, from how the run ended."""
        self.outcome = outcome
        for state in self.ranks:
            if outcome.kind == "done":
                state.phase = "done"
                state.done_s = state.done_s if state.done_s is not None else outcome.wall_s
                if outcome.wall_s is not None and state.done_s is not None:
                    state.done_s = min(state.done_s, outcome.wall_s)  # no rank is done after the whole run
            elif outcome.kind == "failed":
                failed = state.rank == outcome.failed_rank
                state.phase = "failed" if failed else "stopped"
                state.exitcode = outcome.exitcode if failed else None
            elif outcome.kind in ("interrupted", "timed out"):
                state.phase = outcome.kind
            elif state.phase in ("starting", "running"):
                state.phase = "ended"

    def _rank(self, rank: int) -> RankState:
        while rank >= len(self.ranks):  # a script's own ranks (run_script mode="python") may be more
            self.ranks.append(RankState(len(self.ranks)))
        return self.ranks[rank]


# ---------------------------------------------------------------------------------------------- HTML
def placeholder(state: RankState) -> str:
    """What a live pane says while its rank has printed nothing: the same state as its tab."""
    if state.phase == "starting":
        return "starting…"
    if state.phase == "running":
        return "running, printed nothing yet"
    return f"{state.label()}, printed nothing"


def pane_html(lines, total: int, placeholder: str = "") -> str:
    """A rank's latest lines in the live view, the ones before them counted (the record shows them)."""
    lines = list(lines)
    if not lines:
        return f'<div style="opacity:0.6;padding:0.3em 0.5em"><i>{html.escape(placeholder)}</i></div>'
    hidden = total - len(lines)
    note = f"… {hidden} earlier line{'s' * (hidden != 1)} not shown\n" if hidden > 0 else ""
    return f'<pre style="{PRE_STYLE}">{html.escape(note + chr(10).join(lines))}</pre>'


def _output_html(lines: list[str], total: int) -> str:
    """The last lines in view; the ones before them one click away; what is older, counted."""
    if not lines:
        return '<div style="opacity:0.6;padding:0.3em 0.5em"><i>(printed nothing)</i></div>'
    earlier, shown = lines[:-RECORD_SHOWN_LINES], lines[-RECORD_SHOWN_LINES:]
    older = total - len(lines)
    parts = []
    if earlier:
        note = f"… {older} older line{'s' * (older != 1)}: res.logs or the run folder\n" if older > 0 else ""
        parts.append(f'<details class="distlab-earlier"><summary>{len(earlier) + max(older, 0)} earlier '
                     f'lines</summary><pre style="{PRE_STYLE}">{html.escape(note + chr(10).join(earlier))}</pre>'
                     "</details>")
    parts.append(f'<pre style="{PRE_STYLE}">{html.escape(chr(10).join(shown))}</pre>')
    return "".join(parts)


def record_order(board: Board) -> list[RankState]:
    """The rank that failed first on top (it is the root cause), then every rank in order. Ranks a
    script started itself (``run_script(mode="python")``) report metrics but print into the launched
    process's log: they get no block of their own."""
    shown = [s for s in board.ranks if s.rank < board.world_size or s.count]
    return sorted(shown, key=lambda s: (s.phase != "failed", s.rank))


def _is_open(board: Board, state: RankState) -> bool:
    kind = board.outcome.kind if board.outcome else "ended"
    if kind == "failed":
        return state.phase == "failed"
    if kind == "interrupted":
        return False  # the learner stopped it: the headline says so, where each rank was is a click away
    return state.count > 0 and len(board.ranks) <= OPEN_RANKS_WHEN_DONE


def _rank_lines(board: Board, state: RankState, limit: int) -> tuple[list[str], int]:
    """The rank's last ``limit`` lines: from the complete log when the engine read it, else as streamed."""
    logs = board.outcome.logs if board.outcome else None
    if logs is not None and state.rank in logs:
        lines = rendered_lines(logs[state.rank])  # a progress bar's final state, not each of its redraws
        return [clip(line) for line in lines[-limit:]], len(lines)
    return list(state.lines)[-limit:], state.count


def record_html(board: Board) -> str:
    """The static record: a headline, one ``<details>`` per rank, the return values."""
    outcome = board.outcome or Outcome("ended")
    failed = outcome.kind in ("failed", "timed out", "interrupted")
    head_style = FAILED_STYLE if outcome.kind == "failed" else "font-weight:bold"
    parts = [f'<div class="distlab-record"><div style="{head_style}">distlab: '
             f"{html.escape(outcome.headline(len(board.ranks)))}</div>"]
    for state in record_order(board):
        lines, total = _rank_lines(board, state, RECORD_TAIL_LINES)
        count = f"{total} line{'s' * (total != 1)}" if total else "no output"
        label = html.escape(state.label())
        if state.phase == "failed":
            label = f'<span style="{FAILED_STYLE}">{label}</span>'
        parts.append(f'<details{" open" * _is_open(board, state)} data-rank="{state.rank}">'
                     f"<summary>{html.escape(state.who())} · {label} · {count}</summary>"
                     f"{_output_html(lines, total)}</details>")
    if outcome.returns and not failed:
        parts.append(returns_html(outcome.returns))
    if outcome.run_dir and outcome.kind != "interrupted":  # an interrupt's error names it, right below
        parts.append(f'<div style="opacity:0.7">run folder: <code>{html.escape(outcome.run_dir)}</code></div>')
    parts.append("</div>")
    return "".join(parts)


def record_text(board: Board) -> str:
    """The same record as plain text, for front ends that show no HTML."""
    outcome = board.outcome or Outcome("ended")
    out = [f"distlab: {outcome.headline(len(board.ranks))}"]
    for state in record_order(board):
        lines, total = _rank_lines(board, state, TEXT_TAIL_LINES)
        out.append(f"--- {state.who()} · {state.label()} · {total} line{'s' * (total != 1)} ---")
        if total > len(lines):
            out.append(f"… {total - len(lines)} earlier lines not shown")
        out.extend(lines)
    if outcome.returns and outcome.kind == "done":
        out.append("returns:")
        out.extend(f"  rank {rank}: {text}" for rank, text in returns_lines(outcome.returns))
    if outcome.run_dir and outcome.kind != "interrupted":
        out.append(f"run folder: {outcome.run_dir}")
    return "\n".join(out)


def record_bundle(board: Board) -> dict:
    """A display bundle with no widget in it: what the cell keeps once the run is over."""
    return {"text/html": record_html(board), "text/plain": record_text(board)}


# ---------------------------------------------------------------------------------------------- the live view
def live_lines_per_rank(world_size: int) -> int:
    """How many of each rank's latest lines the live view shows: about a screen in all, so eight ranks
    fit as two do. There is no scroll box to scroll back in: each redraw would jump it to the end."""
    return max(LIVE_MIN_LINES, LIVE_SHOWN_LINES // max(world_size, 1))


def live_headline(board: Board, elapsed_s: float) -> str:
    """``distlab: 2 ranks · running 11 s``: whole seconds, so the clock alone redraws once a second."""
    n = len(board.ranks)
    return f"distlab: {n} rank{'s' * (n != 1)} · running {elapsed_s:.0f} s"


#: Under the live headline. The live view is redrawn in place only while this kernel runs the cell: a
#: notebook saved mid-run, or a cell whose kernel restarted, keeps its last frame for good, and a bare
#: "running 8 s" would then claim a run that is long over. This line says what such a frame is.
LIVE_NOTE = "live view as of {elapsed_s:.0f} s; the run's record replaces it when the run ends in this kernel"


def live_note(elapsed_s: float) -> str:
    """What the live view is (see :data:`LIVE_NOTE`): true in a live cell and in a frozen one alike."""
    return LIVE_NOTE.format(elapsed_s=elapsed_s)


def _heading_parts(state: RankState) -> list[str]:
    """The rank, its state as the record's summary says it, its line count, then its progress (last)."""
    parts = [state.who(), state.label()]
    if state.count:
        parts.append(f"{state.count} line{'s' * (state.count != 1)}")
    if state.total:
        shown = "  ".join(f"{k}={short_value(v)}" for k, v in state.metrics.items())
        parts.append(f"{state.step}/{state.total}" + (f"  {shown}" if shown else ""))
    return parts


def live_heading(state: RankState) -> str:
    """``rank 0 · running · 12 lines · 12/30  loss=0.5``: progress once the rank reports ``step``/``total``."""
    return " · ".join(_heading_parts(state))


def _live_rank_html(state: RankState, shown: int) -> str:
    """A rank's heading (a progress bar before its progress) and its latest ``shown`` lines."""
    parts = [html.escape(part) for part in _heading_parts(state)]
    if state.total:
        bar = f'<progress value="{min(state.step or 0, state.total)}" max="{state.total}"></progress>'
        parts[-1] = f"{bar} {parts[-1]}"
    lines = list(state.lines)[-shown:]
    return (f'<div class="distlab-rank" data-rank="{state.rank}"><div>{" · ".join(parts)}</div>'
            f"{pane_html(lines, state.count, placeholder(state))}</div>")


def live_html(board: Board, elapsed_s: float) -> str:
    """What a running cell shows, and what a notebook saved mid-run keeps: a headline, then each rank's
    state and latest lines."""
    shown = live_lines_per_rank(len(board.ranks))
    parts = [f'<div class="distlab-live"><div style="font-weight:bold">'
             f"{html.escape(live_headline(board, elapsed_s))}</div>"
             f'<div class="distlab-live-note" style="opacity:0.7;font-size:smaller">'
             f"{html.escape(live_note(elapsed_s))}</div>"]
    parts.extend(_live_rank_html(state, shown) for state in record_order(board))
    parts.append("</div>")
    return "".join(parts)


def live_text(board: Board, elapsed_s: float) -> str:
    """The same live view as plain text, for front ends that show no HTML."""
    shown = live_lines_per_rank(len(board.ranks))
    out = [live_headline(board, elapsed_s), live_note(elapsed_s)]
    for state in record_order(board):
        lines = list(state.lines)[-shown:]
        out.append(f"--- {live_heading(state)} ---")
        if state.count > len(lines):
            out.append(f"… {state.count - len(lines)} earlier lines not shown")
        out.extend(lines or [f"({placeholder(state)})"])
    return "\n".join(out)


def live_bundle(board: Board, elapsed_s: float) -> dict:
    """A display bundle with no widget in it: what a running cell shows, redrawn in place."""
    return {"text/html": live_html(board, elapsed_s), "text/plain": live_text(board, elapsed_s)}


def returns_lines(returns) -> list[tuple[object, str]]:
    """``(rank, text)`` per rank: each rank's value on its own, pretty-printed, cut only when long."""
    if not isinstance(returns, dict):
        return [("?", _short_repr(returns, RETURN_CHARS))]
    out = []
    for rank in sorted(returns, key=repr):
        text = pprint.pformat(returns[rank], width=100, compact=True, sort_dicts=False)
        if len(text) > RETURN_CHARS:
            text = text[:RETURN_CHARS] + f" … (res.returns[{rank!r}] holds all of it)"
        out.append((rank, text))
    return out


def returns_html(returns) -> str:
    """The return values, one rank per line; open when each fits on a line, else one click away."""
    rows = returns_lines(returns)
    short = all("\n" not in text and len(text) <= 100 for _, text in rows)
    body = "\n".join(f"rank {rank}: {text}" for rank, text in rows)
    return (f'<details class="distlab-returns"{" open" * short}><summary>return values '
            f"(<code>res.returns</code>)</summary><pre style=\"{PRE_STYLE}\">{html.escape(body)}</pre></details>")


def clip(line: str) -> str:
    """One line, cut to a length a browser lays out without trouble."""
    return line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + "…"


def short_value(value) -> str:
    """A reported number as a progress label shows it: floats to four significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _short_repr(value, limit: int = 400) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + " …"
