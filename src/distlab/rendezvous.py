"""Rendezvous for single-node runs, with no store another local user can open.

A ``TCPStore`` has no authentication, and loopback is not privacy: any local user who finds its
port in ``/proc/net/tcp`` can read and overwrite its keys. A single-node run needs no TCP at all:

* the agent (torchelastic, in the kernel) gets an in-process ``HashStore`` from
  :class:`LoopbackRendezvous`: no socket, no file;
* each rank's ``init_process_group`` meets the others in a ``FileStore`` inside the private run
  folder (``distlab.worker``), which only you can open.

Code that picks its own ``MASTER_PORT`` (the article's ``setup()``) gets what torch would give
it, a TCP store hosted by rank 0, but on 127.0.0.1 only (:func:`loopback_store`: torch's own
listens on every interface), and the other ranks join it only after checking that the listener
on that port is yours (:func:`listener_uid`). See the README's "On a shared machine".
"""
from __future__ import annotations

import socket
from datetime import timedelta

LOOPBACK = "127.0.0.1"
LOOPBACK_BACKEND = "distlab-loopback"
PLACEHOLDER_PORT = 1  # MASTER_PORT in single-node ranks: nothing listens there, nothing connects to it
HANDLERS: dict = {}  # run_id -> the LoopbackRendezvous of a live single-node run


def bind_loopback(port: int = 0) -> socket.socket:
    """A listening TCP socket on 127.0.0.1:``port`` (0: any free port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore does: a fixed port reused at once
        sock.bind((LOOPBACK, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def loopback_store(port: int, world_size: int | None, timeout: timedelta, **kwargs):
    """A master ``TCPStore`` listening on 127.0.0.1 only; ``kwargs`` go to ``TCPStore``."""
    from torch.distributed import TCPStore

    sock = bind_loopback(port)
    try:
        store = TCPStore(LOOPBACK, sock.getsockname()[1], world_size, True, timeout,
                         master_listen_fd=sock.fileno(), **kwargs)
    except BaseException:
        try:
            sock.close()
        except OSError:  # the store may have closed the fd already: keep torch's own error (a timeout)
            sock.detach()
        raise
    sock.detach()  # the store owns the listening fd now and closes it when released
    return store


def register_backend() -> None:
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry as registry

    registry.register(LOOPBACK_BACKEND, create_handler)  # idempotent for the same creator


def create_handler(params):
    handler = _handler_class()(params.run_id)
    HANDLERS[params.run_id] = handler
    return handler


def close_handler(run_id: str) -> None:
    """Drop the run's store (idempotent)."""
    handler = HANDLERS.pop(run_id, None)
    if handler is not None:
        handler.shutdown()


_CLASS = None


def _handler_class():
    """Built on first use: torch is imported lazily."""
    global _CLASS
    if _CLASS is None:
        from torch.distributed import HashStore, PrefixStore
        from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousInfo, RendezvousStoreInfo

        class LoopbackRendezvous(RendezvousHandler):
            """Single-node rendezvous (torchelastic's public handler interface) with a fresh
            loopback store per attempt: keys a failed attempt left behind (gloo's peer
            addresses) must not reach the next one."""

            def __init__(self, run_id: str):
                self.run_id, self._store, self._closed = run_id, None, False

            def get_backend(self) -> str:
                return LOOPBACK_BACKEND

            @property
            def use_agent_store(self) -> bool:
                return True  # no rank hosts a store of its own

            def next_rendezvous(self):
                """A fresh in-process store per attempt: nothing a failed attempt left behind reaches
                the next one. MASTER_PORT is a placeholder: ranks never connect to it (they meet in
                a FileStore), but torchrun's contract says it is set."""
                self.shutdown()
                self._store = HashStore()
                info = RendezvousStoreInfo(LOOPBACK, PLACEHOLDER_PORT)
                return RendezvousInfo(PrefixStore(self.run_id, self._store), 0, 1, info)

            def is_closed(self) -> bool:
                return self._closed

            def set_closed(self) -> None:
                self._closed = True

            def num_nodes_waiting(self) -> int:
                return 0

            def get_run_id(self) -> str:
                return self.run_id

            def shutdown(self) -> bool:
                self._store = None
                return True

        _CLASS = LoopbackRendezvous
    return _CLASS


def listener_uid(port: int, tables=("/proc/net/tcp", "/proc/net/tcp6")) -> int | None:
    """The uid that owns the socket listening on loopback ``port``, from ``/proc/net/tcp``; None
    when nothing listens there or the table cannot be read (not Linux)."""
    for table in tables:
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        uid = listening_uid(rows, port)
        if uid is not None:
            return uid
    return None


def listening_uid(rows: list[str], port: int) -> int | None:
    """Pure half of :func:`listener_uid`: rows of ``/proc/net/tcp`` -> the listener's uid.

    Columns: ``sl local_address rem_address st ...``; state ``0A`` is LISTEN, the uid is column 8.
    A listener on 0.0.0.0 or on 127.0.0.1 both answer a connection to 127.0.0.1.
    """
    for row in rows:
        fields = row.split()
        if len(fields) > 7 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
            return int(fields[7])
    return None
