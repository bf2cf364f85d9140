"""Standby agents on :class:`distlab.Nodes`: a launch across nodes finds each node's agent started.

A run across nodes needs one torchelastic agent per node, inside its namespaces, and an agent is
a fresh interpreter that imports torch (~2 s, most of what such a launch waits for beyond its
ranks). So after each launch on a set of nodes, one agent per node starts in the background,
imports what it needs and waits (``python -m distlab.launch.agent --standby``); the next launch on
those nodes hands each the run to be (``RUN_DIR NODE LOG`` on its input). A standby whose input
ends (the kernel went) exits; closing the nodes kills whatever runs on them, standbys included.

The hand-over is a conversation on the standby's output: ``ready`` (imports done), then ``taken``
once it has opened the run's agent log, the moment it becomes that run's agent. A standby that
dies at any moment before ``taken`` (killed while it waited, while the run was being written to
it, or before it opened the log) is not the run's agent: :func:`hand` says so and the launch
starts a fresh agent instead. One that dies after ``taken`` is the run's agent, and its death is
reported as that agent's (its node, its exit status).
"""
from __future__ import annotations

import subprocess
import threading
import weakref

from distlab.forkserver import mode as launchmode

_LOCK = threading.Lock()
_WAITING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # nodes -> {node: Popen}
_HEARD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Popen -> Heard
HANDOVER_S = 120.0  # the longest a launch waits for a standby to take its run (it may still be importing torch)
TAKEN, GONE = "taken", "gone"


class Heard:
    """The last word a standby said on its output (``""``, ``ready``, ``taken``), or ``gone`` once
    its output ended without ``taken``; a launch waits on it for the hand-over's end."""

    def __init__(self):
        self.word = ""
        self._changed = threading.Condition()

    def note(self, word: str) -> None:
        with self._changed:
            self.word = word
            self._changed.notify_all()

    def outcome(self, timeout: float) -> str:
        """``taken`` or ``gone``, whichever came; ``""``/``ready`` if neither within ``timeout``."""
        with self._changed:
            self._changed.wait_for(lambda: self.word in (TAKEN, GONE), timeout)
            return self.word


def at(moment: str, proc: subprocess.Popen) -> None:
    """A hook called at each step of a hand-over (``picked``: out of the waiting list, ``handed``:
    the run written to it, ``confirmed``: it said ``taken``): tests kill the standby there."""


def waiting_pids() -> set[int]:
    """The standbys waiting for a launch (kept on purpose, as the forkserver's spares are)."""
    with _LOCK:
        return {proc.pid for waiting in _WAITING.values() for proc in waiting.values() if proc.poll() is None}


def argv() -> list[str]:
    """The standby's command line: never the working folder first on ``sys.path`` (it may run as root)."""
    return launchmode.python_argv("distlab.launch.agent", "--standby")


def take(nodes, node: int) -> subprocess.Popen | None:
    """The standby agent waiting on ``node``; None if there is none (the first launch)."""
    with _LOCK:
        proc = _WAITING.get(nodes, {}).pop(node, None)
    if proc is None or proc.poll() is not None or nodes.closed:
        _discard(proc)
        return None
    at("picked", proc)
    return proc


def hand(proc: subprocess.Popen, run_dir, node: int, log, timeout: float | None = None) -> bool:
    """Give the standby its run and wait until it has taken it (opened ``log``): True; False if it
    died before (or did not take it within ``timeout``, then it is killed): start a fresh agent."""
    try:
        proc.stdin.write(f"{run_dir} {node} {log}\n")
        proc.stdin.close()
    except OSError:  # it died before it read the run
        _discard(proc)
        return False
    try:
        at("handed", proc)
        taken = _HEARD[proc].outcome(HANDOVER_S if timeout is None else timeout) == TAKEN
    except BaseException:  # interrupted while it takes the run: it must not run it unwatched
        _discard(proc)
        raise
    if not taken:
        _discard(proc)
        return False
    at("confirmed", proc)
    return True


def refill(nodes) -> None:
    """Start a standby on each node that has none, in the background (its start costs the kernel
    a few milliseconds; its imports run in its own process)."""
    if nodes.closed:
        return
    with _LOCK:
        waiting = _WAITING.setdefault(nodes, {})
        missing = [k for k in range(nodes.n) if k not in waiting]
        for k in missing:
            proc = subprocess.Popen(nodes.command(k, argv()), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True)
            waiting[k] = proc
            _HEARD[proc] = heard = Heard()
            threading.Thread(target=_listen, args=(nodes, k, proc, heard), daemon=True).start()


def _listen(nodes, node: int, proc: subprocess.Popen, heard: Heard) -> None:
    """Hear the standby's ``ready`` and ``taken``; one whose output ends before ``taken`` is
    forgotten (and its hand-over, if one waits, fails). Then reap it whenever it ends, used or
    not (closing the nodes kills an unused one): no zombie is left below the kernel."""
    word = proc.stdout.readline().strip()
    if word == "ready":
        heard.note(word)
        word = proc.stdout.readline().strip()
    if word == TAKEN:
        heard.note(TAKEN)
    else:
        with _LOCK:
            if _WAITING.get(nodes, {}).get(node) is proc:
                del _WAITING[nodes][node]
        heard.note(GONE)
        _discard(proc)
    proc.stdout.close()
    proc.wait()


def _discard(proc: subprocess.Popen | None) -> None:
    if proc is None:
        return
    if proc.poll() is None:
        proc.kill()
    proc.wait()
