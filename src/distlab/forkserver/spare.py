"""A child of distlab's forkserver on its way to becoming a rank: a spare waiting for its run, or a
child forked for a request that found no spare (see :mod:`distlab.forkserver.server`).

Runs only in processes forked from the server. A spare is forked while the server is idle, does
there what every rank does before it knows its run (the fork itself, the after-fork hooks, a
fresh random state, :func:`warm_up`), then blocks on its socket until the server hands it a
request's file descriptors; from there on it is exactly the child ``multiprocessing``'s forkserver
would have forked for that request (``spawn._main`` reads the process object and runs it).

An idle spare is named ``distlab-spare`` (``/proc/PID/comm``), so that a tool counting a kernel's
leftover workers can leave it out (``distlab.teach.failures``); it takes its name back when it
gets a run.
"""
from __future__ import annotations

import importlib
import os
import signal
import sys
from multiprocessing import forkserver as mp_forkserver
from multiprocessing import reduction, resource_tracker, spawn

from distlab.forkserver import mode

SPARE_NAME = mode.SPARE_NAME.encode()
RECEIVED: tuple | None = None  # (time.time(), minor page faults, CPU seconds) when this spare got its run


def _now() -> tuple:
    """When, and after how much work, a spare got its run: for ``bench/launch_phases.py``."""
    import resource
    import time

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return time.time(), usage.ru_minflt, usage.ru_utime + usage.ru_stime
PR_SET_NAME = 15
HOLDS = b"h"  # a spare to the server: I hold the request's fds
RUN = b"r"  # the server to the spare: the client knows your pid, run


def become_rank(child_r: int, inherited: list[int]) -> int:
    """Run the process object the client writes on ``child_r``; returns its exit code.

    ``inherited``: the client's "alive" fd, its resource tracker's fd, then the fds it asked the
    child to inherit, in the order ``distlab.forkserver.client`` sends them."""
    server = mp_forkserver._forkserver
    server._forkserver_alive_fd, resource_tracker._resource_tracker._fd, *server._inherited_fds = inherited
    parent_sentinel = os.dup(child_r)
    return spawn._main(child_r, parent_sentinel)


def wait_then_run(sock, server_pid: int, handlers: dict, max_fds: int, name: bytes) -> int:
    """The life of a spare: get ready, wait for a request's fds, become that request's rank.

    Returns 0 without running anything when the server goes or closes the socket (it stops
    keeping spares). ``handlers``: the signal handlers a rank starts with (the server ignores
    SIGINT; an idle spare too, so a Ctrl-C in a terminal does not kill the spares). ``name``: the
    process name a rank has (the server's; a spare is forked already named ``distlab-spare``).

    Having the fds, it says so (:data:`HOLDS`): only then does the server give the client this
    pid, so a spare killed a moment earlier is passed over, not handed a launch. It runs at once;
    the server's answer (:data:`RUN`: the client has the pid) is read only before the rank writes
    its exit code on the same pipe, which must come after the pid."""
    warm_up(server_pid)
    try:
        child_r, status_w, *inherited = reduction.recvfds(sock, max_fds)
        sock.sendall(HOLDS)
    except (EOFError, OSError, ValueError):
        sock.close()
        return 0
    global RECEIVED
    RECEIVED = _now()
    set_name(name)
    importlib.invalidate_caches()  # a module written since this spare was forked must be found
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    me = os.getpid()
    code = become_rank(child_r, inherited)
    if TELL_EXIT_EARLY and os.getpid() == me and _pid_given(sock):  # not a process the rank forked
        tell_exit(status_w, code)
    sock.close()
    return code


def _pid_given(sock) -> bool:
    """Whether the server has given the client this process's pid (it answers at once; by the
    time a rank ends, the answer waits in the socket)."""
    try:
        return sock.recv(1) == RUN
    except OSError:
        return False


TELL_EXIT_EARLY = False  # a rank of a launch sets it (tell_exit_early): its launcher waits for the exit


def tell_exit_early() -> None:
    """Called by a rank of a launch (:mod:`distlab.forkserver.rank`): its launcher waits for this
    process to be gone, so the exit code goes to the launcher as soon as the rank's Python is done."""
    global TELL_EXIT_EARLY
    TELL_EXIT_EARLY = True


def tell_exit(status_w: int, code: int) -> None:
    """Write this rank's exit code where the launcher reads it, now, not after the process is gone.

    The server writes it too, once it has reaped the process; but tearing down a process that
    holds torch takes 6-10 ms (``bench/launch_phases.py``), and the launch's agent waits for every
    rank's exit code. Only a rank of a launch does it (its launcher then waits for the process to
    be gone, ``distlab.forkserver.client.wait_gone``), after its last line of Python has run."""
    try:
        mp_forkserver.write_signed(status_w, code)
    except OSError:
        pass


def warm_up(server_pid: int) -> None:
    """Do ahead, while idle, what every rank does first and no run changes: tie this process to
    the server's life (a rank's parent is the server), draw fresh random seeds.

    Each step also copies the server's memory pages it writes to into this process, which a
    rank would otherwise pay for while its launch waits (copy-on-write faults)."""
    from distlab import worker
    from distlab.forkserver import child

    # SIGKILL when the server dies; the watchdog thread only with the run (Linux), so that a spare
    # stays single-threaded and may still enter a node (distlab.forkserver.enter)
    worker.die_with_parent(server_pid, watchdog=not sys.platform.startswith("linux"))
    child.fresh_random_state()
    importlib.invalidate_caches()  # done again with the run; the pages it writes are ours now


def process_name() -> bytes:
    try:
        with open("/proc/self/comm", "rb") as f:
            return f.read().strip()
    except OSError:
        return b""


def set_name(name: bytes) -> None:
    """This process's name as ``ps`` and ``psutil.Process.name()`` show it (Linux only)."""
    if not name or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, ctypes.c_char_p(name[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass
