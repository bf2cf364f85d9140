"""``multiprocessing``'s resource tracker, started in a session of its own so a kernel can shut down.

The forkserver protocol hands every forked child the resource tracker's pipe, so distlab starts the
tracker (:func:`multiprocessing.resource_tracker.ensure_running`). The tracker ignores SIGINT and
SIGTERM by design: it ends when the last copy of its pipe closes, that is when the kernel is gone.
Started the usual way it sits in the kernel's process group, and there it stops a Jupyter kernel
from shutting down: ipykernel's shutdown (``_at_shutdown``) sends SIGTERM to every child in its
process group and waits, 0.01 s, 0.03 s, ..., 3 s, up to 14 s before SIGKILL, for them to go, while
jupyter_client (JupyterLab's shutdown, ``KernelManager.shutdown_kernel()``) waits only
``shutdown_wait_time / 2`` (2.5 s) before it SIGTERMs the kernel itself. That SIGTERM ends the
kernel without its ``atexit`` handlers: measured, every kernel that had imported distlab died so,
and left its private temporary folder, its nodes' processes and its chapter folders behind. (A kernel
that starts the tracker without distlab, ``multiprocessing.resource_tracker.ensure_running()`` in a
cell, is killed the same way.)

In a session of its own the tracker is not ipykernel's child to wait for; it still ends with the
kernel (its pipe closes). Runs in the kernel (and in any process that starts a forkserver).

How: while the tracker starts, the tracker's module sees another ``util`` whose ``spawnv_passfds``
starts it with ``setsid``. Every CPython from 3.10 to 3.14 (and main) starts the tracker through its
module's ``util.spawnv_passfds`` (:mod:`distlab.forkserver.stdlib` says what was read). On a Python
outside those, or one whose tracker module has no ``util``, the tracker starts the standard way with
a warning; and if a tracker started while lent the other ``util`` was not started through it (a
changed ``multiprocessing``), a warning says so.
"""
from __future__ import annotations

import functools
import os
import threading
from multiprocessing import resource_tracker, util

from distlab.forkserver import stdlib

_LOCK = threading.Lock()
FALLBACK = ("multiprocessing's resource tracker starts the standard way, in the kernel's process group, "
            "where a Jupyter kernel's shutdown may wait for it (see distlab.forkserver.tracker)")


@functools.lru_cache(maxsize=1)
def current_problem() -> str | None:
    """:func:`distlab.forkserver.stdlib.problem` for this Python, asked once."""
    return stdlib.problem()


def ensure_running() -> None:
    """:func:`multiprocessing.resource_tracker.ensure_running`, with a tracker it starts now put in a
    session of its own (one already running, started by someone else, stays where it is)."""
    reason = current_problem()
    if reason is not None:
        stdlib.warn_once(reason, FALLBACK)
        resource_tracker.ensure_running()
        return
    with _LOCK:
        before = _tracker_pid()
        saved, own = resource_tracker.util, _OwnSession()
        resource_tracker.util = own
        try:
            resource_tracker.ensure_running()
        finally:
            resource_tracker.util = saved
        started = _tracker_pid()
    if started not in (None, before) and started not in own.spawned:
        stdlib.warn_once("multiprocessing started its resource tracker without the spawnv_passfds distlab "
                         "lent it (a changed resource_tracker module)", FALLBACK)


def _tracker_pid() -> int | None:
    return getattr(getattr(resource_tracker, "_resource_tracker", None), "_pid", None)


class _OwnSession:
    """``multiprocessing.util`` as the tracker module sees it, but for ``spawnv_passfds``."""

    def __init__(self):
        self.spawned: list[int] = []

    def __getattr__(self, name):
        return getattr(util, name)

    def spawnv_passfds(self, path: str, args: list[str], passfds) -> int:
        pid = spawn_in_own_session(path, args, passfds)
        self.spawned.append(pid)
        return pid


def spawn_in_own_session(path: str, args: list[str], passfds) -> int:
    """``util.spawnv_passfds`` (exec ``path`` with ``args``, keeping ``passfds``), in a new session
    (so in a process group of its own). Returns the pid; the caller waits for it, as before."""
    fds = sorted({int(fd) for fd in passfds})
    saved = [(fd, os.get_inheritable(fd)) for fd in fds]
    try:
        for fd in fds:
            os.set_inheritable(fd, True)
        return os.posix_spawn(path, list(args), dict(os.environ), setsid=True)
    finally:
        for fd, inheritable in saved:
            os.set_inheritable(fd, inheritable)
