"""A child of distlab's forkserver that runs on one of :class:`distlab.Nodes`: it enters the node first.

A rank or an agent on a node used to be a fresh interpreter started through ``nsenter`` (and so
importing torch: seconds). A child forked from the torch-preloaded server is ready in milliseconds,
but it is born in the host's namespaces; it moves into the node's with ``setns``, which needs a
single-threaded process for a user or mount namespace: a forked child is one, until it starts a
thread (an idle spare starts none on Linux: :func:`distlab.worker.die_with_parent`).

The node is found only through the namespace files :class:`distlab.Nodes` holds open
(:mod:`distlab.nodes.held`), never through a pid: the kernel puts them in the fork request
(:class:`Entry` pickles each as an fd that travels over the server's socket, ``SCM_RIGHTS``), so the
child gets descriptors of its own for exactly those namespaces. A process inside the nodes' user
namespace could not open the kernel's ``/proc/PID/fd`` anyway (ptrace rules). An agent on a node
hands its own copies on to the ranks it asks the server for (:func:`passed_on`).

Order: the user namespace first (an ordinary user's nodes live in one; joining it gives the
capabilities the others need), then network, host name, mounts; then the working directory again
(entering a mount namespace moves it to ``/``).

Runs in forked children (:func:`enter`, :func:`die_with_requester`) and in the process that asks for
them (:class:`Entry`). Imports nothing heavy: tests use it from a Python without torch.
"""
from __future__ import annotations

import os
import threading

#: setns's flag for each namespace file, in the order a child enters them
CLONE = {"user": 0x10000000, "net": 0x40000000, "uts": 0x04000000, "mnt": 0x00020000}
_ENTERED: list = []  # the Entry this process entered (an agent passes it on to its ranks)


class Entry:
    """A node's namespace descriptors (``{"user"?, "net", "uts", "mnt"}: fd``), the working directory
    and the variables a program there starts with (its PATH). Pickled inside a fork request only:
    each fd then travels with the request and arrives as the child's own descriptor."""

    def __init__(self, fds: dict[str, int], cwd: str, env: dict[str, str] | None = None):
        unknown = set(fds) - set(CLONE)
        if unknown or "net" not in fds:
            raise ValueError(f"not a node's namespaces: {sorted(fds)}")
        self.fds, self.cwd, self.env = dict(fds), cwd, dict(env or {})

    def __reduce__(self):
        from multiprocessing import context, reduction

        if context.get_spawning_popen() is None:  # elsewhere DupFd would start a thread that serves fds
            raise TypeError("an Entry travels only in a request to distlab's forkserver")
        return _arrived, ({k: reduction.DupFd(fd) for k, fd in self.fds.items()}, self.cwd, self.env)


def _arrived(dup_fds: dict, cwd: str, env: dict) -> Entry:
    """The child's side of :meth:`Entry.__reduce__`: the descriptors the request brought."""
    return Entry({k: dup.detach() for k, dup in dup_fds.items()}, cwd, env)


def _setns(fd: int, flag: int) -> None:
    if hasattr(os, "setns"):  # Python 3.12+
        os.setns(fd, flag)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, flag) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def enter(entry: Entry, keep: bool = False) -> None:
    """Move this (forked, single-threaded) process into the node's namespaces, then into the working
    directory it was asked to run in, with the node's variables. ``keep``: keep the descriptors (an
    agent passes them on to its ranks); else they are closed once used."""
    threads = os.listdir("/proc/self/task")
    if len(threads) != 1:
        raise RuntimeError(f"distlab: a process with {len(threads)} threads cannot enter a node (setns needs "
                           "exactly one); this is a bug in distlab's forkserver.")
    for kind, flag in CLONE.items():
        if kind in entry.fds:
            try:
                _setns(entry.fds[kind], flag)
            except OSError as e:
                raise OSError(e.errno, f"distlab: entering the node's {kind} namespace failed: {e.strerror}") from None
    os.chdir(entry.cwd)
    os.environ.update(entry.env)
    if keep:
        _ENTERED[:] = [entry]
        return
    for fd in entry.fds.values():
        os.close(fd)


def passed_on() -> dict:
    """What a rank this process asks for needs to run on the same node: ``{"node": Entry}``, or
    nothing when this process never entered a node."""
    return {"node": _ENTERED[0]} if _ENTERED else {}


def die_with_requester() -> None:
    """End this child when the process that asked for it ends. A rank an agent on a node asked the
    server for is the *server's* child, so the agent's death does not reach it otherwise (a
    fresh-interpreter rank dies with its agent, its parent). The request's pipe tells: the
    requester holds its write end until it ends (``multiprocessing.parent_process().sentinel``)."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    sentinel = getattr(parent, "sentinel", None)
    if sentinel is None:
        return
    threading.Thread(target=_exit_when_closed, args=(sentinel,), daemon=True,
                     name="distlab-requester-watch").start()


def _exit_when_closed(fd: int) -> None:
    from multiprocessing.connection import wait

    from distlab.worker import ORPHAN_EXIT_CODE

    wait([fd])
    os._exit(ORPHAN_EXIT_CODE)
