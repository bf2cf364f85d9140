"""A node's identity held as open namespace files (distlab.nodes.held), in this process (issue #60: mutated; starts
no process): this test process stands in for a holder, its parent for the ``unshare`` that started it."""
import os
import signal

import pytest

from distlab.errors import NODE_GONE, NodesError
from distlab.nodes import held


@pytest.fixture(autouse=True)
def no_waiting():
    """alive() asks without waiting (a running holder's pidfd never turns readable): a test that waits fails
    after 10 s instead of hanging."""
    def waited(signum, frame):
        raise TimeoutError("alive() waited for the holder to end")

    old = signal.signal(signal.SIGALRM, waited)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def own_environ() -> list[str]:
    with open("/proc/self/environ", "rb") as f:
        return [entry.decode() for entry in f.read().split(b"\0") if entry]


@pytest.fixture
def me():
    """This process held as a node, closed afterwards."""
    node = held.hold("node 1", os.getpid(), os.getppid(), held.KINDS["node"])
    yield node
    node.close()


def test_a_holder_proved_to_be_the_starter_s_child_is_held_by_its_namespaces(me):
    assert (me.name, me.pid, me.starter_pid) == ("node 1", os.getpid(), os.getppid())
    assert sorted(me.fds) == ["mnt", "net", "uts"] and me.alive()
    for kind in ("net", "uts", "mnt"):
        assert me.inode(kind) == held.own_inode(kind)
        assert os.readlink(f"/proc/self/fd/{me.fds[kind]}").startswith(f"{kind}:[")
        assert not os.get_inheritable(me.fds[kind])
    assert me.inode() == held.own_inode() == held.own_inode("net")
    me.check()  # alive: says nothing


def test_the_paths_a_command_opens_the_namespaces_through(me):
    fd = me.fds["net"]
    assert me.path("net") == f"/proc/{os.getpid()}/fd/{fd}"
    assert me.inherited("net") == f"/proc/self/fd/{fd}" and me.inherited() == me.inherited("net")
    assert me.nsenter_options(["net", "uts", "mnt"]) == [
        f"--net=/proc/{os.getpid()}/fd/{fd}", f"--uts=/proc/{os.getpid()}/fd/{me.fds['uts']}",
        f"--mount=/proc/{os.getpid()}/fd/{me.fds['mnt']}"]
    assert held.OPTION["user"] == "--user" and held.KINDS == {"switch": ("net",), "node": ("net", "uts", "mnt")}


def test_closing_lets_go_of_every_file_once(monkeypatch):
    before = open_fds()
    node = held.hold("switch", os.getpid(), os.getppid(), held.KINDS["switch"])
    assert len(open_fds() - before) == 2  # the pidfd and the network namespace
    node.close()
    assert open_fds() == before and (node.fds, node.pidfd) == ({}, -1)
    assert not node.alive()
    node.close()  # again: nothing to close
    with pytest.raises(NodesError) as gone:
        node.check()
    assert str(gone.value) == NODE_GONE.format(node="switch")


def test_a_file_closed_elsewhere_does_not_stop_the_others_closing():
    a, b = os.pipe()
    c, d = os.pipe()
    os.close(a)
    node = held.Held("node 2", 1, 0, c, {"net": a, "uts": b})
    node.close()
    for fd in (b, c):
        with pytest.raises(OSError):
            os.fstat(fd)
    os.close(d)


def test_a_holder_whose_pidfd_turned_readable_has_ended():
    """A pidfd turns readable when its process exits; a pipe with data stands in for it here."""
    r, w = os.pipe()
    os.write(w, b"x")
    node = held.Held("node 2", 1, 0, r)
    assert not node.alive()
    with pytest.raises(NodesError, match="node 2 is gone"):
        node.check()
    os.close(w)
    node.close()
    r, w = os.pipe()
    assert held.Held("node 2", 1, 0, r).alive()  # nothing to read: still running
    os.close(r)
    os.close(w)


def no_such_pid() -> int:
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read()) + 1


def test_a_holder_that_is_gone_before_it_is_held(monkeypatch):
    before = open_fds()
    with pytest.raises(NodesError) as gone:
        held.hold("node 1", no_such_pid(), os.getppid(), ("net",))
    assert str(gone.value).startswith(NODE_GONE.format(node="node 1") + " (")
    assert str(gone.value).endswith(")") and gone.value.__suppress_context__ and gone.value.__cause__ is None
    assert open_fds() == before


def test_a_pid_that_is_not_the_starter_s_child_is_refused():
    before = open_fds()
    with pytest.raises(NodesError) as refused:
        held.hold("node 1", os.getpid(), os.getpid(), ("net",))
    assert str(refused.value) == (NODE_GONE.format(node="node 1")
                                  + f" (pid {os.getpid()} is not the holder distlab started)")
    assert open_fds() == before


def test_a_namespace_that_cannot_be_opened_closes_what_was(monkeypatch):
    before = open_fds()
    with pytest.raises(NodesError) as gone:
        held.hold("node 1", os.getpid(), os.getppid(), ("net", "no-such-kind"))
    assert str(gone.value).startswith(NODE_GONE.format(node="node 1") + " ([Errno 2] ")
    assert gone.value.__suppress_context__ and open_fds() == before


@pytest.mark.parametrize("error", [NodesError("ended meanwhile"), KeyboardInterrupt()])
def test_a_holder_that_ends_while_it_is_held_closes_what_was_opened(monkeypatch, error):
    def ended(self):
        raise error

    monkeypatch.setattr(held.Held, "check", ended)
    before = open_fds()
    with pytest.raises(type(error)) as raised:
        held.hold("node 1", os.getpid(), os.getppid(), ("net", "uts"))
    assert raised.value is error and open_fds() == before


def test_the_holder_checked_after_its_files_are_open(monkeypatch):
    monkeypatch.setattr(held.Held, "alive", lambda self: False)
    before = open_fds()
    with pytest.raises(NodesError) as gone:
        held.hold("node 3", os.getpid(), os.getppid(), ("net",))
    assert str(gone.value) == NODE_GONE.format(node="node 3") and open_fds() == before


@pytest.fixture
def odd_name():
    """This process's command name with a ")" and spaces in it, as a user may name a process."""
    with open("/proc/self/comm") as f:
        name = f.read().rstrip("\n")
    with open("/proc/self/comm", "w") as f:
        f.write("a) 9 9 (b")
    yield
    with open("/proc/self/comm", "w") as f:
        f.write(name)


def test_the_parent_is_read_after_the_command_name_whatever_it_holds(odd_name):
    assert held.parent_pid(os.getpid()) == os.getppid()


def test_members_are_the_processes_in_a_network_namespace():
    net = held.own_inode()
    assert os.getpid() in held.members(net, set())
    assert os.getpid() not in held.members(net, {os.getpid()})
    assert held.members((0, 0), set()) == []


def test_members_started_with_a_mark(monkeypatch):
    net, first = held.own_inode(), own_environ()[0]
    assert os.getpid() in held.members(net, set(), first)
    assert os.getpid() not in held.members(net, set(), "DISTLAB_NO_SUCH=mark")
    listed = ["self", str(no_such_pid()), str(os.getpid()), "1x"]
    monkeypatch.setattr(os, "listdir", lambda path: listed if path == "/proc" else [])
    assert held.members(net, set()) == [os.getpid()]  # one gone meanwhile: the rest are still looked at


def test_a_mark_is_a_whole_entry_of_the_environment_a_process_started_with(monkeypatch):
    first = own_environ()[0]
    monkeypatch.setenv("DISTLAB_SET_LATER", "1")
    assert held.carries(os.getpid(), first)
    assert not held.carries(os.getpid(), first[:-1]) and not held.carries(os.getpid(), first[1:])
    assert not held.carries(os.getpid(), "DISTLAB_SET_LATER=1")  # set after it started
    assert not held.carries(no_such_pid(), first)


@pytest.fixture
def fd0():
    """Descriptor 0 as an empty pipe's read end: a process started with stdin closed gets 0 for its first open,
    a pidfd or a namespace file included. Restored afterwards."""
    saved = os.dup(0)
    r, w = os.pipe()
    os.dup2(r, 0)
    os.close(r)
    yield w
    os.dup2(saved, 0)
    os.close(saved)
    os.close(w)


def test_descriptor_0_is_a_descriptor_like_any_other(fd0):
    node = held.Held("node 1", 1, 0, 0)
    assert node.alive()  # an empty pipe: not readable, as a running process's pidfd
    os.write(fd0, b"x")
    assert not node.alive()


def test_closing_closes_descriptor_0_too(fd0):
    held.Held("node 1", 1, 0, -1, {"net": 0}).close()
    with pytest.raises(OSError):
        os.fstat(0)
