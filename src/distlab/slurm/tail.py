"""Read what a job's ranks wrote since the last look: rank logs, report() rows, the batch script's output.

Files grow on a (possibly shared) file system while the job runs; each is read from where the
last read stopped, and only whole lines are handed on (a half-written line waits for its end), except
the latest state of a progress bar redrawing a rank's unfinished line.
"""
from __future__ import annotations

import json
from pathlib import Path

from distlab.folders.runfolder import RunFolder
from distlab.view.streams import Streams


class Tail:
    """New lines of many files; ``offsets`` and unfinished ``partial`` lines per file."""

    def __init__(self):
        self.offsets: dict[Path, int] = {}
        self.partial: dict[Path, bytes] = {}

    def read(self, path: Path) -> list[str]:
        try:
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
        except FileNotFoundError:
            return []
        if not data:
            return []
        self.offsets[path] = self.offsets.get(path, 0) + len(data)
        data = self.partial.pop(path, b"") + data
        *lines, rest = data.split(b"\n")
        if rest:
            self.partial[path] = rest
        return [line.decode(errors="replace") for line in lines]

    def flush(self, path: Path) -> list[str]:
        """The unfinished last line, once the file is complete."""
        rest = self.partial.pop(path, b"")
        return [rest.decode(errors="replace")] if rest else []


class JobTail:
    """Everything new in a job's run folder: ``lines()`` -> [(rank or None, event)], ``metrics()``.

    A rank's output comes as :mod:`distlab.view.streams` events: whole lines, and the latest state
    of a progress bar redrawing its unfinished line (so the bar moves while the job runs).
    """

    def __init__(self, folder: RunFolder, batch_log: Path):
        self.folder, self.batch_log = folder, batch_log
        self.text, self.rows = Streams(), Tail()
        self.offsets: dict[Path, int] = {}

    def lines(self, final: bool = False) -> list[tuple[int | None, object]]:
        out = [(None, event) for event in self._read(self.batch_log, final)]
        for rank, path in self.folder.output_streams():
            out += [(rank, event) for event in self._read(path, final)]
        return out

    def _read(self, path: Path, final: bool) -> list:
        try:
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
        except FileNotFoundError:
            data = b""
        self.offsets[path] = self.offsets.get(path, 0) + len(data)
        return self.text.feed(path, data) + (self.text.flush(path) if final else [])

    def metrics(self) -> list[tuple[int, dict]]:
        out = []
        for rank, path in self.folder.metric_streams():
            for line in self.rows.read(path):
                try:
                    out.append((rank, json.loads(line)))
                except json.JSONDecodeError:
                    pass
        return out
