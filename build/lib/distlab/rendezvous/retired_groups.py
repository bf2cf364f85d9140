"""A destroyed gloo group's sockets close when its rank exits, not inside ``destroy_process_group``.

Tearing down a ``ProcessGroupGloo`` takes 20 ms on every rank whatever the store (gloo's socket
loop wakes on a 10 ms ``epoll_wait`` timeout, and joins its threads): the largest single cost of
a short run (``bench/launch_latency.py``). In a rank distlab started, ``destroy_process_group``
still does everything it promises (the group is unregistered, ``is_initialized()`` is False, a
new group can be made at once), but the last reference to each destroyed gloo group is kept
here, so the C++ teardown happens when the process ends, with everything else it holds. A forked
rank ends with ``os._exit``, so it never pays that teardown at all.

A process that ends the normal way (a fresh interpreter) releases them, and destroys a gloo group
still up, in an ``atexit`` handler, while the interpreter is whole. Torn down later, during
finalization, a group whose store is a Python object (:mod:`distlab.rendezvous.prompt_store`) aborted the
process ("terminate called without an active exception": 3 runs in 6).

Only gloo groups are kept: NCCL's ``destroy_process_group`` shuts its communicators down itself,
and a CUDA group must not be torn down after CUDA is. At most :data:`KEEP` groups wait; an older
one is then released (and pays its 20 ms), so a rank that makes groups in a loop stays small.
"""
from __future__ import annotations

import atexit

KEEP = 16
_KEPT: list = []
_STATE = {"ends_with_os_exit": False, "at_exit": False}


def install() -> None:
    """Wrap ``torch.distributed.destroy_process_group`` in this process (a rank distlab started)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    original = c10d.destroy_process_group
    if getattr(original, "_distlab_keeps_gloo", False):
        return

    def destroy_process_group(group=None):
        groups = _gloo_groups(group)
        original(group)
        keep(groups)

    destroy_process_group.__doc__ = original.__doc__
    destroy_process_group.__wrapped__ = original
    destroy_process_group._distlab_keeps_gloo = True
    c10d.destroy_process_group = dist.destroy_process_group = destroy_process_group
    release_at_exit()


def ends_with_os_exit() -> None:
    """This process ends with ``os._exit`` (a forked rank): nothing to release at exit."""
    _STATE["ends_with_os_exit"] = True


def release_at_exit() -> None:
    """Have :func:`_release` run at exit (once per process)."""
    if not _STATE["at_exit"]:
        _STATE["at_exit"] = True
        atexit.register(_release)


def _release() -> None:
    if _STATE["ends_with_os_exit"]:
        return
    from torch.distributed import distributed_c10d as c10d

    destroy = getattr(c10d.destroy_process_group, "__wrapped__", c10d.destroy_process_group)
    try:
        if c10d.is_initialized() and all(_backend(c10d._world, pg) == "gloo" for pg in c10d._world.pg_map):
            destroy()
    finally:
        _KEPT.clear()


def keep(groups: list) -> None:
    """Hold ``groups`` until the process ends; release the oldest beyond :data:`KEEP`."""
    _KEPT.extend(groups)
    del _KEPT[:max(0, len(_KEPT) - KEEP)]


def _gloo_groups(group) -> list:
    """The gloo-only process groups ``destroy_process_group(group)`` is about to unregister."""
    from torch.distributed import distributed_c10d as c10d

    try:
        world = c10d._world
        chosen = list(world.pg_map) if group is None or group is c10d.GroupMember.WORLD else [group]
        return [pg for pg in chosen if pg is not None and _backend(world, pg) == "gloo"]
    except Exception:  # torch's private bookkeeping changed: destroy as torch does, keep nothing
        return []


def _backend(world, pg) -> str:
    entry = world.pg_map.get(pg)
    return str(entry[0]).lower() if entry else ""
