"""The processes behind :class:`distlab.Ranks`: start them, talk to them, stop them.

Kernel side only. One pipe per rank carries requests and replies (:mod:`distlab.warm.proto`);
the process group's store is a ``FileStore`` in the group's private folder, so there is no port
another local user could connect to, and gloo's/NCCL's own sockets stay on loopback.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait
from pathlib import Path

from distlab.folders import privtmp
from distlab.folders.private import open_private
from distlab.forkserver import mode as launchmode
from distlab.view.bars import ProgressLines
from distlab.view.display import IPythonDisplay, in_kernel
from distlab.view.stacks import clean_stack
from distlab.view.streams import Line, Streams
from distlab.warm import errors as err
from distlab.warm import proto
from distlab.warm.status import NO_STATUS

START_TIMEOUT_S = 300.0
FAILURE_GRACE_S = 3.0  # after one rank failed, how long the others get to finish the call
INTERRUPT_WAIT_S = 2.0  # after SIGINT, how long a busy rank gets to come back
STACK_WAIT_S = 1.0
CLOSE_WAIT_S = 3.0
SLICE_S = 0.05  # how often a wait looks at the interrupt flag
PEER_LOST_SIGNS = ("closed by peer", "reset by peer", "likely closed", "Broken pipe", "pair closure")
RUNTIME_FILES = ("distlab/warm/loop.py", "distlab/warm/watch.py", "distlab/worker.py", "threading.py")
# The outermost frames of a warm rank: how it was started (``python -c``, or forked from distlab's
# forkserver), not where it is.
STARTED_BY = ('File "<string>", line 1 in <module>', "distlab/warm/forked.py", "multiprocessing/process.py",
              "multiprocessing/spawn.py", "multiprocessing/forkserver.py", "distlab/forkserver/spare.py",
              "distlab/forkserver/server.py")


def rank_stack(dump: str) -> str:
    """A warm rank's stack dump with only the learner's frames (:func:`distlab.view.stacks.clean_stack`)."""
    return clean_stack(dump, RUNTIME_FILES, started_by=STARTED_BY, compact=True)


def start_rank_process(cfg: dict, conn: Connection, log: Path, start: str = "spawn", on=(), node=None):
    """Start one rank running :func:`distlab.warm.loop.main`: forked from distlab's forkserver
    (``start="forkserver"``: milliseconds, and CUDA-safe for the same reason as ``spawn``'s ranks)
    or a fresh interpreter (``"spawn"``).

    Either way it gets its configuration in ``DISTLAB_RANK``, keeps its end of the pipe ``conn``,
    writes C-level output to ``log``, and has its own session, so Kernel > Interrupt reaches the
    kernel only (which then decides). On a node: ``on``, the prefix that starts a fresh interpreter
    there (``Nodes.command``); ``node``, what a forked rank needs to enter it (``Nodes.entry``).
    """
    env = {**os.environ, **_rank_environment(cfg, os.environ)}
    if start == "forkserver":
        return _fork_rank(cfg, conn, log, env, node)
    cfg = {**cfg, "conn_fd": conn.fileno()}
    from distlab.forkserver.client import distlab_root

    root = distlab_root()  # None where distlab is installed: the fresh interpreter finds it itself
    code = (f"sys.path.insert(0, {root!r}); " if root else "") + "from distlab.warm.loop import main; main()"
    env["DISTLAB_RANK"] = json.dumps(cfg)
    with open_private(log, "wb") as out:
        return subprocess.Popen([*on, *launchmode.python_argv(code=code, flags=())], env=env,
                                pass_fds=[conn.fileno()], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _fork_rank(cfg: dict, conn: Connection, log: Path, env: dict, node=None):
    from distlab.forkserver import client as forkserver
    from distlab.forkserver.enter import Entry
    from distlab.warm.forked import run_warm_rank

    open_private(log, "wb").close()
    context = forkserver.get_context()  # the server runs: Ranks started it (or fell back to "spawn")
    entry = None if node is None else Entry(node["fds"], os.getcwd(), node["env"])
    with forkserver.launching(f"warm-{log.parent.name}"):
        process = context.Process(target=run_warm_rank, args=(cfg, conn, str(log), env, entry), daemon=True,
                                  name=f"distlab-warm-rank{cfg['rank']}")
        process.start()
    return forkserver.Forked(process)


def _rank_environment(cfg: dict, kernel_env) -> dict[str, str]:
    """What torchrun would set, plus gloo's and NCCL's sockets kept on the loopback interface
    (unless the kernel's environment chose an interface). MASTER_PORT is a placeholder: the
    ranks meet in a FileStore in the group's private folder, not on a port."""
    from distlab.rendezvous.loopback import PLACEHOLDER_PORT
    from distlab.worker import loopback_interface, loopback_socket_vars

    per_node = cfg.get("per_node", cfg["world_size"])
    sockets = loopback_socket_vars(kernel_env, loopback_interface())
    if "node_if" in cfg:  # on nodes: gloo's and NCCL's sockets on the node's link, MASTER_ADDR node0
        sockets = {"GLOO_SOCKET_IFNAME": cfg["node_if"], "NCCL_SOCKET_IFNAME": cfg["node_if"]}
    env = {"RANK": str(cfg["rank"]), "LOCAL_RANK": str(cfg["rank"] % per_node), "WORLD_SIZE": str(cfg["world_size"]),
           "LOCAL_WORLD_SIZE": str(per_node), "MASTER_ADDR": cfg.get("master_addr", "127.0.0.1"),
           "MASTER_PORT": str(PLACEHOLDER_PORT), **sockets, "PYTHONUNBUFFERED": "1"}
    if cfg["world_size"] > 1 and "OMP_NUM_THREADS" not in kernel_env:
        env["OMP_NUM_THREADS"] = "1"  # as torchrun does: N ranks must not each use every core
    return env


def start_group(nprocs: int, backend: str, start: str = "spawn", nodes=None) -> RankGroup:
    """Start ``nprocs`` ranks and wait until each has joined the process group (on ``nodes``: spread
    evenly, rank ``r`` on node ``r // (nprocs // nodes.n)``; their store is the same file, which every
    node sees, and gloo's traffic goes over the links).

    Their folder (logs, stack dumps, the group's FileStore) is made in this process's private
    temporary folder (:mod:`distlab.folders.privtmp`), so a killed kernel leaves nothing in ``/tmp``.
    """
    folder = Path(tempfile.mkdtemp(prefix="ranks-", dir=privtmp.process_dir()))  # 0700, private to this user
    group = RankGroup(folder)
    try:
        store = folder / "store"
        open_private(store, "ab").close()
        with privtmp.private_tempfiles():  # each rank's TMPDIR: this process's private folder
            for rank in range(nprocs):
                ours, theirs = Pipe(duplex=True)
                cfg = {"rank": rank, "world_size": nprocs, "backend": backend, "store": str(store),
                       "folder": str(folder), "parent_pid": os.getpid(), "sys_path": launchmode.importable_path(),
                       "umask": launchmode.current_umask(), **on_node(rank, nprocs, nodes)}
                where = {} if nodes is None else ({"node": nodes.entry(cfg["node"])} if start == "forkserver"
                                                  else {"on": nodes.command(cfg["node"], [])})
                group.add(start_rank_process(cfg, theirs, group.log_path(rank), start, **where), ours)
                theirs.close()  # only the rank holds its end: its death reads as end-of-file here
        group.wait_ready(START_TIMEOUT_S)
    except BaseException:
        group.stop(graceful=False)
        raise
    return group


def on_node(rank: int, nprocs: int, nodes) -> dict:
    """What a rank on ``nodes`` adds to its configuration (nothing without nodes). Pure."""
    if nodes is None:
        return {}
    from distlab.nodes import plan

    per_node = nprocs // nodes.n
    return {"node": rank // per_node, "per_node": per_node, "node_if": plan.NODE_IF, "master_addr": plan.address(0)}


class RankGroup:
    """The live rank processes and their pipes."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.procs: list[subprocess.Popen] = []
        self.conns: list[Connection] = []

    def add(self, proc: subprocess.Popen, conn: Connection) -> None:
        self.procs.append(proc)
        self.conns.append(conn)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def log_path(self, rank: int) -> Path:
        return self.folder / f"rank{rank}.log"

    def log_tail(self, rank: int, lines: int = 15) -> str:
        try:
            text = self.log_path(rank).read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(nothing)"

    def exit_code(self, rank: int) -> int | None:
        try:
            return self.procs[rank].wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return None

    def wait_ready(self, timeout: float) -> None:
        waiting = set(range(len(self.conns)))
        deadline = time.monotonic() + timeout
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise err.RanksStartError(err.START_FAILED.format(
                    rank=min(waiting), problem=f"not ready after {timeout:.0f}s", detail=self.log_tail(min(waiting))))
            for conn in wait([self.conns[r] for r in waiting], timeout=min(left, 1.0)):
                rank = self.conns.index(conn)
                try:
                    msg = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    code = self.exit_code(rank)
                    raise err.RanksStartError(err.START_FAILED.format(
                        rank=rank, problem=f"exited with code {code}", detail=self.log_tail(rank))) from None
                if msg[0] == proto.START_FAILED:
                    raise err.RanksStartError(err.START_FAILED.format(
                        rank=rank, problem="joining the process group failed", detail=msg[1].rstrip()))
                waiting.discard(rank)

    def dump_stacks(self, ranks: list[int]) -> dict[int, str]:
        """Every listed rank's Python stack, even one blocked in a collective (faulthandler, SIGUSR1)."""
        paths = {r: self.folder / f"rank{r}.stacks" for r in ranks}
        before = {r: _size(p) for r, p in paths.items()}
        for r in ranks:
            _kill(self.procs[r].pid, signal.SIGUSR1)
        deadline = time.monotonic() + STACK_WAIT_S
        sizes = {}
        while time.monotonic() < deadline:
            time.sleep(0.02)
            now = {r: _size(p) for r, p in paths.items()}
            if all(now[r] > before[r] for r in ranks) and now == sizes:
                break  # every dump started and none grew since the last look
            sizes = now
        stacks = {}
        for r, path in paths.items():
            with open(path, "rb") as f:
                f.seek(before[r])
                text = f.read().decode(errors="replace")
            stacks[r] = rank_stack(text) or "(no Python frames: it may have just finished)"
        return stacks

    def interrupt(self, ranks: list[int]) -> None:
        for r in ranks:
            _kill(self.procs[r].pid, signal.SIGINT)

    def stop(self, graceful: bool = True) -> None:
        """End every rank (asking first when ``graceful``), then remove the run folder."""
        if graceful:
            for conn in self.conns:
                try:
                    conn.send_bytes(pickle.dumps((proto.CLOSE, 0)))
                except OSError:
                    pass
            deadline = time.monotonic() + CLOSE_WAIT_S
            for proc in self.procs:
                try:
                    proc.wait(timeout=max(0.01, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        shutil.rmtree(self.folder, ignore_errors=True)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _kill(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class OutputSink:
    """Rank output shown live in the calling cell, ``[rank1] ...``, whole lines only, except that a
    progress bar redrawing a rank's unfinished line (``\\r``) is shown as one line that updates in
    place (:mod:`distlab.view.bars`), not as error-coloured stderr.

    Output tagged with another call (a thread an earlier cell started) never enters this cell:
    it is kept in ``late`` instead. Streams are flushed at most every FLUSH_S (a kernel's flush
    waits for its I/O thread: once per line would slow a chatty cell down) and when the call ends.
    """

    FLUSH_S = 0.1

    def __init__(self, req: int, late: dict[int, str]):
        self.req, self.late = req, late
        self.streams = Streams()
        self.bars = ProgressLines(shower=IPythonDisplay() if in_kernel() else None)
        self._dirty: set = set()
        self._flushed = time.monotonic()

    def write(self, rank: int, req, stream: str, text: str) -> None:
        if req != self.req:
            self.late[rank] = self.late.get(rank, "") + text
            return
        self._emit(rank, stream, self.streams.feed((rank, stream), text))

    def tick(self) -> None:
        if self._dirty and time.monotonic() - self._flushed >= self.FLUSH_S:
            self._flush()

    def finish(self) -> None:
        for (rank, stream), event in self.streams.flush_all():
            self._emit(rank, stream, [event])
        self.bars.close()
        self._flush()

    def _emit(self, rank: int, stream: str, events: list) -> None:
        """Whole lines to the rank's stream in one write; a bar's state to its line."""
        out = sys.stdout if stream == "stdout" else sys.stderr
        lines = []
        for event in [*events, None]:
            if isinstance(event, Line):
                lines.append(f"[rank{rank}] {event.text}\n")
                continue
            if lines:
                self.bars.write("".join(lines), out)
                self._dirty.add(out)
                lines = []
            if event is not None:
                self.bars.show((rank, stream), f"[rank{rank}] {event.text}", event.done)

    def _flush(self) -> None:
        for out in self._dirty:
            out.flush()
        self._dirty.clear()
        self._flushed = time.monotonic()


class Conversation:
    """One request to some ranks and their replies, with the rank output shown as it arrives.

    ``wait`` ends when every rank replied, or early: ``reason`` is then ``"timeout"``,
    ``"interrupt"`` (the flag a SIGINT sets) or ``"blocked"`` (ranks still busy
    FAILURE_GRACE_S after another rank failed). ``status`` hears of each reply and each tick
    (a %%ranks cell's status line, :mod:`distlab.warm.status`).
    """

    def __init__(self, group: RankGroup, req: int, ranks: list[int], late: dict[int, str], flag, status=NO_STATUS):
        self.group, self.req, self.ranks, self.flag, self.status = group, req, ranks, flag, status
        self.sink = OutputSink(req, late)
        self.replies: dict[int, tuple] = {}
        self.pending = set(ranks)
        self.still_pending: set[int] = set()
        self.blocked: dict[int, tuple[str, list[int]]] = {}  # rank -> (function, the ranks it waits for)
        self.reason: str | None = None
        self._arrival: list[int] = []
        self._before_break = 0

    def send(self, kind: str, *payload) -> None:
        data = pickle.dumps((kind, self.req, *payload))
        for r in sorted(self.pending):
            try:
                self.group.conns[r].send_bytes(data)
            except OSError:
                self._record(r, self._death(r))

    def wait(self, timeout: float | None, grace: float | None = FAILURE_GRACE_S) -> None:
        start = time.monotonic()
        failed_at = None
        while self.pending:
            now = time.monotonic()
            if timeout is not None and now - start >= timeout:
                self.reason = "timeout"
            elif self.flag.raised:
                self.reason = "interrupt"
            elif failed_at is not None and grace is not None and now - failed_at >= grace:
                self.reason = "blocked"
            if self.reason:
                break
            self._receive(SLICE_S if timeout is None else min(SLICE_S, max(0.0, start + timeout - now)))
            self.sink.tick()
            self.status.tick()
            if failed_at is None and self.failures():
                failed_at = time.monotonic()
        self._before_break = len(self._arrival)

    def wait_after_interrupt(self) -> None:
        """After SIGINT to the busy ranks: collect whoever comes back within INTERRUPT_WAIT_S, and
        stop waiting as soon as every rank still busy is stuck for good (:meth:`stuck`)."""
        deadline = time.monotonic() + INTERRUPT_WAIT_S
        while self.pending and time.monotonic() < deadline and not self.stuck():
            self._receive(SLICE_S)
            self.sink.tick()
            self.status.tick()
        self.still_pending = set(self.pending)

    def stuck(self) -> bool:
        """Every busy rank reported waiting in a collective (or a send/recv) for a rank that has
        left this call: that rank replied, or was never in it, so it will not join, and the wait
        can never end (:mod:`distlab.warm.watch`)."""
        return bool(self.pending) and all(
            rank in self.blocked and any(peer not in self.pending for peer in self.blocked[rank][1])
            for rank in self.pending)

    def failures(self) -> list[int]:
        """Ranks that raised or died before the call was cut short, the likely root cause first.

        A rank that only reports a lost peer comes after one that raised on its own; among
        equals the lowest rank comes first (ranks raising the same error race to the pipe).
        """
        arrived = self._arrival if not self.reason else self._arrival[:self._before_break]
        failed = [r for r in arrived if self.replies[r][0] in (proto.ERROR, "died")]
        return sorted(failed, key=lambda r: (self._peer_lost(r), r))

    def _peer_lost(self, rank: int) -> bool:
        reply = self.replies[rank]
        return reply[0] == proto.ERROR and any(s in reply[3] for s in PEER_LOST_SIGNS)

    def _receive(self, timeout: float) -> None:
        conns = {self.group.conns[r]: r for r in self.pending}
        for conn in wait(list(conns), timeout=timeout):
            rank = conns[conn]
            try:
                msg = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):
                msg = self._death(rank)
            if msg[0] == proto.OUT:
                self.sink.write(rank, msg[1], msg[2], msg[3])
            elif msg[0] == proto.BLOCKED:
                if msg[1] == self.req:
                    self.blocked[rank] = (msg[2], msg[3])
                    self.status.blocked(rank, msg[2])
            elif msg[0] == proto.WAITING:
                if msg[1] == self.req:
                    self.status.waiting(rank, msg[2], msg[3])
            elif msg[0] == "died" or msg[1] == self.req:
                self._record(rank, (msg[0], msg[1], proto.load_value(msg[2])) if msg[0] == proto.DONE else msg)

    def _record(self, rank: int, msg: tuple) -> None:
        self.replies[rank] = msg
        self.pending.discard(rank)
        self._arrival.append(rank)
        self.status.finished(rank, msg[0])

    def _death(self, rank: int) -> tuple:
        return ("died", self.req, self.group.exit_code(rank), self.group.log_tail(rank))
