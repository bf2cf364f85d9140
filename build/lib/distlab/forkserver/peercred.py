"""Who is at the other end of a Unix socket: the check distlab's forkserver makes on every connection.

Whoever can connect to a ``multiprocessing`` forkserver can have it fork a process that unpickles
what they send: code running as you. The server's socket lives in your private folder, but on
CPython 3.10.0-3.10.8 and 3.11.0 (CVE-2022-42919) it was an abstract-namespace socket that any
local user could reach. So distlab refuses a forkserver whose socket would be abstract
(:func:`abstract_socket_reason`) and its server accepts a connection only from your own uid
(:class:`PeerCheckedSocket`, the listener of ``distlab.forkserver.server``).
"""
from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
import sys


def peer_uid(sock: socket.socket) -> int | None:
    """The effective uid of the process that connected ``sock``; None where the OS cannot say."""
    if hasattr(socket, "SO_PEERCRED"):  # Linux
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[1]
    try:  # macOS and the BSDs
        libc = ctypes.CDLL(None, use_errno=True)
        uid, gid = ctypes.c_uint32(), ctypes.c_uint32()
        if libc.getpeereid(sock.fileno(), ctypes.byref(uid), ctypes.byref(gid)) == 0:
            return uid.value
    except (OSError, AttributeError):
        pass
    return None


def can_check_peers() -> bool:
    return hasattr(socket, "SO_PEERCRED") or sys.platform == "darwin" or "bsd" in sys.platform


class PeerCheckedSocket(socket.socket):
    """A listening socket whose ``accept`` drops any connection not made by this process's uid.

    A refused connection raises ``ECONNABORTED``; the server's loop goes on serving, and nothing
    the peer sent is ever read.
    """

    def accept(self):
        conn, address = super().accept()
        uid = peer_uid(conn)
        if uid != os.geteuid():
            conn.close()
            print(f"distlab forkserver: refused a connection from uid {uid}", file=sys.stderr, flush=True)
            raise ConnectionAbortedError(errno.ECONNABORTED, "connection from another user refused")
        return conn, address


def abstract_socket_reason(address: str | bytes | None = None) -> str | None:
    """Why a forkserver must not be used here, or None: its socket would be in the abstract
    namespace (no file permissions: every local user can connect)."""
    if address is None:
        from multiprocessing import connection

        address = connection.arbitrary_address("AF_UNIX")
    first = address[:1]
    if first in ("\0", b"\0"):
        return (f"this Python ({sys.version.split()[0]}) puts a forkserver's socket in the abstract namespace, "
                "which any local user can connect to (CVE-2022-42919)")
    if not can_check_peers():
        return "this OS cannot tell the forkserver who connects to it"
    return None
