"""distlab on Colab's and Kaggle's psutil 5.9, whose Process has ``connections`` and not yet
``net_connections`` (psutil 6.0's name): played by a fake Process of that API, no processes."""
from __future__ import annotations

from types import SimpleNamespace

import psutil

from distlab import worker
from distlab.teach import process_group


class OldProcess:
    """psutil 5.9's Process, as far as distlab uses it: ``connections(kind)``, no ``net_connections``."""

    def __init__(self, *conns):
        self.conns, self.asked = conns, []

    def connections(self, kind="inet"):
        self.asked.append(kind)
        return list(self.conns)


def conn(port, status, raddr=()):
    return SimpleNamespace(laddr=SimpleNamespace(ip="127.0.0.1", port=port), status=status,
                           raddr=SimpleNamespace(ip="127.0.0.1", port=raddr[0]) if raddr else ())


def test_a_store_port_this_process_serves_is_found_with_psutil_5(monkeypatch):
    old = OldProcess(conn(29500, psutil.CONN_LISTEN), conn(29501, psutil.CONN_ESTABLISHED, (40000,)))
    monkeypatch.setattr(psutil, "Process", lambda *pid: old)
    assert not hasattr(old, "net_connections")
    assert worker._serving(29500) is True
    assert worker._serving(29501) is False
    assert old.asked == ["inet", "inet"]


def test_this_process_tcp_links_with_psutil_5(monkeypatch):
    old = OldProcess(conn(29500, psutil.CONN_LISTEN), conn(50000, psutil.CONN_ESTABLISHED, (29500,)))
    monkeypatch.setattr(psutil, "Process", lambda *pid: old)
    assert process_group.tcp_links() == {("127.0.0.1", 50000, "127.0.0.1", 29500)}
    assert old.asked == ["tcp"]


def test_psutil_6_and_later_are_asked_by_their_own_name():
    class NewProcess(OldProcess):
        def net_connections(self, kind="inet"):
            return ["new", kind]

    assert worker.own_connections(NewProcess(), "tcp") == ["new", "tcp"]
