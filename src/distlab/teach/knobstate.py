"""The pure part of :mod:`distlab.teach.knobs`: which settings run when, and how they are named.

Apart from the module that makes widgets and schedules runs on the kernel's loop, so that the mutation run
(``[tool.mutmut]``) tests it with ``tests/test_knobs.py`` alone.
"""
from __future__ import annotations


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
