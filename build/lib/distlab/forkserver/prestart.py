"""Start distlab's forkserver in the background as soon as a notebook imports distlab.

The server imports torch once (a second or two) and every launch forks its ranks from it. Started
by the first launch, that wait is what a learner sees on the first ``spawn`` of a kernel; started
when ``import distlab`` runs, it overlaps with the learner's next cells, and the first launch is
as fast as any other (the same thread then prunes old run folders, the first launch's other
wait). The import itself never waits: a daemon thread asks the server's keeper
thread to start it, and any failure is left for the first launch to report (it falls back to
fresh interpreters with a warning).

Only in an IPython shell (a Jupyter kernel, or IPython in a terminal), only where ranks would be
forked (``start="auto"`` means the forkserver here), never inside distlab's own processes, and
not when ``DISTLAB_PRESTART=0``.
"""
from __future__ import annotations

import os
import sys
import threading

ENV = "DISTLAB_PRESTART"
_THREADS: list[threading.Thread] = []
OFF = ("0", "false", "no", "off")


def wanted(env, interactive: bool, start: str) -> bool:
    """Pure rule: start the server in the background?"""
    return interactive and env.get(ENV, "1").strip().lower() not in OFF and start == "forkserver"


def interactive() -> bool:
    """Whether this process is an IPython shell (and not one of distlab's ranks or servers)."""
    ipython = sys.modules.get("IPython")
    try:
        shell = ipython.get_ipython() if ipython is not None else None
    except Exception:
        shell = None
    return shell is not None and "DISTLAB_RANK" not in os.environ and "TORCHELASTIC_RUN_ID" not in os.environ


def maybe_start(env=None) -> threading.Thread | None:
    """Start the server in a daemon thread when :func:`wanted`; the thread, or None."""
    from distlab.forkserver import mode as launchmode

    env = os.environ if env is None else env
    try:
        start = launchmode.resolve_start("auto", env=env, forkserver_works=launchmode.forkserver_works())
    except Exception:  # a bad DISTLAB_START: the first launch says so
        return None
    if not wanted(env, interactive(), start):
        return None
    thread = threading.Thread(target=_start_server, daemon=True, name="distlab-prestart")
    thread.start()
    _THREADS.append(thread)
    return thread


def wait(timeout: float = 30.0) -> None:
    """Until a background start begun by :func:`maybe_start` is over (for code that lists this
    process's children and must not catch the server half-started)."""
    for thread in _THREADS:
        thread.join(timeout)


def _start_server() -> None:
    """The server, then the first prune of old runs (which the first launch would otherwise do)."""
    try:
        from distlab.forkserver import client as forkserver

        forkserver.ensure_server()
    except Exception:  # noqa: S110  (the first launch tries again and reports what fails)
        pass
    try:
        from distlab.folders import runfolder

        runfolder.prune_if_due()
    except Exception:  # noqa: S110  (the first launch prunes, and reports a bad runs root)
        pass
