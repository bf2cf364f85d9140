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
on that port is yours (:func:`listener_uid`, then :func:`connected_uid`). See the README's "On a shared machine".
"""
from __future__ import annotations

import ipaddress
import os
import socket
import sys
from datetime import timedelta

LOOPBACK = "127.0.0.1"
LOOPBACK_BACKEND = "distlab-loopback"
PLACEHOLDER_PORT = 1  # MASTER_PORT in single-node ranks: nothing listens there, nothing connects to it
HANDLERS: dict = {}  # run_id -> the LoopbackRendezvous of a live single-node run


def bind_loopback(port: int = 0) -> socket.socket:
    """A listening TCP socket on 127.0.0.1:``port`` (0: any free port)."""
    return listening_socket(LOOPBACK, port)


def listening_socket(address: str, port: int, family: int = socket.AF_INET) -> socket.socket:
    """A TCP socket listening on ``address:port`` only (not on every interface), set up as
    ``TCPStore`` sets up its own: a fixed port can be reused at once."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
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


TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
LISTEN, TIME_WAIT = "0A", "06"  # a TIME_WAIT row has lost its owner (it shows uid 0)
# the local addresses whose listener answers a connection to 127.0.0.1 (a listener on 127.0.0.2 does not)
ANSWERS_LOOPBACK = frozenset(ipaddress.ip_address(a) for a in ("127.0.0.1", "0.0.0.0", "::", "::ffff:127.0.0.1"))


def listener_uid(port: int, tables=TABLES) -> int | None:
    """The uid that owns the socket listening on ``port`` that a connection to 127.0.0.1 would
    reach, from ``/proc/net/tcp``; None when nothing listens there or the table cannot be read
    (not Linux)."""
    for table in tables:
        uid = listening_uid(_table_rows(table), port)
        if uid is not None:
            return uid
    return None


def _table_rows(table: str) -> list[str]:
    try:
        with open(table) as f:
            return f.read().splitlines()[1:]
    except OSError:
        return []


def parse_endpoint(text: str) -> tuple:
    """``0100007F:3039`` (``/proc/net/tcp``) or its 32-digit IPv6 form -> (address, port). The
    kernel prints each 32-bit word of the address in host byte order."""
    hexaddr, hexport = text.rsplit(":", 1)
    raw = bytes.fromhex(hexaddr)
    order = "little" if sys.byteorder == "little" else "big"
    words = b"".join(int.from_bytes(raw[i:i + 4], order).to_bytes(4, "big") for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words), int(hexport, 16)


def listening_uid(rows: list[str], port: int) -> int | None:
    """Pure half of :func:`listener_uid`: rows of ``/proc/net/tcp`` -> the uid of the listener a
    connection to 127.0.0.1:``port`` reaches.

    Columns: ``sl local_address rem_address st ...``; state ``0A`` is LISTEN, the uid is column 8.
    Listeners on 127.0.0.1, 0.0.0.0, ``::`` and ``::ffff:127.0.0.1`` answer such a connection;
    one on 127.0.0.2 (or any other address) does not, and must not make a run refuse.
    """
    found = listeners(rows, port)
    return found[0][0] if found else None


def listeners(rows: list[str], port: int) -> list[tuple[int, int]]:
    """(uid, socket inode) of every listener on ``port`` that a connection to 127.0.0.1 reaches:
    the same sockets make a bind to 127.0.0.1:``port`` fail. The inode is column 10."""
    found = []
    for row in rows:
        fields = row.split()
        if len(fields) > 9 and fields[3] == LISTEN:
            address, local_port = parse_endpoint(fields[1])
            if local_port == port and address in ANSWERS_LOOPBACK:
                found.append((int(fields[7]), int(fields[9])))
    return found


def same_endpoint(a: tuple, b: tuple) -> bool:
    """Whether two (address, port) pairs name one endpoint (``::ffff:127.0.0.1`` is 127.0.0.1)."""
    def plain(address):
        return getattr(address, "ipv4_mapped", None) or address

    return a[1] == b[1] and plain(a[0]) == plain(b[0])


def accepting_uid(rows: list[str], server: tuple, client: tuple) -> int | None:
    """Pure half of :func:`connected_uid`: the uid of the socket that took our connection.

    The server's end of a connection is the row whose local endpoint is ``server`` and whose
    remote endpoint is ``client`` (ours); it belongs to whoever owns the listener that accepted it,
    in any state but TIME_WAIT (a peer that accepted and closed at once is still named).
    """
    for row in rows:
        fields = row.split()
        if len(fields) > 7 and fields[3] not in (LISTEN, TIME_WAIT) and \
                same_endpoint(parse_endpoint(fields[1]), server) and same_endpoint(parse_endpoint(fields[2]), client):
            return int(fields[7])
    return None


def connected_uid(port: int, timeout: float = 5.0, tables=TABLES) -> int | None:
    """Connect to 127.0.0.1:``port`` and return the uid of the process that accepted: the table
    of listeners says who *listened* a moment ago, this says who answers (it cannot be fooled by
    a listener that came after the look, or by an address the table check did not think of).
    None when nothing accepts or the tables cannot be read (not Linux)."""
    try:
        sock = socket.create_connection((LOOPBACK, port), timeout=timeout)
    except OSError:
        return None
    with sock:
        server = (ipaddress.ip_address(LOOPBACK), port)
        host, client_port = sock.getsockname()[:2]
        client = (ipaddress.ip_address(host), client_port)
        for table in tables:
            uid = accepting_uid(_table_rows(table), server, client)
            if uid is not None:
                return uid
    return None


def describe_holder(uid: int | None, pid: int | None, command: str | None, me: int, user: str) -> str:
    """Pure: who holds a port, in the words of :data:`~distlab.errors.PORT_IN_USE` (``user`` names
    ``uid`` for a stranger)."""
    from distlab.errors import HOLDER_OTHER, HOLDER_UNKNOWN, HOLDER_YOURS, HOLDER_YOURS_UNNAMED

    if uid is None:
        return HOLDER_UNKNOWN
    if uid != me:
        return HOLDER_OTHER.format(user=user)
    if pid is None:
        return HOLDER_YOURS_UNNAMED
    return HOLDER_YOURS.format(pid=pid, command=command or "?")


def port_holder(port: int, tables=TABLES) -> str:
    """Who listens on ``port`` where a bind to 127.0.0.1 collides, for an error message: the uid
    from ``/proc/net/tcp``, and, when the socket is yours, the process that has it open (found by
    its inode among your processes' open files)."""
    found = [hit for table in tables for hit in listeners(_table_rows(table), port)]
    if not found:
        return describe_holder(None, None, None, os.geteuid(), "")
    uid, inode = found[0]
    pid = socket_pid(inode) if uid == os.geteuid() else None
    return describe_holder(uid, pid, command_of(pid) if pid else None, os.geteuid(), user_name(uid))


def socket_pid(inode: int, proc: str = "/proc") -> int | None:
    """The process (of yours: only those ``/proc/<pid>/fd`` lets you read) that has socket ``inode`` open."""
    target = f"socket:[{inode}]"
    me = os.geteuid()
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        folder = os.path.join(proc, name, "fd")
        try:
            if os.stat(os.path.join(proc, name)).st_uid != me:
                continue
            for fd in os.listdir(folder):
                if os.readlink(os.path.join(folder, fd)) == target:
                    return int(name)
        except OSError:  # gone, or not ours to read
            continue
    return None


def command_of(pid: int, limit: int = 80) -> str:
    """A process's command line, shortened: ``python -m ipykernel_launcher -f ...``."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(" ".join(w.decode(errors="replace") for w in words if w).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def user_name(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"
