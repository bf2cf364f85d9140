"""Knobs a learner turns: ipywidgets controls that re-run a chapter's measurement on live ranks.

``knobs(measure, world=IntSlider(...), ...)`` shows the controls and the picture that
``measure(**settings)`` returns (a matplotlib figure, or anything IPython displays). Moving a
control runs the measurement again, once the learner lets go, and redraws the picture in place.

What this module promises, and why:

* **No queue of stale runs.** Sliders send their value on release (``continuous_update=False``);
  a run starts after a short settle time, with the latest settings. A move while a run is going
  supersedes it: the run finishes (a collective cannot be abandoned half way without breaking
  the group), its picture is dropped, and one run with the latest settings follows. At most one
  run is going at any time (:class:`Latest`, pure, tested without processes).
* **Runs off the kernel's main thread**, so the kernel keeps reading the controls' messages while
  ranks work; the picture is one plain display output updated by its display id, as distlab's
  live view is, so a saved notebook keeps the last picture and reopens without its kernel.
* **The built book and nbclient**: without a live frontend (nbclient, the book build) no widget is
  made at all (no widget state saved, no widget JavaScript needed): the cell shows the picture of
  the default settings and one line naming them. The picture is the same one the knobs redraw.
"""
from __future__ import annotations

import io
import sys
import threading
import time
import uuid

SETTLE_S = 0.2  # after a move, wait this long for the next one before running (keyboard arrows)


class Latest:
    """The state of one lab: at most one run going, and only the newest settings waiting.

    ``moved(settings)`` -> True when a run should start now (none going). ``take()`` -> the settings
    to run. ``finished()`` -> True when the run just ended is current (draw it and go idle), False
    when newer settings arrived meanwhile (drop its result; run ``take()`` next).
    """

    def __init__(self):
        self.waiting = None
        self.going = False
        self.superseded = 0

    def moved(self, settings: dict) -> bool:
        self.waiting = dict(settings)
        if self.going:
            return False
        self.going = True
        return True

    def take(self) -> dict:
        settings, self.waiting = self.waiting, None
        return settings

    def finished(self) -> bool:
        if self.waiting is None:
            self.going = False
            return True
        self.superseded += 1
        return False


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


def describe(settings: dict) -> str:
    """``world=4, shuffle=True``: the settings a picture shows, in the words of the cell."""
    return ", ".join(f"{name}={value!r}" for name, value in settings.items())


def defaults(measure, names) -> dict:
    """The default of each knob: ``measure``'s own default for that argument (as ``interact``)."""
    import inspect

    params = inspect.signature(measure).parameters
    missing = [n for n in names if n not in params or params[n].default is params[n].empty]
    if missing:
        raise TypeError(f"{measure.__name__} needs a default for each knob: {', '.join(missing)}")
    return {n: params[n].default for n in names}


class Knobs:
    """One lab: its controls, its picture (one display output) and the runs behind them.

    ``runs`` counts measurements started (the default one included), ``peak`` the most ever going
    at once (1: never two), ``shown`` the settings of the picture now on screen, ``error`` what the
    last run raised, if it raised.
    """

    def __init__(self, measure, controls: dict, settle_s: float = SETTLE_S):
        self.measure, self.abbrevs, self.settle_s = measure, controls, settle_s
        self.values = defaults(measure, controls)
        self.state, self.lock = Latest(), threading.Lock()
        self.runs = self.going = self.peak = 0
        self.shown, self.error, self.widgets, self.status = None, None, {}, None
        self.display_id = uuid.uuid4().hex

    def _measure(self, settings: dict):
        with self.lock:
            self.runs, self.going = self.runs + 1, self.going + 1
            self.peak = max(self.peak, self.going)
        try:
            return as_displayable(self.measure(**settings))
        finally:
            with self.lock:
                self.going -= 1

    def moved(self, change=None) -> None:
        """A control changed: run now if nothing is going, else only remember the newest settings."""
        with self.lock:
            self.values = {n: w.value for n, w in self.widgets.items()}
            start = self.state.moved(self.values)
        if start:
            threading.Thread(target=self._loop, name="distlab-knobs", daemon=True).start()

    def _loop(self) -> None:
        """Runs until the picture on screen is of the newest settings (one thread per burst)."""
        while True:
            time.sleep(self.settle_s)  # a burst of moves (keyboard arrows) becomes one run
            with self.lock:
                settings = self.state.take()
            self._say(f"measuring {describe(settings)} …")
            began = time.perf_counter()
            try:
                shown, error = self._measure(settings), None
            except Exception as e:  # shown in the status line; the ranks' own recovery has run
                shown, error = None, e
            with self.lock:
                current = self.state.finished()
            if current:
                self._show(shown, settings, error, time.perf_counter() - began)
                return

    def _show(self, shown, settings: dict, error, seconds: float) -> None:
        from IPython.display import update_display

        self.error = error
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
    Interrupt stops them as any cell); later runs follow the controls.
    """
    from IPython.display import display

    from distlab.view.display import live_frontend

    lab = Knobs(measure, controls)
    if live_frontend():
        lab.widgets, lab.status = make_controls(controls, lab.values)
        display(layout(lab.widgets, lab.status))
    else:  # nbclient, the book: no widget, no widget state; the picture of the defaults
        print(f"{measure.__name__}({describe(lab.values)}); "
              "in JupyterLab, controls change these")
    shown = lab._measure(dict(lab.values))
    display(shown, display_id=lab.display_id)
    lab.shown = dict(lab.values)
    lab._say(f"shown: {describe(lab.shown)}")
    for widget in lab.widgets.values():
        widget.observe(lab.moved, names="value")
    return lab


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
