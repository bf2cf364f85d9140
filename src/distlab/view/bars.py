"""Progress bars in a text front end: one line per bar that updates in place, never on stderr.

A bar written to the kernel's stderr shows as an error-coloured box, and its in-place updates
(``\\r``) reach only the box they started in: chapter 13's bar sat at 0 % among the rank lines and
its final state came after the job. Here each bar (a rank's own tqdm, a rank's reported
``step``/``total``) is:

* in a Jupyter kernel (JupyterLab, nbclient, the built book): an output of its own, updated by
  display id: one plain line per bar that moves, and keeps its final state in the saved notebook;
* elsewhere (a terminal, a pipe): its final state as an ordinary line when the bar is done; on a
  terminal the latest bar also stays on the bottom line, redrawn in place, while it runs.

Nothing here imports Jupyter: the kernel's display functions come in as ``shower`` (see
:class:`distlab.view.display.IPythonDisplay`), so this is tested without a kernel.
"""
from __future__ import annotations

import sys
import time
import uuid

MIN_UPDATE_S = 0.1  # a bar's output is redrawn at most this often (its final state always)


class ProgressLines:
    """Bars by key (e.g. ``("out", rank)``), and the ordinary text written around them."""

    def __init__(self, stream=None, shower=None, clock=time.monotonic):
        self.stream, self.shower, self.clock = stream, shower, clock
        self._bars: dict = {}  # key -> [display id, latest text, text shown, when shown]
        self._written: set = set()  # streams with text that must reach the front end before a new bar
        self._bottom = None  # terminal: the bar text drawn on the last line, without a newline

    def write(self, text: str, stream=None) -> None:
        """Ordinary text (whole lines); on a terminal it goes above the bar on the bottom line."""
        out = stream or self.stream or sys.stdout
        self._clear_bottom()
        out.write(text)
        self._written.add(out)
        self._draw_bottom()

    def show(self, key, text: str, done: bool = False) -> None:
        """A bar's latest state; ``done``: its final one (an empty one removes the bar)."""
        if self.shower is not None:
            self._show_output(key, text, done)
        elif done:
            self._bars.pop(key, None)
            if text:
                self.write(text + "\n")
            else:
                self._clear_bottom()
                self._draw_bottom()
        else:
            self._bars.pop(key, None)
            self._bars[key] = [None, text, None, 0.0]  # the latest bar is the one a terminal shows
            self._clear_bottom()
            self._draw_bottom()

    def close(self) -> None:
        """Every bar still open keeps its last state: redrawn in its output, or printed as a line."""
        for key, (_, text, shown, _) in list(self._bars.items()):
            if self.shower is not None:
                if text != shown:
                    self._show_output(key, text, done=True)
            elif text:
                self._clear_bottom()
                self._out().write(text + "\n")
        self._bars.clear()
        self._bottom = None

    # ------------------------------------------------------------------ in a kernel: one output per bar
    def _show_output(self, key, text: str, done: bool) -> None:
        bar, now = self._bars.get(key), self.clock()
        if bar is None:
            if done and not text:
                return
            for out in self._written:  # the lines printed before the bar stay above it
                out.flush()
            self._written.clear()
            bar = self._bars[key] = [uuid.uuid4().hex, text, text, now]
            self.shower.show({"text/plain": text}, bar[0])
        elif done or now - bar[3] >= MIN_UPDATE_S:
            bar[1:] = [text, text, now]
            self.shower.replace({"text/plain": text}, bar[0])
        else:
            bar[1] = text
        if done:
            del self._bars[key]  # the output keeps this state; a new bar under the key gets its own

    # ------------------------------------------------------------------ elsewhere: the bottom line
    def _out(self):
        return self.stream or sys.stdout

    def _terminal(self) -> bool:
        isatty = getattr(self._out(), "isatty", None)
        return bool(isatty and isatty())

    def _clear_bottom(self) -> None:
        if self._bottom is not None:
            self._out().write("\r" + " " * len(self._bottom) + "\r")
            self._bottom = None

    def _draw_bottom(self) -> None:
        if self.shower is None and self._bars and self._terminal():
            self._bottom = list(self._bars.values())[-1][1]
            self._out().write(self._bottom)
            self._out().flush()
