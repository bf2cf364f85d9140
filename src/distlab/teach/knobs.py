"""Knobs a learner turns: ipywidgets controls that re-run a chapter's measurement on live ranks.

``knobs(measure, world=IntSlider(...), ...)`` shows the controls and the picture that
``measure(**settings)`` returns (a matplotlib figure, or anything IPython displays). Moving a
control runs the measurement again, once the learner lets go, and redraws the picture in place.

What this module promises, and why:

* **No queue of stale runs.** Sliders send their value on release (``continuous_update=False``);
  a run starts after a short settle time, with the latest settings: moves that arrive before it
  starts (keyboard arrows, or moves made while the last run was going, which the kernel reads
  once it is free) become one run (:class:`~distlab.teach.knobstate.Latest`, pure, tested without processes).
* **Runs on the kernel's main thread**, scheduled on its event loop (:func:`kernel_later`), as a
  cell runs: pyplot, which is not thread-safe and which the learner's cells use too, is only ever
  touched from that thread, and Kernel > Interrupt stops a knob's run (its ranks are stopped by
  their own interrupt handling) exactly as it stops a cell. The kernel is busy meanwhile: a cell
  run then waits for the measurement, as it would wait for another cell.
* **One place on screen.** The picture is one display output updated by its display id, as
  distlab's live view is, so a saved notebook keeps the last picture and reopens without its
  kernel; what a run itself shows (its live view, its record and run folder) lands in one more
  output of the cell (:func:`distlab.view.display.shown_in`), so the cell shows the latest run's,
  not the first run's.
* **The built book and nbclient**: without a live frontend (nbclient, the book build) no widget is
  made at all (no widget state saved, no widget JavaScript needed): the cell shows the picture of
  the default settings and one line naming them. The picture is the same one the knobs redraw.
* **Old Jupyter.** ipywidgets 7 (Colab's 7.7) and 8 build the same controls; where ipywidgets is
  missing or cannot build them, the cell says so in one line and shows the static picture.
"""
from __future__ import annotations

import contextlib
import io
import signal
import sys
import threading
import time
import uuid

from .knobstate import Latest, defaults, describe  # noqa: F401  (the pure part, tested by mutation)

SETTLE_S = 0.2  # after a move, wait this long for the next one before running (keyboard arrows)


def as_displayable(shown):
    """A matplotlib figure as a PNG image (closed at once, so pyplot never shows it again in a
    later cell); anything else unchanged."""
    if not hasattr(shown, "savefig"):
        return shown
    from IPython.display import Image

    buf = io.BytesIO()
    shown.savefig(buf, format="png", bbox_inches="tight")
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close(shown)
    return Image(data=buf.getvalue(), format="png")


def kernel_later():
    """``schedule(delay_s, fn)`` that runs ``fn`` on the kernel's main thread, from its event loop
    (``kernel.io_loop``, a tornado loop in ipykernel 6 and 7); outside a kernel, ``fn`` runs at once
    in the caller. A control's message may be handled on another thread (ipykernel 7 hands comm
    messages to a subshell's thread where the frontend asks), and only ``add_callback`` of a tornado
    loop may be called from another thread: it wakes the loop, which then sets the timer."""
    try:
        from IPython import get_ipython
    except ImportError:
        return _now
    loop = getattr(getattr(get_ipython(), "kernel", None), "io_loop", None)
    if loop is None:
        return _now
    return lambda delay_s, fn: loop.add_callback(loop.call_later, delay_s, fn)


def _now(delay_s: float, fn) -> None:
    fn()


@contextlib.contextmanager
def interruptible():
    """Kernel > Interrupt (SIGINT) raises KeyboardInterrupt in here, as in a running cell: an idle
    ipykernel ignores SIGINT, and a knob's run starts from the idle kernel's event loop."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


class Knobs:
    """One lab: its controls, its picture (one display output) and the runs behind them.

    ``runs`` counts measurements started (the default one included), ``peak`` the most ever going
    at once (1: never two), ``shown`` the settings of the picture now on screen, ``error`` what the
    last run raised, if it raised (an interrupt included), ``threads`` the name of the thread each
    run went on. ``schedule(delay_s, fn)`` runs a move's measurement (:func:`kernel_later`).
    """

    def __init__(self, measure, controls: dict, settle_s: float = SETTLE_S, schedule=None):
        self.measure, self.abbrevs, self.settle_s = measure, controls, settle_s
        self.schedule = schedule or kernel_later()
        self.values = defaults(measure, controls)
        self.state, self.lock = Latest(), threading.Lock()
        self.runs = self.going = self.peak = 0
        self.shown, self.error, self.widgets, self.status, self.threads = None, None, {}, None, []
        self.display_id, self.runs_display_id = uuid.uuid4().hex, uuid.uuid4().hex

    def _measure(self, settings: dict):
        from distlab.view.display import shown_in

        with self.lock:
            self.runs, self.going = self.runs + 1, self.going + 1
            self.peak = max(self.peak, self.going)
            self.threads.append(threading.current_thread().name)
        try:
            with shown_in(self.runs_display_id):  # the run's own view: in the cell, the latest run's
                return as_displayable(self.measure(**settings))
        finally:
            with self.lock:
                self.going -= 1

    def moved(self, change=None) -> None:
        """A control changed: schedule a run if none is waiting or going, else only remember the
        newest settings."""
        with self.lock:
            self.values = {n: w.value for n, w in self.widgets.items()}
            start = self.state.moved(self.values)
        if start:
            self.schedule(self.settle_s, self._run_latest)

    def _run_latest(self) -> None:
        """Runs until the picture on screen is of the newest settings; an interrupt ends it."""
        while True:
            with self.lock:
                settings = self.state.take()
            self._say(f"measuring {describe(settings)} … (Kernel > Interrupt stops it)")
            began = time.perf_counter()
            try:
                with interruptible():
                    shown, error = self._measure(settings), None
            except BaseException as e:  # an interrupt too: the ranks' own handling stopped them
                shown, error = None, e
            with self.lock:
                if isinstance(error, KeyboardInterrupt):
                    self.state.take()  # the learner stopped it: no run follows
                current = self.state.finished()
            if current:
                self._show(shown, settings, error, time.perf_counter() - began)
                return

    def _show(self, shown, settings: dict, error, seconds: float) -> None:
        from IPython.display import update_display

        self.error = error
        if isinstance(error, KeyboardInterrupt):
            self._say(f"{describe(settings)} interrupted; the picture is still of {describe(self.shown or {})}")
            return
        if error is not None:
            first = (str(error).strip().splitlines() or [""])[0]
            self._say(f"{describe(settings)} failed: {type(error).__name__}: {first}")
            return
        update_display(shown, display_id=self.display_id)
        self.shown = settings
        self._say(f"shown: {describe(settings)} (run {self.runs}, {seconds:.2f} s)")

    def _say(self, text: str) -> None:
        if self.status is not None:
            self.status.value = text

    def __repr__(self) -> str:
        return (f"<knobs of {self.measure.__name__}: shown {describe(self.shown or {})}; "
                f"{self.runs} runs, at most {self.peak} at once>")


def knobs(measure, /, **controls) -> Knobs:
    """Controls for ``measure``'s arguments, and the picture ``measure(**settings)`` returns.

    Each control is given as ``interact`` takes it: ``(lo, hi)`` or ``(lo, hi, step)`` a slider,
    a list a dropdown, ``True``/``False`` a checkbox, or a widget; its start value is
    ``measure``'s default. The default settings are measured here, in the cell (Kernel >
    Interrupt stops them as any cell); later runs follow the controls, on the kernel's main
    thread, and Kernel > Interrupt stops them too.
    """
    from IPython.display import display

    from distlab.view.display import live_frontend

    lab = Knobs(measure, controls)
    if live_frontend():
        why = controls_or_why(lab, controls)
        if why is None:
            display(layout(lab.widgets, lab.status))
        else:
            print(f"{measure.__name__}({describe(lab.values)}): a static picture: {why}")
    else:  # nbclient, the book: no widget, no widget state; the picture of the defaults
        print(f"{measure.__name__}({describe(lab.values)}); "
              "in JupyterLab, controls change these")
    if lab.widgets:  # what each run shows itself lands here: the latest run's, after a move
        display({"text/plain": ""}, raw=True, display_id=lab.runs_display_id)
    else:
        lab.runs_display_id = None  # no later run: the first run's view is shown as usual
    shown = lab._measure(dict(lab.values))
    display(shown, display_id=lab.display_id)
    lab.shown = dict(lab.values)
    lab._say(f"shown: {describe(lab.shown)}")
    for widget in lab.widgets.values():
        widget.observe(lab.moved, names="value")
    return lab


def controls_or_why(lab: Knobs, controls: dict) -> str | None:
    """Make the lab's controls; where they cannot be made, the one line that says why (no
    ipywidgets, or an ipywidgets that cannot build one of them), and no controls."""
    try:
        lab.widgets, lab.status = make_controls(controls, lab.values)
    except ImportError as e:
        return f"ipywidgets is not installed ({e}); `pip install ipywidgets` gives the controls"
    except Exception as e:  # an ipywidgets version that builds these controls differently
        import ipywidgets

        lab.widgets, lab.status = {}, None
        return f"ipywidgets {ipywidgets.__version__} could not make the controls: {type(e).__name__}: {e}"
    return None


def make_controls(controls: dict, values: dict):
    """({name: widget}, status line): one widget per knob, sending its value on release."""
    import ipywidgets
    from ipywidgets.widgets.interaction import interactive

    made = {}
    for name, abbrev in controls.items():
        widget = interactive.widget_from_abbrev(abbrev, values[name])
        if widget is None:
            raise ValueError(f"cannot make a control of {name}={abbrev!r}")
        widget.value = values[name]  # measure's default, whatever the abbreviation
        widget.description = widget.description or name
        if hasattr(widget, "continuous_update"):
            widget.continuous_update = False  # one run when the learner lets go
        made[name] = widget
    return made, ipywidgets.Label()


def layout(made: dict, status):
    import ipywidgets

    return ipywidgets.VBox([*made.values(), status])
