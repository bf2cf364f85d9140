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
"""
from __future__ import annotations

import os
import threading
from multiprocessing import resource_tracker, util

_LOCK = threading.Lock()


def ensure_running() -> None:
    """:func:`multiprocessing.resource_tracker.ensure_running`, with a tracker it starts now put in a
    session of its own (one already running, started by someone else, stays where it is)."""
    with _LOCK:
        saved = resource_tracker.util
        resource_tracker.util = _OwnSession()
        try:
            resource_tracker.ensure_running()
        finally:
            resource_tracker.util = saved


class _OwnSession:
    """``multiprocessing.util`` as the tracker module sees it, but for ``spawnv_passfds``."""

    def __getattr__(self, name):
        return getattr(util, name)

    @staticmethod
    def spawnv_passfds(path: str, args: list[str], passfds) -> int:
        return spawn_in_own_session(path, args, passfds)


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
