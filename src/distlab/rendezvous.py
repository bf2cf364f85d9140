"""Stores that listen on 127.0.0.1 only, for single-node runs.

torch's ``TCPStore`` listens on every interface, whatever host name it is given. distlab binds
the socket to 127.0.0.1 itself and hands torch its file descriptor (``master_listen_fd``): the
port is held from the start (no bind-then-close race) and nothing is reachable from the network.

Two places use this: the agent's rendezvous (:class:`LoopbackRendezvous`, the store every
worker joins by default) and, inside workers, rank 0's store when user code picks its own
``MASTER_PORT`` (the article's ``setup()``; see ``distlab.worker``).

Loopback is not privacy: other users of this machine can connect to 127.0.0.1 too. A TCPStore
has no authentication; see the README's "On a shared machine".
"""
from __future__ import annotations

import socket
from datetime import timedelta

LOOPBACK = "127.0.0.1"
LOOPBACK_BACKEND = "distlab-loopback"
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
        sock.close()
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
    """Drop the run's store (idempotent): its port closes once nothing else holds it."""
    handler = HANDLERS.pop(run_id, None)
    if handler is not None:
        handler.shutdown()


_CLASS = None


def _handler_class():
    """Built on first use: torch is imported lazily."""
    global _CLASS
    if _CLASS is None:
        from torch.distributed import PrefixStore
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
                return True  # workers join the agent's store instead of hosting one

            def next_rendezvous(self):
                self.shutdown()
                self._store = loopback_store(0, 1, timedelta(seconds=300), wait_for_workers=False)
                info = RendezvousStoreInfo(LOOPBACK, self._store.port)
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
