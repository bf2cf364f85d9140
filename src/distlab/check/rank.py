"""Inside each rank (and each process a script starts with ``mp.spawn``): the event recorder.

:func:`main` is what :mod:`distlab.check.boot` calls in every process the launcher starts: it installs
the hooks (:mod:`distlab.check.hooks`) and runs the learner's script as ``__main__``, unedited.
Each event is one JSON line in ``<events>/<pid>.jsonl``, written when it happens (a rank stopped
by a hang has written everything before it), with the learner's file and line taken from the stack.
Runs in the ranks: imports nothing from distlab's front end (the "rank-side" contract).
"""
from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time

_SITE = ("site-packages", "dist-packages")
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # distlab's own files are not the learner's
TIMED_OUT_EXIT = 124
WHERE_GRACE_S = 3.0


class Recorder:
    """One process's events: where they happened in the learner's files, and to which rank."""

    def __init__(self, config: dict):
        self.config = config
        self.script = os.path.realpath(config["script"])
        self.root = os.path.dirname(self.script)
        self._learner: dict[str, str | None] = {}
        self._lock = threading.Lock()
        self._file = open(os.path.join(config["events"], f"{os.getpid()}.jsonl"), "a", buffering=1)
        rank = os.environ.get("RANK")
        self.rank = int(rank) if rank is not None and rank.isdigit() else None
        self.waiting: str | None = None  # the collective (or backward) the main thread is inside
        self.counters: dict[str, int] = {}

    def number(self, what: str) -> int:
        """0, 1, 2, ... per kind of object (loaders, models, optimizers): names that match across ranks."""
        n = self.counters.get(what, 0)
        self.counters[what] = n + 1
        return n

    def learner_name(self, filename: str) -> str | None:
        """"" for the script, a path relative to its folder for the learner's other files, else None."""
        if filename not in self._learner:
            real = os.path.realpath(filename)
            ours = real.startswith(_HERE + os.sep) or any(s in real.split(os.sep) for s in _SITE)
            mine = real.startswith(self.root + os.sep) and not ours and real.endswith(".py")
            name = "" if real == self.script else os.path.relpath(real, self.root)
            self._learner[filename] = name if mine else None
        return self._learner[filename]

    def where(self, frame) -> tuple[str, int] | None:
        """The innermost frame in the learner's files, from ``frame`` outwards."""
        while frame is not None:
            name = self.learner_name(frame.f_code.co_filename)
            if name is not None:
                return name, frame.f_lineno
            frame = frame.f_back
        return None

    def emit(self, kind: str, frame=None, **data) -> None:
        """Write one event; its line is the learner's innermost line on the stack."""
        at = self.where(frame if frame is not None else sys._getframe(1))
        if at is not None:
            data["file"], data["line"] = at
        data.update(k=kind, rank=self.rank, t=round(time.monotonic(), 4))
        text = json.dumps(data, default=str) + "\n"
        with self._lock:
            self._file.write(text)

    def traced(self, fn):
        """``fn`` wrapped so that the process ``mp.spawn`` starts records too."""
        return Traced(fn, self.config)


_REC: Recorder | None = None


def install(config: dict) -> Recorder:
    """Start recording in this process (once), with the hooks and the hang watchdog."""
    global _REC
    if _REC is None:
        from distlab.check import hooks

        _REC = Recorder(config)
        hooks.install(_REC)
        if config.get("deadline_s"):
            threading.Thread(target=_watchdog, args=(_REC, config["deadline_s"]), daemon=True,
                             name="distlab-check-watchdog").start()
        _REC.emit("start", pid=os.getpid(), argv=sys.argv[1:])
    return _REC


def _watchdog(rec: Recorder, deadline_s: float) -> None:
    """Past the deadline: note where the main thread is in the learner's script, then stop the rank,
    so that a hang is reported with each rank's line instead of being killed without a word."""
    time.sleep(deadline_s)
    frame = sys._current_frames().get(threading.main_thread().ident)
    rec.emit("where", frame=frame, waiting=rec.waiting)
    time.sleep(WHERE_GRACE_S)  # the other ranks note where they are before this one's exit wakes them
    os._exit(TIMED_OUT_EXIT)


def record_error(rec: Recorder, error: BaseException) -> None:
    """An exception leaving the learner's code, at its innermost learner line."""
    if isinstance(error, SystemExit) and error.code in (None, 0):
        return
    tb, at = error.__traceback__, None
    while tb is not None:
        at = tb.tb_frame if rec.learner_name(tb.tb_frame.f_code.co_filename) is not None else at
        tb = tb.tb_next
    rec.emit("error", frame=at, error=f"{type(error).__name__}: {error}"[:500])


class Traced:
    """A function given to ``mp.spawn``, recording in the child before it runs (picklable: the
    child unpickles this class by its module name, the function by its own)."""

    def __init__(self, fn, config: dict):
        self.fn, self.config = fn, config

    def __call__(self, *args, **kwargs):
        rec = install({**self.config, "deadline_s": self.config.get("child_deadline_s")})
        try:
            result = self.fn(*args, **kwargs)
        except BaseException as e:
            record_error(rec, e)
            raise
        rec.emit("end")
        return result


def main(argv: list[str]) -> None:
    """``boot.py EVENTS DEADLINE_S STEPS SCRIPT ARGS...``: record, then run SCRIPT as ``python SCRIPT``
    would (its folder first on ``sys.path``, ``sys.argv`` its own)."""
    events, deadline_s, steps, script, *args = argv
    deadline_s, start = float(deadline_s), time.monotonic()
    config = {"events": events, "script": script, "steps": int(steps),
              "deadline_s": deadline_s + (5.0 if "RANK" not in os.environ else 0.0),
              "child_deadline_s": deadline_s}
    sys.argv = [script, *args]
    boot_dir = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != boot_dir]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    rec = install(config)
    try:
        runpy.run_path(script, run_name="__main__")
    except BaseException as e:
        record_error(rec, e)
        raise
    rec.emit("end", s=round(time.monotonic() - start, 3))
