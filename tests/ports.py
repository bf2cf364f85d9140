"""A port for a child process to listen on, held for the test until the child has it.

Binding 127.0.0.1:0 and closing the socket names a free port, but until the child binds it
anyone else on the host may take it (two suites on one machine do). A socket that stays bound
with SO_REUSEADDR, never listening, keeps the port out of other hands: the OS hands it to no one
and refuses any other bind. Linux still lets a process that also sets SO_REUSEADDR listen on it,
as torch's TCPStore, distlab's loopback store, JupyterLab (tornado) and torchrun's c10d store do.
"""
from __future__ import annotations

import contextlib
import socket


@contextlib.contextmanager
def reserved_port(host: str = "127.0.0.1"):
    """Yields a port number that stays reserved until the ``with`` block ends."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        yield sock.getsockname()[1]
    finally:
        sock.close()

