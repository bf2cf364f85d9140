"""The loop of distlab's forkserver process: ``multiprocessing.forkserver.main``'s protocol, with
spare ranks forked ahead of the requests.

Runs only in the server (``python -c "from distlab.forkserver.server import main; ..."``, started by
``distlab.forkserver.client``). The protocol is CPython's, and both of its ends are distlab's: a client
connects to the server's Unix socket and sends, in one message, the read end of the pipe that will
carry the pickled process object, the write end of the child's status pipe, the client's "alive"
fd, its resource tracker's fd, and the fds the child inherits. The server writes the child's pid
on the status pipe at once, and its exit status when it ends. The server leaves when every client
has closed its "alive" pipe (the kernel died), and serves only your own uid
(:class:`distlab.forkserver.peercred.PeerCheckedSocket`).

What differs: CPython forks when the request arrives; distlab's server forks *spares* while it
is idle, and a request hands one its fds (:mod:`distlab.forkserver.spare`). The fork (the copy of a
process holding torch), its after-fork hooks and a rank's first copy-on-write faults then happen
before the launch instead of during it; a request that finds no spare is forked as before. The
number kept grows to the largest burst of requests seen (a 4-rank launch asks four times in a
row), between ``floor`` and ``CAP`` (:class:`SparePolicy`); ``DISTLAB_SPARE_RANKS=0`` turns them off.
"""
from __future__ import annotations

import collections
import dataclasses
import importlib
import os
import selectors
import signal
import socket
import sys
import time
from multiprocessing import forkserver as mp_forkserver
from multiprocessing import reduction, util

from distlab.forkserver import peercred
from distlab.forkserver import spare as _spare_rank

MAX_FDS = mp_forkserver.MAXFDS_TO_SEND
CAP = 8  # spares at most (an idle spare costs a few MB: the pages it has written)
BURST_GAP_S = 0.1  # requests closer than this belong to one launch
SETTLE_S = 0.5  # with children running, new spares wait this long after the last request
RETRY_S = 1.0  # after a fork the system refused, the next spare waits this long


@dataclasses.dataclass
class SparePolicy:
    """How many spares to keep: none if ``floor`` is 0, else at least ``floor`` and as many as the
    largest burst of requests seen (one per rank of the largest launch), at most :data:`CAP`."""

    floor: int = 2
    largest: int = 0
    burst: int = 0
    last: float = float("-inf")
    retry_at: float = float("-inf")

    def requested(self, now: float) -> None:
        self.burst = self.burst + 1 if now - self.last < BURST_GAP_S else 1
        self.last = now
        self.largest = max(self.largest, self.burst)

    def target(self) -> int:
        return 0 if self.floor <= 0 else min(CAP, max(self.floor, self.largest))

    def fill_timeout(self, have: int, running: int, now: float) -> float | None:
        """How long the loop may wait for requests before it forks a spare (None: forever).

        Not while a launch's ranks start and run: a fork (and the spare's warm-up) would take CPU
        from them. A spare is forked when no child of the server runs, or ``SETTLE_S`` after the
        last request (a long job, or warm ranks kept open)."""
        if have >= self.target():
            return None
        if now < self.retry_at:  # the last fork failed
            return self.retry_at - now
        return 0.0 if running == 0 else max(0.0, self.last + SETTLE_S - now)


@dataclasses.dataclass
class Spare:
    pid: int
    sock: socket.socket  # the server's end; the spare waits for a request's fds on the other
    reaped: bool = False  # its pid may belong to another process by now: never signal it
    exit_code: int | None = None  # when it was reaped while its hand-over waited for its answer


@dataclasses.dataclass
class Request:
    """A client's request: the pipe the process object comes on, the status pipe, the fds to inherit."""

    child_r: int
    child_w: int
    inherited: list[int]

    def fds(self) -> list[int]:
        return [self.child_r, self.child_w, *self.inherited]


def _noop(*_):
    """SIGCHLD's handler: its only job is to wake the loop through the wakeup fd."""


class Server:
    """The server's state: its socket, the children it serves (pid -> status fd) and its spares."""

    def __init__(self, listener_fd: int, alive_r: int, policy: SparePolicy):
        self.listener = peercred.PeerCheckedSocket(socket.AF_UNIX, fileno=listener_fd)
        self.alive_r, self.policy = alive_r, policy
        self.name = _spare_rank.process_name()
        self.children: dict[int, int] = {}
        self.spares: collections.deque[Spare] = collections.deque()
        self.pending: dict[socket.socket, tuple[Spare, Request]] = {}  # handed to a spare, not yet confirmed
        self.sig_r, self.sig_w = os.pipe()
        os.set_blocking(self.sig_r, False)
        os.set_blocking(self.sig_w, False)
        self.handlers = {signal.SIGCHLD: signal.signal(signal.SIGCHLD, _noop),
                         signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
        signal.set_wakeup_fd(self.sig_w)
        self.selector = selectors.DefaultSelector()
        for obj in (self.listener, alive_r, self.sig_r):
            self.selector.register(obj, selectors.EVENT_READ)
        mp_forkserver._forkserver._forkserver_address = self.listener.getsockname()

    def serve(self) -> None:
        """Serve until the last client is gone; fork a spare whenever nothing else is waiting."""
        while True:
            timeout = self.policy.fill_timeout(len(self.spares), len(self.children), time.monotonic())
            ready = {key.fileobj for key, _ in self.selector.select(timeout)}
            if self.alive_r in ready:
                return  # EOF: every client (the kernel) has gone
            if self.sig_r in ready:
                self.reap()
            for sock in [obj for obj in ready if obj in self.pending]:
                self.confirm(sock)
            if self.listener in ready:
                self.serve_request()
            elif not ready and timeout is not None:
                self.add_spare()

    def serve_request(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:  # refused (another uid: said on stderr) or the client gave up
            return
        with conn:
            try:
                fds = reduction.recvfds(conn, MAX_FDS + 1)
            except (EOFError, OSError, RuntimeError):
                return
        if not 4 <= len(fds) <= MAX_FDS:
            _close(fds)
            return
        self.policy.requested(time.monotonic())
        self.hand_over(Request(*fds[:2], fds[2:]))

    def hand_over(self, request: Request) -> None:
        """Give ``request`` to the oldest live spare, to be confirmed (:meth:`confirm`), or fork for it.

        The client learns a spare's pid only once the spare has said it holds the request's fds:
        a spare killed a moment before (the OOM killer, a stray ``kill``) is passed over, and the
        request goes to the next spare or a fresh fork instead of failing the launch."""
        while (spare := self.live_spare()) is not None:
            try:
                reduction.sendfds(spare.sock, request.fds())
            except OSError:  # it died a moment ago
                self._discard(spare)
                continue
            self.pending[spare.sock] = (spare, request)
            self.selector.register(spare.sock, selectors.EVENT_READ)
            return
        try:
            pid = self.fork_child(request.child_r, request.child_w, request.inherited)
        except OSError:  # no fork possible now: the client reads the end of the pipe, not a pid
            _close(request.fds())
            return
        self._started(pid, request)

    def confirm(self, sock: socket.socket) -> None:
        """A spare given a request answered: it holds the fds (tell the client its pid, then let it
        run), or it died before it could (hand the request over again)."""
        spare, request = self.pending.pop(sock)
        self.selector.unregister(sock)
        try:
            holds = sock.recv(1) == _spare_rank.HOLDS
        except OSError:
            holds = False
        if not holds:
            self._discard(spare)
            self.hand_over(request)
            return
        self._started(spare.pid, request)  # the pid goes first, before the rank can write its exit code
        try:
            sock.send(_spare_rank.RUN)
        except OSError:  # it died since: a rank that died; its exit status follows when it is reaped
            pass
        sock.close()
        if spare.reaped:  # it ran and ended before this answer was read: its status, after the pid
            self.children.pop(spare.pid)
            _tell(request.child_w, spare.exit_code)
            os.close(request.child_w)

    def _started(self, pid: int, request: Request) -> None:
        _tell(request.child_w, pid)
        self.children[pid] = request.child_w
        _close([request.child_r, *request.inherited])

    def _discard(self, spare: Spare) -> None:
        """Forget a spare that cannot take a request (killed first, unless it was reaped already)."""
        if not spare.reaped:
            try:
                os.kill(spare.pid, signal.SIGKILL)
            except OSError:
                pass
        spare.sock.close()

    def live_spare(self) -> Spare | None:
        """The oldest spare still alive (one that died while idle is reaped here), or None."""
        while self.spares:
            spare = self.spares.popleft()
            try:
                gone, _ = os.waitpid(spare.pid, os.WNOHANG)
            except ChildProcessError:
                gone = spare.pid
            if not gone:
                return spare
            spare.reaped = True
            spare.sock.close()
        return None

    def fork_child(self, child_r: int, child_w: int, inherited: list[int]) -> int:
        """CPython's way: fork now, for this request."""
        importlib.invalidate_caches()  # before the fork: the child inherits fresh caches
        pid = os.fork()
        if pid == 0:
            os.close(child_w)
            self._in_child(self._restore_signals_then_run, child_r, inherited)
        return pid

    def add_spare(self) -> None:
        """Fork one more spare. Where the system refuses (no memory, too many processes or files),
        the server tries again only ``RETRY_S`` later, and goes on serving meanwhile."""
        try:
            self._fork_spare()
        except OSError:
            self.policy.retry_at = time.monotonic() + RETRY_S

    def _fork_spare(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        server_pid = os.getpid()
        _spare_rank.set_name(_spare_rank.SPARE_NAME)  # inherited: a spare has its name from its first instant
        try:
            pid = os.fork()
            if pid == 0:
                ours.close()
                self._in_child(_spare_rank.wait_then_run, theirs, server_pid, self.handlers, MAX_FDS + 1, self.name)
        except OSError:
            ours.close()
            raise
        finally:
            _spare_rank.set_name(self.name)
            theirs.close()
        self.spares.append(Spare(pid, ours))

    def reap(self) -> None:
        """Send each ended child's exit status to its client; forget spares that died idle."""
        os.read(self.sig_r, 65536)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            status_w = self.children.pop(pid, None)
            if status_w is None:
                self._forget_spare(pid, os.waitstatus_to_exitcode(status))
                continue
            _tell(status_w, os.waitstatus_to_exitcode(status))  # (a spare's rank may have said it already)
            os.close(status_w)

    def _forget_spare(self, pid: int, exit_code: int) -> None:
        for spare in [s for s in self.spares if s.pid == pid]:
            spare.sock.close()
            self.spares.remove(spare)
        for spare, _ in self.pending.values():
            if spare.pid == pid:  # its answer, or its socket's end-of-file, is still to be read
                spare.reaped, spare.exit_code = True, exit_code

    def _in_child(self, run, *args) -> None:
        """In a forked child: drop the server's fds and wakeup fd, run, and never return."""
        code = 1
        try:
            self.listener.close()
            self.selector.close()
            signal.set_wakeup_fd(-1)
            _close([self.alive_r, self.sig_r, self.sig_w, *self.children.values()])
            for spare in [*self.spares, *(spare for spare, _ in self.pending.values())]:
                spare.sock.close()
            for _, request in self.pending.values():  # another request's status pipe must end with its rank
                _close(request.fds())
            code = run(*args)
        except BaseException:
            sys.excepthook(*sys.exc_info())
            sys.stderr.flush()
        finally:
            os._exit(code)

    def _restore_signals_then_run(self, child_r: int, inherited: list[int]) -> int:
        for sig, handler in self.handlers.items():
            signal.signal(sig, handler)
        return _spare_rank.become_rank(child_r, inherited)


def _tell(status_w: int, number: int) -> None:
    try:
        mp_forkserver.write_signed(status_w, number)
    except BrokenPipeError:  # the client went
        pass


def _close(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def main(listener_fd: int, alive_r: int, preload: list[str], spares: int = 2) -> None:
    """The server process's entry point. A preload that fails ends the server (CPython's would
    serve on without it): a rank forked from a half-ready server must not run."""
    for name in preload:
        importlib.import_module(name)
    util._close_stdin()
    Server(listener_fd, alive_r, SparePolicy(floor=spares)).serve()
