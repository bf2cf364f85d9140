"""Standby agents on :class:`distlab.Nodes`: a launch across nodes finds each node's agent started.

A run across nodes needs one torchelastic agent per node, inside its namespaces, and an agent is
a fresh interpreter that imports torch (~2 s, most of what such a launch waits for beyond its
ranks). So after each launch on a set of nodes, one agent per node starts in the background,
imports what it needs and waits (``python -m distlab.launch.agent --standby``); the next launch on
those nodes hands each the run to be (``RUN_DIR NODE LOG`` on its input). A standby whose input
ends (the kernel went) exits; closing the nodes kills whatever runs on them, standbys included.
"""
from __future__ import annotations

import subprocess
import threading
import weakref

from distlab.forkserver import mode as launchmode

_LOCK = threading.Lock()
_WAITING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # nodes -> {node: Popen}


def waiting_pids() -> set[int]:
    """The standbys waiting for a launch (kept on purpose, as the forkserver's spares are)."""
    with _LOCK:
        return {proc.pid for waiting in _WAITING.values() for proc in waiting.values() if proc.poll() is None}


def argv() -> list[str]:
    """The standby's command line: never the working folder first on ``sys.path`` (it may run as root)."""
    return launchmode.python_argv("distlab.launch.agent", "--standby")


def take(nodes, node: int) -> subprocess.Popen | None:
    """The standby agent waiting on ``node``, ready; None if there is none (the first launch)."""
    with _LOCK:
        proc = _WAITING.get(nodes, {}).pop(node, None)
    if proc is None or proc.poll() is not None or nodes.closed:
        _discard(proc)
        return None
    return proc


def hand(proc: subprocess.Popen, run_dir, node: int, log) -> bool:
    """Give the standby its run; False if it could not take it (it died meanwhile)."""
    try:
        proc.stdin.write(f"{run_dir} {node} {log}\n")
        proc.stdin.close()
        return True
    except OSError:
        _discard(proc)
        return False


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
            threading.Thread(target=_ready, args=(nodes, k, proc), daemon=True).start()


def _ready(nodes, node: int, proc: subprocess.Popen) -> None:
    """Read the standby's ``ready`` (one that dies first is forgotten), then reap it whenever it
    ends, used or not (closing the nodes kills an unused one): no zombie is left below the kernel."""
    if proc.stdout.readline().strip() != "ready":
        with _LOCK:
            if _WAITING.get(nodes, {}).get(node) is proc:
                del _WAITING[nodes][node]
        _discard(proc)
    proc.stdout.close()
    proc.wait()


def _discard(proc: subprocess.Popen | None) -> None:
    if proc is None:
        return
    if proc.poll() is None:
        proc.kill()
    proc.wait()
