"""Spare ranks (#28): distlab's forkserver forks ranks ahead of the requests while it is idle, and a
request hands one its run. Pure policy first, then the kernel's own server, then fresh kernels."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from procs import running

import distlab
from distlab.forkserver import client as forkserver
from distlab.forkserver import mode as launchmode
from distlab.forkserver import server as server_main
from distlab.teach import failures

SPARE = forkserver.SPARE_NAME


def test_every_module_names_an_idle_spare_alike():
    from distlab.forkserver import spare as _spare_rank

    assert forkserver.SPARE_NAME == launchmode.SPARE_NAME == _spare_rank.SPARE_NAME.decode()
    assert len(_spare_rank.SPARE_NAME) <= 15  # what Linux keeps of a process name


def test_the_policy_keeps_the_floor_then_the_largest_burst_up_to_the_cap():
    policy = server_main.SparePolicy(floor=2)
    assert policy.target() == 2
    for t in (0.0, 0.01, 0.02, 0.03):  # one 4-rank launch
        policy.requested(t)
    assert policy.target() == 4
    policy.requested(5.0)  # a later 1-rank launch does not shrink it
    assert policy.burst == 1 and policy.target() == 4
    for t in range(20):
        policy.requested(10 + t * 0.001)
    assert policy.target() == server_main.CAP
    assert server_main.SparePolicy(floor=0).target() == 0  # DISTLAB_SPARE_RANKS=0: none, ever
    off = server_main.SparePolicy(floor=0)
    off.requested(0.0)
    off.requested(0.01)
    assert off.target() == 0


def test_spares_are_forked_when_no_rank_runs_or_a_while_after_the_last_request():
    policy = server_main.SparePolicy(floor=2)
    assert policy.fill_timeout(have=0, running=0, now=100.0) == 0.0  # idle: now
    assert policy.fill_timeout(have=2, running=0, now=100.0) is None  # enough: wait for requests
    policy.requested(100.0)
    assert policy.fill_timeout(have=1, running=1, now=100.1) == pytest.approx(server_main.SETTLE_S - 0.1)
    assert policy.fill_timeout(have=1, running=1, now=101.0) == 0.0  # a long job: now
    assert policy.fill_timeout(have=1, running=0, now=100.1) == 0.0  # its ranks ended: now


@pytest.mark.parametrize("value, count", [("", 2), ("0", 0), ("5", 5), (" 3 ", 3)])
def test_the_spare_count_comes_from_the_environment(monkeypatch, value, count):
    monkeypatch.setenv(forkserver.SPARES_VAR, value)
    assert forkserver.spare_count() == (count if sys.platform.startswith("linux") else 0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="spares are Linux-only")
@pytest.mark.parametrize("value", ["two", "-1", "1.5"])
def test_a_spare_count_that_is_not_a_whole_number_says_how_to_write_it(monkeypatch, value):
    monkeypatch.setenv(forkserver.SPARES_VAR, value)
    with pytest.raises(ValueError, match=r"DISTLAB_SPARE_RANKS=.*whole number of spare ranks \(0 turns them off\)"):
        forkserver.spare_count()


def spares_of(server: int) -> list[psutil.Process]:
    found = []
    for p in psutil.Process(server).children():
        try:
            if p.name() == SPARE:
                found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found


def wait_for_spares(server: int, n: int, timeout: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = sorted(p.pid for p in spares_of(server))
        if len(pids) >= n:
            return pids
        time.sleep(0.02)
    raise AssertionError(f"the server kept {len(spares_of(server))} spares, not {n}")


def my_pid(rank):
    import os

    return os.getpid()


pytestmark_linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="spares are Linux-only")


@pytestmark_linux
def test_a_launch_runs_on_the_spares_and_the_server_forks_new_ones():
    distlab.spawn(my_pid, nprocs=2, view=None, start="forkserver")
    server = forkserver.server_pid()
    spares = wait_for_spares(server, 2)
    ranks = distlab.spawn(my_pid, nprocs=2, view=None, start="forkserver").returns
    assert set(ranks.values()) <= set(spares)  # the ranks are processes that were waiting
    again = wait_for_spares(server, 2)
    assert not set(again) & set(ranks.values())  # fresh spares, forked after the launch
    assert all(running(p) for p in again)


def server_with_spares(signal_them=None) -> tuple[int, list[int]]:
    """The forkserver (started by a 1-rank launch) and its two spares, each sent ``signal_them`` if given."""
    distlab.spawn(my_pid, nprocs=1, view=None, start="forkserver")
    server = forkserver.server_pid()
    spares = wait_for_spares(server, 2)
    for pid in spares if signal_them is not None else ():
        os.kill(pid, signal_them)
    return server, spares


@pytestmark_linux
def test_a_spare_that_died_while_idle_is_replaced_and_the_launch_still_runs():
    server, spares = server_with_spares(signal.SIGKILL)
    ranks = distlab.spawn(my_pid, nprocs=2, view=None, start="forkserver").returns
    assert len(set(ranks.values())) == 2 and not set(ranks.values()) & set(spares)
    assert len(wait_for_spares(server, 2)) >= 2


@pytestmark_linux
def test_a_spare_killed_after_it_was_handed_a_rank_but_before_it_said_so_never_fails_the_launch():
    # the window on purpose: the spares are stopped, so a launch's request reaches them but they cannot
    # confirm; then they are killed. The launch runs on other processes, and the server keeps spares.
    server, spares = server_with_spares(signal.SIGSTOP)
    pending = distlab.spawn(my_pid, nprocs=2, view=None, start="forkserver", join=False)
    time.sleep(0.5)
    assert not pending.done(), "the launch ran on stopped spares?"
    for pid in spares:
        os.kill(pid, signal.SIGKILL)
    ranks = pending.join(timeout=60).returns
    assert len(set(ranks.values())) == 2 and not set(ranks.values()) & set(spares)
    assert len(wait_for_spares(server, 2)) >= 2


@pytestmark_linux
def test_a_spare_says_it_holds_the_fds_and_tells_its_exit_code_only_once_the_client_has_its_pid():
    from distlab.forkserver import spare as _spare_rank

    def tell_if_told(answer: bytes) -> int:
        """A spare whose rank returns 7; the server answers ``answer`` (b"": it goes away)."""
        pid, status_r, ours = _spare_with(lambda child_r, inherited: 7, answer=None)
        try:
            assert ours.recv(1) == _spare_rank.HOLDS
            if answer:
                ours.send(answer)
            ours.close()
            assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7
            return os.read(status_r, 64)  # all it wrote: the process has ended
        finally:
            os.close(status_r)

    from multiprocessing import forkserver as mp_forkserver

    assert tell_if_told(_spare_rank.RUN) == mp_forkserver.SIGNED_STRUCT.pack(7)
    assert tell_if_told(b"") == b""  # never before the client had the pid from the server


def _server_with_pending_spare(pid: int):
    """A Server (no process) with one spare handed a request, and the test's ends of it all."""
    import selectors
    import socket

    server = server_main.Server.__new__(server_main.Server)
    server.children, server.pending, server.spares = {}, {}, __import__("collections").deque()
    server.selector = selectors.DefaultSelector()
    ours, theirs = socket.socketpair()
    status_r, status_w = os.pipe()
    data_r, data_w = os.pipe()
    spare = server_main.Spare(pid, ours)
    server.pending[ours] = (spare, server_main.Request(data_r, status_w, []))
    server.selector.register(ours, selectors.EVENT_READ)
    return server, spare, theirs, status_r, data_w


def test_a_spare_that_answered_and_ended_before_the_answer_was_read_gets_its_pid_then_its_status_told():
    from multiprocessing import forkserver as mp_forkserver

    from distlab.forkserver import spare as _spare_rank

    server, spare, theirs, status_r, data_w = _server_with_pending_spare(pid=4242)
    theirs.sendall(_spare_rank.HOLDS)
    theirs.close()
    server._forget_spare(4242, 3)  # reaped (SIGCHLD came first in the same wake-up)
    server.confirm(spare.sock)
    told = os.read(status_r, 64)
    assert told == mp_forkserver.SIGNED_STRUCT.pack(4242) + mp_forkserver.SIGNED_STRUCT.pack(3)
    assert server.children == {} and server.pending == {}
    for fd in (status_r, data_w):
        os.close(fd)


def test_a_spare_that_ended_without_answering_is_passed_over_for_the_next_one(monkeypatch):
    server, spare, theirs, status_r, data_w = _server_with_pending_spare(pid=4243)
    theirs.close()  # it died holding nothing
    server._forget_spare(4243, -9)
    handed = []
    monkeypatch.setattr(server, "hand_over", handed.append)
    server.confirm(spare.sock)
    assert len(handed) == 1 and server.children == {} and server.pending == {}
    os.set_blocking(status_r, False)
    with pytest.raises(BlockingIOError):  # nothing told the client: the request's pipe waits for the next one
        os.read(status_r, 64)
    for fd in (*handed[0].fds(), status_r, data_w):
        os.close(fd)


@pytestmark_linux
def test_an_idle_spare_ignores_ctrl_c_and_is_not_a_leftover_worker():
    distlab.spawn(my_pid, nprocs=1, view=None, start="forkserver")
    server = forkserver.server_pid()
    spares = wait_for_spares(server, 2)
    os.kill(spares[0], signal.SIGINT)  # a Ctrl-C in a terminal reaches the whole process group
    time.sleep(0.3)
    assert running(spares[0])
    assert not {p.pid for p in failures.worker_processes()} & set(spares)


KERNEL = """
import os, sys, time, psutil, distlab
from distlab.forkserver import client as forkserver

def my_pid(rank):
    import os
    return os.getpid()

first = distlab.spawn(my_pid, nprocs=2, view=None, start="forkserver").returns
server = forkserver.server_pid()
time.sleep(1.0)  # time enough to fork spares, if any were wanted
names = [p.name() for p in psutil.Process(server).children()]
print("RESULT", len(first), names.count(forkserver.SPARE_NAME), flush=True)
"""


@pytestmark_linux
@pytest.mark.parametrize("value, spares", [("0", 0), ("3", 3)])
def test_the_environment_sets_how_many_spares_a_new_server_keeps(tmp_path, value, spares):
    env = {**os.environ, forkserver.SPARES_VAR: value}
    env.pop("DISTLAB_START", None)
    kernel = tmp_path / "kernel.py"
    kernel.write_text(KERNEL)
    out = subprocess.run([sys.executable, str(kernel)], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("RESULT", 1)[1].split() == ["2", str(spares)]


def test_a_rank_tells_its_exit_code_on_the_status_pipe():
    from multiprocessing import forkserver as mp_forkserver

    from distlab.forkserver import spare as _spare_rank

    r, w = os.pipe()
    try:
        _spare_rank.tell_exit(w, 3)
        assert mp_forkserver.read_signed(r) == 3
        os.close(r)
        r = None
        _spare_rank.tell_exit(w, 0)  # the launcher went: nothing raised
    finally:
        for fd in (r, w):
            if fd is not None:
                os.close(fd)


class _Finalizer:
    def __init__(self, active=True):
        self.active = active

    def still_active(self):
        return self.active


def _popen_on(sentinel, active=True):
    popen = forkserver._RankPopen.__new__(forkserver._RankPopen)
    popen.sentinel, popen.finalizer, popen.returncode = sentinel, _Finalizer(active), 0
    return popen


def test_a_rank_is_gone_when_the_server_reports_reaping_it_or_the_pipe_ends():
    r, w = os.pipe()
    try:
        popen = _popen_on(r)
        assert popen.wait_gone(time.monotonic() + 0.2) is False  # nothing yet: still there
        os.write(w, b"\0" * 4)
        assert popen.wait_gone(time.monotonic() + 0.2) is False  # half a message is not one
        os.write(w, b"\0" * 8)  # the server's copy of the exit status, written once it reaped the rank
        assert popen.wait_gone(time.monotonic() + 5) is True
        os.close(w)
        w = None
        assert popen.wait_gone(time.monotonic() + 5) is True  # the pipe ended: gone
        assert _popen_on(r, active=False).wait_gone(time.monotonic()) is True  # its fd closed: never read
    finally:
        for fd in (r, w):
            if fd is not None:
                os.close(fd)


@pytestmark_linux
def test_a_launch_returns_only_once_its_ranks_are_gone():
    for _ in range(5):
        pids = distlab.spawn(my_pid, nprocs=2, view=None, start="forkserver").returns.values()
        assert [p for p in pids if running(p)] == []


def exits_with(rank):
    import sys

    if rank == 1:
        sys.exit(3)
    return rank


@pytestmark_linux
def test_a_rank_that_exits_with_a_code_fails_the_launch_with_that_rank():
    with pytest.raises(distlab.WorkerFailedError) as info:
        distlab.spawn(exits_with, nprocs=2, view=None, start="forkserver")
    assert info.value.rank == 1 and info.value.exitcode == 3  # the code the rank told is the one it exited with


class _NoKeeper:
    def put(self, _):
        raise AssertionError("asked the keeper thread")


@pytestmark_linux
def test_a_running_server_is_found_without_the_keeper_and_a_dead_one_is_started_again(monkeypatch):
    server = forkserver.ensure_server()
    monkeypatch.setattr(forkserver._KEEPER, "requests", _NoKeeper())
    assert forkserver.ensure_server() == server  # running: answered at once
    monkeypatch.undo()
    os.kill(server, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while forkserver._running(server) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not forkserver._running(server)
    again = forkserver.ensure_server()
    assert again != server and forkserver._running(again)
    assert distlab.spawn(my_pid, nprocs=2, view=None, start="forkserver").returns.keys() == {0, 1}


@pytestmark_linux
def test_the_spare_ranks_are_listed_oldest_first_and_become_the_next_ranks():
    distlab.spawn(my_pid, nprocs=2, view=None, start="forkserver")
    waiting = launchmode.spare_ranks(at_least=2)
    assert len(waiting) >= 2 and set(waiting) <= {p.pid for p in spares_of(forkserver.server_pid())}
    ranks = distlab.spawn(my_pid, nprocs=2, view=None, start="forkserver").returns
    assert sorted(ranks.values()) == sorted(waiting[:2])  # the two that waited longest


def test_after_a_refused_fork_the_next_spare_waits_and_requests_are_still_served():
    policy = server_main.SparePolicy(floor=2)
    policy.retry_at = 100.0 + server_main.RETRY_S
    assert policy.fill_timeout(have=0, running=0, now=100.0) == pytest.approx(server_main.RETRY_S)
    assert policy.fill_timeout(have=0, running=0, now=101.5) == 0.0


def test_a_spare_the_system_refuses_is_tried_again_later(monkeypatch):
    server = server_main.Server.__new__(server_main.Server)
    server.policy = server_main.SparePolicy(floor=2)

    def refused():
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(server, "_fork_spare", refused)
    before = time.monotonic()
    server.add_spare()  # no exception: the server goes on serving
    assert server.policy.retry_at >= before + server_main.RETRY_S


def _spare_with(rank, after=lambda: None, answer=b"r"):
    """Fork a spare (a copy of this process) whose rank is ``rank``; hand it a run. Returns the
    spare's pid and the launcher's end of its status pipe. ``after`` runs in the spare once the
    rank returned, before it exits with the rank's code. ``answer=None``: the caller plays the
    server's side of the hand-over (and gets the server's socket too)."""
    import socket
    from multiprocessing import reduction

    from distlab.forkserver import spare as _spare_rank

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    status_r, status_w = os.pipe()
    proc_r, proc_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ours.close()
            _spare_rank.warm_up = lambda server_pid: None
            _spare_rank.become_rank = rank
            _spare_rank.tell_exit_early()
            code = _spare_rank.wait_then_run(theirs, os.getppid(), {}, 8, _spare_rank.process_name())
            after()
        finally:
            os._exit(code)
    theirs.close()
    reduction.sendfds(ours, [proc_r, status_w])
    for fd in (status_w, proc_r, proc_w):
        os.close(fd)
    if answer is None:
        return pid, status_r, ours
    assert ours.recv(1) == _spare_rank.HOLDS  # the server's side of the hand-over
    ours.send(answer)
    ours.close()
    return pid, status_r


def _told_code(status_r) -> int:
    import select
    from multiprocessing import forkserver as mp_forkserver

    assert select.select([status_r], [], [], 10)[0], "no exit code while the rank was still there"
    return mp_forkserver.read_signed(status_r)


@pytestmark_linux
def test_a_spare_given_a_run_tells_its_exit_code_while_it_is_still_there():
    gate_r, gate_w = os.pipe()
    pid, status_r = _spare_with(lambda child_r, inherited: 7, after=lambda: os.read(gate_r, 1))
    try:
        assert _told_code(status_r) == 7  # told...
        assert running(pid)  # ...while the process is still there
        os.write(gate_w, b"x")
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7
    finally:
        if running(pid):
            os.kill(pid, signal.SIGKILL)
        for fd in (status_r, gate_r, gate_w):
            os.close(fd)


@pytestmark_linux
def test_a_process_the_rank_forked_does_not_tell_an_exit_code_for_the_rank():
    def forking_rank(child_r, inherited):  # its child returns 9 first, through the same frames
        if os.fork() == 0:
            return 9
        time.sleep(0.5)
        return 7

    pid, status_r = _spare_with(forking_rank)
    try:
        assert _told_code(status_r) == 7  # the rank's code, not its child's
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7
    finally:
        if running(pid):
            os.kill(pid, signal.SIGKILL)
        os.close(status_r)


def _tracked_popen(pid, returncode, rank):
    import threading

    popen = forkserver._RankPopen.__new__(forkserver._RankPopen)
    popen._pid_lock, popen._pid, popen.handle = threading.Lock(), pid, psutil.Process(pid)
    popen.returncode, popen.rank = returncode, rank
    return popen


def test_a_rank_that_exited_but_is_not_reaped_yet_stays_tracked_until_wait_gone(monkeypatch):
    """A zombie rank (exited, its parent has not reaped it yet) is leaving, not gone: forgetting it
    let a launch return while the server still had to reap its ranks (CI saw them as leftovers)."""
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.05)
        popens = [_tracked_popen(zombie.pid, None, 0), _tracked_popen(sleeper.pid, None, 1)]
        monkeypatch.setitem(forkserver._RANKS, "run-z", popens)
        assert list(forkserver.live_ranks("run-z")) == [1]  # the zombie is not alive...
        assert forkserver._RANKS["run-z"] == [popens[1], popens[0]]  # ...but still tracked
        zombie.wait()
        forkserver.live_ranks("run-z")
        assert forkserver._RANKS["run-z"] == [popens[1]]  # reaped: gone
    finally:
        for p in (zombie, sleeper):
            p.kill()
            p.wait()
        forkserver._RANKS.pop("run-z", None)
