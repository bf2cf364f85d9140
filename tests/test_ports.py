"""The test helper that holds a port for a child process (tests/ports.py) keeps its two promises."""
import socket
from datetime import timedelta

import pytest
import torch.distributed as dist
from ports import reserved_port


def test_a_reserved_port_is_refused_to_others_and_open_to_a_store():
    with reserved_port() as port:
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
        store = dist.TCPStore("127.0.0.1", port, 1, True, timedelta(seconds=10), wait_for_workers=False)
        store.set("k", "v")
        assert store.get("k") == b"v"
