"""torchelastic's agent woken by its ranks, not by a clock (the forkserver path).

torchelastic's agent sleeps ``monitor_interval`` between looks at its ranks, and each look costs
the kernel ~1.4 ms of CPU: at 10 ms a finished run waited 5 ms on average to be noticed, and the
looks competed with the ranks for the cores. In a run distlab starts with forked ranks, each look
instead waits until something it would notice can have happened: a rank's return value arriving
in its queue, or a rank's process ending (its sentinel). A timeout, a cancellation or a failure
ends a rank, so it wakes the agent too; a Ctrl-C interrupts the wait as it did the sleep.

Implemented by wrapping ``LocalElasticAgent._monitor_workers`` once, active only in a thread that
is inside :func:`prompt`; anything torch changes in the attributes read here falls back to the
old fixed interval, never to a missed event.
"""
from __future__ import annotations

import contextlib
import threading
import time
from multiprocessing import connection

MAX_WAIT_S = 0.05  # a look at least this often, whatever happens
FALLBACK_S = 0.01  # the fixed interval used when the ranks cannot be waited on
_STATE = threading.local()


def watched(pcontext) -> list:
    """What to wait on: the sentinel of every rank not yet joined and the return-value queue of
    every rank whose value has not been read. [] when ``pcontext`` is not torchelastic's
    ``MultiprocessContext`` as this module knows it."""
    processes = getattr(pcontext, "_pc", None)
    queues = getattr(pcontext, "_ret_vals", None)
    read = getattr(pcontext, "_return_values", None)
    sentinels = getattr(processes, "sentinels", None)
    if not isinstance(sentinels, dict) or not isinstance(queues, dict) or not isinstance(read, dict):
        return []
    readers = [getattr(q, "_reader", None) for rank, q in queues.items() if rank not in read]
    if None in readers:
        return []
    return [*sentinels, *readers]


def wait_for_change(pcontext, previous: frozenset = frozenset()) -> frozenset:
    """Block until a watched object is ready (or :data:`MAX_WAIT_S`); return what was ready.

    ``previous``: what was ready at the last call. If exactly that is ready again, nothing was
    consumed in between (a pid not read yet, say): sleep :data:`FALLBACK_S` instead of spinning.
    """
    objects = watched(pcontext)
    if not objects:
        time.sleep(FALLBACK_S)
        return frozenset()
    ready = frozenset(id(o) for o in connection.wait(objects, MAX_WAIT_S))
    if ready and ready == previous:
        time.sleep(FALLBACK_S)
    return ready


@contextlib.contextmanager
def prompt():
    """Inside: agents this thread runs look at their ranks when something happens."""
    _install()
    _STATE.active, _STATE.ready = True, frozenset()
    try:
        yield
    finally:
        _STATE.active = False


def _install() -> None:
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    original = LocalElasticAgent._monitor_workers
    if getattr(original, "_distlab_prompt", False):
        return

    def _monitor_workers(self, worker_group):
        if getattr(_STATE, "active", False) and getattr(self, "_pcontext", None) is not None:
            _STATE.ready = wait_for_change(self._pcontext, _STATE.ready)
        return original(self, worker_group)

    _monitor_workers._distlab_prompt = True
    _monitor_workers.__wrapped__ = original
    LocalElasticAgent._monitor_workers = _monitor_workers
