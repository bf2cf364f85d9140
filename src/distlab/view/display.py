"""Where live rank output goes: a text stream (every frontend) or one display redrawn in place.

The engine calls ``line(rank, text)``, ``metric(rank, row)`` and ``close()`` on every view, and,
where a view has them, ``begin(run_dir)`` before the ranks start and ``finish(result_or_error)``
once the run is over. The live view uses ``finish`` to swap itself for a static record
(:mod:`distlab.view.record`), so a saved notebook still shows every rank's output without a kernel.
"""
from __future__ import annotations

import contextlib
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
        shown = ", ".join(f"{k}={record.short_value(v)}" for k, v in row.items()
                          if k not in ("rank", "time", "step", "total"))
        bar = tqdm.format_meter(int(row["step"]), int(row["total"]), float(row.get("time", first)) - first,
                                postfix=shown or None)
        self.bars.show(("steps", rank), f"[{self._label(rank)}] {bar}")

    def close(self) -> None:
        self.bars.close()


REFRESH_S = 0.25  # the live view is redrawn at most this often: a rank printing 1000 lines/s sends 4 updates/s


_into: list[str] = []  # shown_in's target, innermost last (set and read on the kernel's main thread)
_routes: dict[str, str] = {}  # a display id -> the output it was shown in instead


@contextlib.contextmanager
def shown_in(display_id: str | None):
    """Within this, every display a run shows (its live view, its record, a status line) is drawn
    into the existing output ``display_id`` instead of a new output of whatever message the kernel
    handles now. A knob's run (:mod:`distlab.teach.knobs`) starts from a control's message, whose
    new outputs no frontend shows: the cell that made the knobs then kept the first run's record
    (and run folder) after every move. ``None``: displays go where they always go."""
    if display_id is None:
        yield
        return
    _into.append(display_id)
    try:
        yield
    finally:
        _into.pop()


class IPythonDisplay:
    """How the live view shows things: IPython's display machinery (replaced in tests)."""

    def show(self, bundle: dict, display_id: str) -> None:
        from IPython.display import display, update_display

        if _into:  # inside shown_in: this display and its later updates go to that output
            _routes[display_id] = _into[-1]
            update_display(bundle, display_id=_into[-1], raw=True)
            return
        display(bundle, display_id=display_id, raw=True)

    def replace(self, bundle: dict, display_id: str) -> None:
        from IPython.display import update_display

        update_display(bundle, display_id=_routes.get(display_id, display_id), raw=True)


class LiveView:
    """Live: one display output, redrawn in place, with a headline (``distlab: 2 ranks · running
    11 s``) and each rank's state, progress and latest lines. At the end: the static record, in the
    same output.

    Plain HTML, no widget: a notebook saved at any moment holds what the ranks had printed by then
    (at most REFRESH_S old) and reopens without its kernel; a widget would show ``Error displaying
    widget: model not found`` there. A small thread redraws every REFRESH_S, when what it draws
    changed (never once per line); it also notices ranks starting (``ready/rankN``) and returning
    (``returns/rankN.pt``).
    """

    def __init__(self, world_size: int, shower=None, clock=time.monotonic, names: dict[int, str] | None = None):
        self.world_size, self.clock, self.t0 = world_size, clock, clock()
        self.board = record.Board(world_size, names)
        self.shower = shower or IPythonDisplay()
        self.display_id = uuid.uuid4().hex
        self.run_dir: Path | None = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._recorded = False
        self._drawn = self._bundle()
        self.shower.show(self._drawn, self.display_id)
        self._ticker = threading.Thread(target=self._tick_loop, daemon=True, name="distlab-view")
        self._ticker.start()

    # ------------------------------------------------------------------ the engine's calls
    def begin(self, run_dir) -> None:
        self.run_dir = Path(run_dir)

    def line(self, rank: int, text: str) -> None:
        with self._lock:
            self.board.line(rank, text)

    def progress(self, rank: int, text: str, done: bool) -> None:
        """A rank's own progress bar: one line of its pane, updated in place."""
        with self._lock:
            self.board.progress(rank, text, done)

    def metric(self, rank: int, row: dict) -> None:
        with self._lock:
            self.board.metric(rank, row)

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
        """Replace the live view by the static record: what the cell, and a saved notebook, keep."""
        with self._lock:
            if self._recorded:
                return
            self._recorded = True
            elapsed = self.clock() - self.t0
            ended = record.outcome_of(outcome, elapsed) if outcome is not None else record.Outcome("ended")
            ended.wall_s = elapsed  # the clock the ranks' "done in" times were read from: the headline agrees
            self.board.finish(ended)
            self._drawn = record.record_bundle(self.board)
            self.shower.replace(self._drawn, self.display_id)

    # ------------------------------------------------------------------ drawing
    def _tick_loop(self) -> None:
        while not self._stop.wait(REFRESH_S):
            try:
                self.refresh()
            except Exception:  # a closed kernel connection must not kill the run
                return

    def refresh(self) -> None:
        """Redraw when what the live view shows changed (a line, a state, progress, the clock's second)."""
        with self._lock:
            if self._recorded:
                return
            self._watch_files()
            bundle = self._bundle()
            if bundle != self._drawn:
                self.shower.replace(bundle, self.display_id)
                self._drawn = bundle

    def _bundle(self) -> dict:
        return record.live_bundle(self.board, self.clock() - self.t0)

    def _watch_files(self) -> None:
        """Ranks that started (``ready/rankN``) or returned a value (``returns/rankN.pt``)."""
        if self.run_dir is None:
            return
        now = self.clock() - self.t0
        for rank in range(self.world_size):
            if (self.run_dir / "ready" / f"rank{rank}").exists():
                self.board.started(rank)
            if (self.run_dir / "returns" / f"rank{rank}.pt").exists():
                self.board.returned(rank, now)


def in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel, whose outputs can be updated in place by display id
    (JupyterLab, nbclient and the built book keep the last state)."""
    if sys.modules.get("ipykernel") is None:
        return False
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None) is not None


def live_frontend(environ=None, modules=None) -> bool:
    """Best guess whether someone watches cells run: a kernel started by a Jupyter server
    (JupyterLab and Notebook 7 set JPY_SESSION_NAME), Colab's kernel (it imports ``google.colab``;
    its server, like Notebook 6's, sets no JPY_SESSION_NAME) or a Kaggle notebook being edited
    (``KAGGLE_KERNEL_RUN_TYPE=Interactive``; ``Batch`` is a saved version running alone). nbclient
    (CI, the book build) and terminals do not: they keep (or print) every state a live display goes
    through."""
    import os

    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if modules.get("ipykernel") is None:
        return False
    return ("JPY_SESSION_NAME" in environ or modules.get("google.colab") is not None
            or environ.get("KAGGLE_KERNEL_RUN_TYPE") == "Interactive")


def make_view(view, world_size: int, names: dict[int, str] | None = None):
    """``"auto"``: the live view where someone watches the cell run, else text; ``"text"``, ``"live"``
    (``"widgets"``, its name when it was drawn with ipywidgets), ``None``.

    ``names``: what to call a log that is not one rank's, instead of ``rank0`` (``run_script(mode="python")``:
    the script, whose own ranks print into its one log).
    """
    if view == "auto":
        view = "live" if live_frontend() else "text"
    if view == "text":
        return TextView(world_size, names=names)
    if view in ("live", "widgets"):
        return LiveView(world_size, names=names)
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
