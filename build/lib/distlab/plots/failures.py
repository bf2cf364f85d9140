"""Chapter 9's picture: how long each failure took to turn into an error.

One horizontal bar per failure, on a log scale (the range runs from milliseconds to many seconds).
Colours tell how the error came about: a process ended (a launcher notices at once), a hang that
only a timeout could end, or a check that raised before anything went wrong. That is the chapter's
point: put a bound on everything that can hang, and turn the checks on while debugging.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

KINDS = {"ended": ("C0", "a process ended"), "hang": ("C3", "a hang, ended by a timeout"),
         "check": ("C2", "a check raised at once")}


def detection_times(seconds: dict[str, float], kinds: dict[str, str]) -> Figure:
    """Bars of ``seconds[name]`` (fault to error); ``kinds[name]`` is a key of ``KINDS`` (default "ended")."""
    names = list(seconds)
    fig = Figure(figsize=(7.5, 1.4 + 0.36 * len(names)), layout="constrained")
    ax = fig.subplots()
    floor = 1e-4
    values = [max(seconds[n], floor) for n in names]
    colours = [KINDS[kinds.get(n, "ended")][0] for n in names]
    ax.barh(range(len(names)), [v - floor for v in values], left=floor, color=colours)
    ax.set_xscale("log")
    ax.set_xlim(floor, max(values) * 2)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()  # first failure on top, in the chapter's order
    ax.set_xlabel("seconds from the fault to the error (log scale)")
    ax.grid(axis="x", color="#dddddd")
    ax.set_axisbelow(True)
    used = [k for k in KINDS if k in {kinds.get(n, "ended") for n in names}]
    fig.legend(handles=[Patch(color=KINDS[k][0], label=KINDS[k][1]) for k in used],
               loc="outside lower center", ncols=len(used), frameon=False)
    return fig
