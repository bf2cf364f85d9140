"""A rank's output cut into ordinary lines and progress bars that redraw one line in place. Pure.

A progress bar (tqdm, a ``print(..., end="\\r")`` counter) redraws its line: each state starts with a
carriage return ``\\r`` and no newline comes until the bar is done. Cut at newlines only, such a bar
showed nothing while it ran, then every state it went through at once, ``\\r`` and all. Here a line
is rendered the way a terminal shows it (text after a ``\\r`` overwrites the line from its start), and
a line that is being redrawn is reported as :class:`Progress`, its latest state only, so a view can
show one line per bar that updates in place and keeps the final state once the bar is done.
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass(frozen=True)
class Line:
    """An ordinary line of output, without its newline."""

    text: str


@dataclass(frozen=True)
class Progress:
    """The latest state of a line redrawn in place; ``done`` once its newline came (or the stream
    ended): ``text`` is then the state to keep. An empty final text is a bar that cleared itself."""

    text: str
    done: bool = False


class Splitter:
    """One stream's chunks -> :class:`Line` and :class:`Progress` events.

    The unfinished line is kept as rendered, never as the raw text: a bar redrawn a million
    times without a newline costs one line of memory.
    """

    def __init__(self):
        self._text = ""  # the unfinished line as a terminal shows it
        self._col = 0  # where the next character lands in it
        self._after_cr = False  # a '\r' came and nothing was written over the line since
        self._redrawn = False  # something was written over the line after a '\r': a progress line
        self._shown = None  # the state last reported as Progress

    def feed(self, chunk: str) -> list:
        """The events ``chunk`` completes: finished lines, and the latest state of a line being redrawn."""
        events = []
        pieces = chunk.split("\n")
        for i, piece in enumerate(pieces):
            if i:
                events.append(self._end_line())
            self._write(piece)
        state = self._text.rstrip()
        if self._redrawn and state != self._shown:
            self._shown = state
            events.append(Progress(state))
        return events

    def flush(self) -> list:
        """The stream ended: its unfinished line, as it stands."""
        if self._text or self._redrawn:
            return [self._end_line()]
        return []

    def _write(self, piece: str) -> None:
        """Text without newlines: each '\\r' moves back to the line's start, what follows overwrites."""
        for j, segment in enumerate(piece.split("\r")):
            if j:
                self._col, self._after_cr = 0, True
            if not segment:
                continue
            if self._after_cr:  # a "\r\n" line end is no redraw: only text written after the '\r' makes one
                self._redrawn, self._after_cr = True, False
            self._text = self._text[:self._col] + segment + self._text[self._col + len(segment):]
            self._col += len(segment)

    def _end_line(self):
        text, redrawn = self._text, self._redrawn
        self._text, self._col, self._after_cr, self._redrawn, self._shown = "", 0, False, False, None
        return Progress(text.rstrip(), done=True) if redrawn else Line(text)


class Streams:
    """Many streams (each rank's log file, each rank's stdout), each with its own unfinished line.
    Bytes are decoded incrementally: a character cut between two reads is not garbled."""

    def __init__(self):
        self._splitters: dict = {}
        self._decoders: dict = {}

    def feed(self, key, data: bytes | str) -> list:
        if isinstance(data, bytes):
            decoder = self._decoders.setdefault(key, codecs.getincrementaldecoder("utf-8")(errors="replace"))
            data = decoder.decode(data)
        return self._splitters.setdefault(key, Splitter()).feed(data)

    def flush(self, key) -> list:
        """``key``'s stream ended: what is left of it."""
        decoder, splitter = self._decoders.pop(key, None), self._splitters.pop(key, None)
        events = []
        if decoder is not None:
            rest = decoder.decode(b"", final=True)
            if rest:
                splitter = splitter or Splitter()
                events += splitter.feed(rest)
        return events + (splitter.flush() if splitter is not None else [])

    def flush_all(self) -> list[tuple[object, object]]:
        """Every stream ended: ``(key, event)`` for what is left, in a stable order of keys."""
        keys = sorted(set(self._splitters) | set(self._decoders), key=repr)
        return [(key, event) for key in keys for event in self.flush(key)]


def rendered_lines(text: str) -> list[str]:
    """A whole log as a terminal would leave it: each progress bar as its final state, one line."""
    splitter = Splitter()
    events = splitter.feed(text) + splitter.flush()
    return [e.text for e in events if isinstance(e, Line) or (e.done and e.text)]


def deliver(view, rank: int, event) -> None:
    """Hand an event to a view: ``line(rank, text)``, or ``progress(rank, text, done)`` where the
    view has it; a view without ``progress`` (one a learner wrote) gets each bar's final state as a line."""
    if isinstance(event, Line):
        view.line(rank, event.text)
    elif hasattr(view, "progress"):
        view.progress(rank, event.text, event.done)
    elif event.done and event.text:
        view.line(rank, event.text)
