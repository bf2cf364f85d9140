"""A ``FileStore`` that notices a key within a fraction of a millisecond, not 10 ms later.

distlab's ranks meet in a ``FileStore`` in their private run folder (no port another user could
open: see :mod:`distlab.worker`). torch's ``FileStore`` looks for a missing key every 10 ms, and
the first rank to reach ``init_process_group`` always waits for a key the next rank has not
written yet: a 2-rank gloo group took 11.0 ms to form where the ranks arrive 2 ms apart, against
6.2 ms with this wrapper (``bench/rank_costs.py``, medians of 21).

``PromptStore`` keeps the file and every rule of the ``FileStore`` (same keys, same file, same
timeout errors) and only adds, before a blocking ``get``/``wait``, a check loop that starts at
0.2 ms and backs off to 5 ms, for the first second of the wait. It is used on CPU-only
machines: there the group is gloo's, whose store calls come from the thread that called
``init_process_group``; NCCL's background threads would have to take the GIL for every store
call, so a CUDA machine keeps the plain ``FileStore``.
"""
from __future__ import annotations

import functools
import time
from datetime import timedelta

FIRST_PAUSE_S = 0.0002
LONGEST_PAUSE_S = 0.005
POLL_WINDOW_S = 1.0


def prompt_store(file_store):
    """``file_store`` wrapped (the class is made on first use: torch is imported lazily). Its
    groups are torn down at exit while the interpreter is whole (:mod:`distlab.rendezvous.retired_groups`)."""
    from distlab.rendezvous import retired_groups

    retired_groups.release_at_exit()
    store = store_class()(file_store)
    _LIVE.append(store)
    return store


# Every PromptStore made in this process, kept for its life: torch holds a store only in C++, and a
# C++ call into a Python store whose Python object was collected fails ("fn INTERNAL ASSERT FAILED
# ... Not implemented."): ``new_group`` after ``init_process_group`` did. One per rendezvous.
_LIVE: list = []


@functools.cache
def store_class():
    import torch.distributed as dist

    class PromptStore(dist.Store):
        """The ``FileStore`` it wraps, with blocking reads that look often (see the module)."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            self.set_timeout(inner.timeout)

        def set_timeout(self, timeout: timedelta) -> None:
            super().set_timeout(timeout)
            self.inner.set_timeout(timeout)

        def _look(self, keys: list[str]) -> None:
            """Look for ``keys`` often, for at most a tenth of the timeout (and 1 s); the inner
            store's own blocking call does the rest, so torch's timeout and its error stay as
            they were (a run waits at most that tenth longer)."""
            window = min(POLL_WINDOW_S, 0.1 * self.timeout.total_seconds())
            deadline = time.monotonic() + window
            pause = FIRST_PAUSE_S
            while not self.inner.check(keys) and time.monotonic() < deadline:
                time.sleep(pause)
                pause = min(pause * 1.5, LONGEST_PAUSE_S)

        def get(self, key: str) -> bytes:
            self._look([key])
            return self.inner.get(key)

        def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
            self._look(keys)
            if timeout is None:
                self.inner.wait(keys)
            else:
                self.inner.wait(keys, timeout)

        def set(self, key: str, value) -> None:
            self.inner.set(key, value)

        def add(self, key: str, value: int) -> int:
            return self.inner.add(key, value)

        def check(self, keys: list[str]) -> bool:
            return self.inner.check(keys)

        def compare_set(self, key: str, expected, desired) -> bytes:
            return self.inner.compare_set(key, expected, desired)

        def delete_key(self, key: str) -> bool:
            return self.inner.delete_key(key)

        def num_keys(self) -> int:
            return self.inner.num_keys()

        def append(self, key: str, value) -> None:
            self.inner.append(key, value)

        def multi_get(self, keys: list[str]) -> list[bytes]:
            self._look(keys)
            return self.inner.multi_get(keys)

        def multi_set(self, keys: list[str], values: list) -> None:
            self.inner.multi_set(keys, values)

    return PromptStore
