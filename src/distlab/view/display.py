"""Where live rank output goes: a text stream (every frontend) or ipywidgets panes.

The engine calls ``line(rank, text)``, ``metric(rank, row)`` and ``close()`` on every view, and,
where a view has them, ``begin(run_dir)`` before the ranks start and ``finish(result_or_error)``
once the run is over. The widget view uses ``finish`` to swap itself for a static record
(:mod:`distlab.view.record`), so a saved notebook still shows every rank's output without a kernel.
"""
from __future__ import annotations

import sys
import threading
import time
import uuid
from pathlib import Path

from distlab.view import record
from distlab.view.bars import ProgressLines


class TextView:
    """``[rank1] line`` on stdout: works in a terminal, nbclient, JupyterLab and the built HTML.

    Progress is shown as progress, one line per bar that updates in place (:mod:`distlab.view.bars`),
    never on stderr: a rank's own bar (a tqdm redrawing its line with ``\\r``) and each rank's
    ``step``/``total`` rows from ``distlab.report``.
    """

    def __init__(self, world_size: int, stream=None, shower=None, names: dict[int, str] | None = None):
        self.world_size = world_size
        self.stream = stream
        self.names = names or {}  # who prints into a log that is not one rank's (record.Board's names)
        if shower is None and stream is None and in_kernel():
            shower = IPythonDisplay()
        self.bars = ProgressLines(stream, shower)
        self._first_time: dict[int, float] = {}

    def _label(self, rank: int) -> str:
        return self.names.get(rank, f"rank{rank}")

    def line(self, rank: int, text: str) -> None:
        self.bars.write(f"[{self._label(rank)}] {text}\n")
        (self.stream or sys.stdout).flush()

    def progress(self, rank: int, text: str, done: bool) -> None:
        """A rank's own progress bar (:mod:`distlab.view.streams`): its latest state, in place."""
        self.bars.show(("out", rank), f"[{self._label(rank)}] {text}", done)

    def metric(self, rank: int, row: dict) -> None:
        if "total" not in row or "step" not in row:
            return
        from tqdm import tqdm

        first = self._first_time.setdefault(rank, float(row.get("time", 0.0)))
        shown = ", ".join(f"{k}={_short(v)}" for k, v in row.items() if k not in ("rank", "time", "step", "total"))
        bar = tqdm.format_meter(int(row["step"]), int(row["total"]), float(row.get("time", first)) - first,
                                postfix=shown or None)
        self.bars.show(("steps", rank), f"[{self._label(rank)}] {bar}")

    def close(self) -> None:
        self.bars.close()


REFRESH_S = 0.25  # the widgets redraw at most this often: a rank printing 1000 lines/s sends 4 updates/s
SNAPSHOT_S = 2.0  # how often the saved copy under the widgets (what a notebook saved mid-run keeps) is redrawn
EMPTY = {"text/plain": ""}  # what the saved copy becomes once the record has replaced the widgets
PANE_LAYOUT = {"max_height": "24em", "overflow": "auto", "display": "flex", "flex_flow": "column-reverse"}


class IPythonDisplay:
    """How the widget view shows things: IPython's display machinery (replaced in tests)."""

    def show(self, obj, display_id: str) -> None:
        """A widget, or a mime bundle (a dict)."""
        from IPython.display import display

        display(obj, display_id=display_id, raw=isinstance(obj, dict))

    def replace(self, bundle: dict, display_id: str) -> None:
        from IPython.display import update_display

        update_display(bundle, display_id=display_id, raw=True)


class WidgetView:
    """Live: one tab per rank titled with its state, a pane that follows its latest lines, and a
    progress bar per rank once that rank reports ``step``/``total``. At the end: a static record.

    The widgets are redrawn from a small thread every ``REFRESH_S`` (never once per line), which
    also notices ranks starting (``ready/rankN``) and returning (``returns/rankN.pt``).

    A widget is drawn from its model in the kernel: a notebook saved while the run is live and
    reopened later shows ``Error displaying widget: model not found`` in its place. So a second
    output under the widgets, plain HTML, holds a copy of every rank's output so far (collapsed to
    one line, redrawn every ``SNAPSHOT_S``); the record replaces both when the run ends.
    """

    def __init__(self, world_size: int, shower=None, clock=time.monotonic, names: dict[int, str] | None = None):
        import ipywidgets as w

        self.world_size, self.clock, self.t0 = world_size, clock, clock()
        self.board = record.Board(world_size, names)
        self.shower = shower or IPythonDisplay()
        self.display_id = uuid.uuid4().hex
        self.run_dir: Path | None = None
        self.header = w.HTML(self._header_html())
        self.bars = w.VBox([])  # stays empty (draws nothing) until a rank reports progress
        self.panes = [w.HTML(record.pane_html([], 0, "starting…"), layout=PANE_LAYOUT) for _ in range(world_size)]
        self.tabs = w.Tab(children=self.panes, titles=[s.title() for s in self.board.ranks])
        self.box = w.VBox([self.header, self.bars, self.tabs])
        self._bar_widgets: dict[int, tuple] = {}
        self._dirty: set[int] = set()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._recorded = False
        self.shower.show(self.box, self.display_id)
        self.saved_id = self.display_id + "-saved"
        self._saved_at, self._saved_changes = self.clock(), False
        self.shower.show(record.snapshot_bundle(self.board, 0.0), self.saved_id)
        self._ticker = threading.Thread(target=self._tick_loop, daemon=True, name="distlab-view")
        self._ticker.start()

    # ------------------------------------------------------------------ the engine's calls
    def begin(self, run_dir) -> None:
        self.run_dir = Path(run_dir)

    def line(self, rank: int, text: str) -> None:
        with self._lock:
            self.board.line(rank, text)
            self._dirty.add(rank)

    def progress(self, rank: int, text: str, done: bool) -> None:
        """A rank's own progress bar: one line of its pane, updated in place."""
        with self._lock:
            self.board.progress(rank, text, done)
            self._dirty.add(rank)

    def metric(self, rank: int, row: dict) -> None:
        with self._lock:
            if self.board.metric(rank, row):
                self._dirty.add(rank)

    def close(self) -> None:
        """Stop redrawing and show the last lines. An engine that never calls ``finish`` (it did
        not call ``begin`` either) gets the static record here."""
        self._stop.set()
        if self._ticker.is_alive() and self._ticker is not threading.current_thread():
            self._ticker.join()
        self.refresh()
        if self.run_dir is None:
            self.finish(None)

    def finish(self, outcome) -> None:
        """Replace the widgets by the static record: what the saved notebook will hold.

        The output is replaced by display id while the launching cell still runs (``join=True``).
        A ``join=False`` run ends after its cell did, when JupyterLab no longer routes updates to
        it: there the widget itself shows the record for the rest of the session.
        """
        import ipywidgets as w

        with self._lock:
            if self._recorded:
                return
            self._recorded = True
            elapsed = self.clock() - self.t0
            ended = record.outcome_of(outcome, elapsed) if outcome is not None else record.Outcome("ended")
            ended.wall_s = elapsed  # the clock the ranks' "done in" times were read from: the headline agrees
            self.board.finish(ended)
            self._draw_titles()
            if self.board.outcome.failed_rank is not None and self.board.outcome.failed_rank < len(self.panes):
                self.tabs.selected_index = self.board.outcome.failed_rank
            bundle = record.record_bundle(self.board)
            self.shower.replace(bundle, self.display_id)
            self.shower.replace(EMPTY, self.saved_id)  # the record itself is what a saved notebook keeps now
            live = (self.header, self.bars, self.tabs, *self.panes, *(x for pair in self._bar_widgets.values()
                                                                        for x in pair))
            self.box.children = (w.HTML(bundle["text/html"]),)
            for widget in live:
                widget.close()  # what the learner watched live is not needed once the record is shown

    # ------------------------------------------------------------------ drawing
    def _tick_loop(self) -> None:
        while not self._stop.wait(REFRESH_S):
            try:
                self.refresh()
            except Exception:  # a closed comm (kernel shutting down) must not kill the run
                return

    def refresh(self) -> None:
        """Redraw what changed: states, panes with new lines, progress bars, the header."""
        with self._lock:
            self._watch_files()
            dirty, self._dirty = self._dirty, set()
            for rank in sorted(dirty):
                state = self.board.ranks[rank]
                if rank < len(self.panes):
                    self.panes[rank].value = record.pane_html(state.lines, state.count, record.placeholder(state))
                if state.total:
                    self._draw_bar(state)
            self._draw_titles()
            self.header.value = self._header_html()
            self._saved_changes |= bool(dirty)
            self._save_copy()

    def _save_copy(self) -> None:
        """Redraw the saved copy when something changed and SNAPSHOT_S has passed (never after the record)."""
        now = self.clock()
        if self._saved_changes and not self._recorded and now - self._saved_at >= SNAPSHOT_S:
            self.shower.replace(record.snapshot_bundle(self.board, now - self.t0), self.saved_id)
            self._saved_at, self._saved_changes = now, False

    def _watch_files(self) -> None:
        """Ranks that started (``ready/rankN``) or returned a value (``returns/rankN.pt``)."""
        if self.run_dir is None:
            return
        now = self.clock() - self.t0
        for rank in range(self.world_size):
            if (self.run_dir / "ready" / f"rank{rank}").exists() and self.board.started(rank):
                self._dirty.add(rank)  # its pane says "running" now, as its tab does
            if (self.run_dir / "returns" / f"rank{rank}.pt").exists() and self.board.returned(rank, now):
                self._dirty.add(rank)

    def _draw_titles(self) -> None:
        titles = tuple(s.title() for s in self.board.ranks[: len(self.panes)])
        if tuple(self.tabs.titles) != titles:
            self.tabs.titles = titles

    def _draw_bar(self, state: record.RankState) -> None:
        import ipywidgets as w

        if state.rank not in self._bar_widgets:
            bar = w.IntProgress(min=0, max=state.total, description=f"rank {state.rank}")
            label = w.Label()
            self._bar_widgets[state.rank] = (bar, label)
            self.bars.children = tuple(w.HBox(list(self._bar_widgets[r])) for r in sorted(self._bar_widgets))
        bar, label = self._bar_widgets[state.rank]
        bar.max, bar.value = state.total, min(state.step, state.total)
        shown = ", ".join(f"{k}={_short(v)}" for k, v in state.metrics.items())
        label.value = f"{state.step}/{state.total}" + (f"  {shown}" if shown else "")

    def _header_html(self) -> str:
        n = len(self.board.ranks)
        return f"<b>distlab</b>: {n} rank{'s' * (n != 1)} · running {self.clock() - self.t0:.0f} s"


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel, whose outputs can be updated in place by display id
    (JupyterLab, nbclient and the built book keep the last state)."""
    if sys.modules.get("ipykernel") is None:
        return False
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None) is not None


def live_frontend(environ=None) -> bool:
    """Best guess whether someone watches cells run: a kernel started by a Jupyter server
    (JupyterLab/Notebook set JPY_SESSION_NAME). nbclient (CI, the book build) and terminals
    do not: they keep (or print) every state a live display goes through."""
    import os

    environ = os.environ if environ is None else environ
    in_kernel = "ipykernel" in sys.modules and sys.modules["ipykernel"] is not None
    return in_kernel and "JPY_SESSION_NAME" in environ


def widgets_can_render(environ=None) -> bool:
    """Best guess whether a frontend will draw widgets: a live Jupyter frontend (:func:`live_frontend`)
    with ipywidgets installed. nbclient (CI, the book build) and terminals get the text stream,
    which every frontend shows."""
    import importlib.util

    return live_frontend(environ) and importlib.util.find_spec("ipywidgets") is not None


def make_view(view, world_size: int, names: dict[int, str] | None = None):
    """``"auto"``: widgets where they can render, else text; ``"text"``, ``"widgets"``, ``None``.

    ``names``: what to call a log that is not one rank's, instead of ``rank0`` (``run_script(mode="python")``:
    the script, whose own ranks print into its one log).
    """
    if view == "auto":
        view = "widgets" if widgets_can_render() else "text"
    if view == "text":
        return TextView(world_size, names=names)
    if view == "widgets":
        return WidgetView(world_size, names=names)
    if view is None or view == "none":
        return _Silent(world_size)
    return view  # any object with line/metric/close


class _Silent(TextView):
    def line(self, rank: int, text: str) -> None:
        pass

    def metric(self, rank: int, row: dict) -> None:
        pass

    def progress(self, rank: int, text: str, done: bool) -> None:
        pass
