"""The launcher's watcher thread: streams rank output live, enforces the timeout and
cancellation, stops workers.

It runs beside torchelastic's agent (which owns the main thread, so it can catch SIGINT).
Nothing a view does can stop it: a view that raises is switched off (every line stays in the
run folder's logs) and the timeout still fires. It signals only processes it has verified to be
this run's workers, never a pid merely read from a file.
"""
from __future__ import annotations

import _thread
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil

from distlab.capture.origins import annotate_dump
from distlab.folders.runfolder import RunFolder
from distlab.view.stacks import clean_stack
from distlab.view.streams import Streams, deliver

POLL_S = 0.05
STACK_WAIT_S = 0.5
AGENT_GRACE_S = 3.0
NOT_STARTED = "(not started yet: still importing, or already exited)"


def descendants(pid: int | None = None) -> list[psutil.Process]:
    """Live processes below ``pid`` (default: this one). On Linux read from the ``children`` files
    of each task in ``/proc``: psutil's ``children(recursive=True)`` reads the status of every
    process on the machine (1.3 ms a launch here, far more on a shared host with thousands)."""
    pid = os.getpid() if pid is None else pid
    pids = _children_from_proc(pid)
    if pids is None:
        return psutil.Process(pid).children(recursive=True)
    found = []
    for child in pids:
        try:
            found.append(psutil.Process(child))
        except psutil.Error:  # gone meanwhile
            pass
    return found


def _children_from_proc(pid: int) -> list[int] | None:
    """Every pid below ``pid`` from ``/proc/<pid>/task/<tid>/children``; None where the kernel
    has no such files (then psutil's way is used)."""
    tree = _tree_from_proc(pid)
    return None if tree is None else [child for child, _ in tree]


def _tree_from_proc(pid: int) -> list[tuple[int, int]] | None:
    """(pid, parent pid) of every process below ``pid``, from the ``children`` files."""
    if not os.path.exists(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/children"):
        return None
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:  # gone
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):  # a thread that just ended
                continue
            found += [(kid, parent) for kid in kids]
            todo += kids
    return found


def our_workers(run_id: str) -> list[psutil.Process]:
    """Live descendants of this process that belong to run ``run_id`` (torchelastic sets the id)."""
    from distlab.forkserver.mode import forked_ranks, forkserver_pid

    server = forkserver_pid()
    found = []
    for p in _environ_candidates(server):
        try:
            if p.environ().get("TORCHELASTIC_RUN_ID") == run_id:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    # -- start-mode hook (#18): a forked rank's /proc environment is the forkserver's, not its own
    return found + [p for p in forked_ranks(run_id).values() if p not in found]


def _environ_candidates(server: int | None) -> list[psutil.Process]:
    """The descendants whose ``/proc`` environment may name a run: not the forkserver nor the
    processes it forked (ranks and spare ranks: their ``/proc`` environment is the server's; a
    forked rank is known by its pid instead). Processes *they* started are candidates."""
    tree = _tree_from_proc(os.getpid()) if server is not None else None
    if tree is None:
        return descendants()
    found = []
    for pid, parent in tree:
        if server in (pid, parent):
            continue
        try:
            found.append(psutil.Process(pid))
        except psutil.Error:  # gone meanwhile
            pass
    return found


def verified_workers(run_id: str, ready: dict[int, int]) -> dict[int, psutil.Process]:
    """rank -> process, for the ranks whose worker is surely ours and ready for SIGUSR1.

    A worker qualifies when it is a live descendant of this process, carries this run's
    TORCHELASTIC_RUN_ID, was started as ``python -m distlab.launch.rank`` (or forked by distlab's
    forkserver for this run), and is the pid its rank
    wrote to ``ready/`` (written only after its stack-dump handler is installed: SIGUSR1 would
    kill a worker still importing).
    """
    found = {}
    for p in our_workers(run_id):
        try:
            rank = int(p.environ().get("RANK", "-1"))
            if "distlab.launch.rank" in p.cmdline() and ready.get(rank) == p.pid:
                found[rank] = p
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ValueError):
            pass
    # -- start-mode hook (#18): a forked rank is known by the pid distlab's own forkserver reported
    from distlab.forkserver.mode import forked_ranks, server_children

    found.update({r: p for r, p in forked_ranks(run_id).items() if ready.get(r) == p.pid})
    # -- across nodes (#46): a rank an agent on a node asked the server for is not in this process's
    # records; it is the forkserver's child that wrote its pid to ready/
    found.update({r: p for r, p in server_children(ready).items() if r not in found})
    return found


def stop_workers(run_id: str, grace_s: float = 2.0) -> int:
    """SIGTERM, then SIGKILL whatever is left of the run; returns how many were alive."""
    procs = our_workers(run_id)
    for p in procs:
        _signal(p, signal.SIGTERM)
        _signal(p, signal.SIGCONT)  # a stopped worker acts on SIGTERM only once continued
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        _signal(p, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=grace_s)
    return len(procs)


def _signal(p: psutil.Process, sig) -> None:
    try:
        p.send_signal(sig)
    except psutil.NoSuchProcess:
        pass


class Watcher:
    """One run's watcher: every ``POLL_S`` its thread enforces the timeout and streams new output.

    Its thread is started without waiting for it to run, and :meth:`finish` does not wait for it
    to end, only for a step in progress: on a machine whose cores are busy a new thread waits a
    scheduler slice before it first runs, and a launch shorter than ``POLL_S`` (the watcher never
    stepped) used to wait for its watcher twice, at start and at join (``bench/launch_phases.py --busy``).
    """

    def __init__(self, folder, run_id: str, world_size: int, view, timeout: float | None,
                 cancel: threading.Event | None = None, never_started: str | None = None):
        self.name = f"distlab-watch-{run_id}"
        self.folder = folder if isinstance(folder, RunFolder) else RunFolder(folder)
        self.run_id, self.world_size = run_id, world_size
        self.view, self.timeout = view, timeout
        self.cancel = cancel or threading.Event()
        self.never_started = never_started  # what a rank's stack says when no worker started here
        self.timed_out = self.cancelled = False
        self.stacks: dict[int, str] = {}
        self.agents: list = []  # the Popens of out-of-process agents (multi-node runs: one per node here)
        self._stop_event = threading.Event()
        self._step_lock = threading.RLock()  # a step of the thread, or finish(): one at a time
        self._offsets: dict[Path, int] = {}
        self._streams = Streams()  # each rank log's unfinished line, and a progress bar redrawing it
        self._start = time.monotonic()
        self._finished = self._view_broken = False
        self._warned: set[str] = set()

    @property
    def run_dir(self) -> Path:
        return self.folder.path

    def start(self) -> None:
        _thread.start_new_thread(self.run, ())

    def run(self) -> None:
        while not self._stop_event.wait(POLL_S):
            with self._step_lock:
                if self._stop_event.is_set():
                    return
                self._guard(self.enforce)
                self._guard(self.poll)

    def enforce(self) -> None:
        """Timeout and cancellation: stop the ranks (again after any torchelastic restart)."""
        if self.cancel.is_set() and not self.timed_out:
            self.cancelled = True
        if self.timeout and not (self.timed_out or self.cancelled) and time.monotonic() - self._start > self.timeout:
            self.stacks = self.dump_stacks()
            self.timed_out = True
        if self.timed_out or self.cancelled:
            stop_workers(self.run_id, grace_s=0.5)
            self.stop_agent()

    def stop_agent(self) -> None:
        """End the out-of-process agents: SIGTERM (each stops its workers), then SIGKILL. Idempotent."""
        running = [agent for agent in self.agents if agent.poll() is None]
        for agent in running:
            agent.terminate()
        deadline = time.monotonic() + AGENT_GRACE_S
        for agent in running:
            try:
                agent.wait(max(0.0, deadline - time.monotonic()))
            except Exception:
                agent.kill()
                agent.wait()

    def finish(self) -> None:
        """Stop watching, then stream what is left so no line is lost. Safe to call again."""
        self._stop_event.set()
        with self._step_lock:
            if self._finished:
                return
            self._finished = True
            self._guard(lambda: self.poll(final=True))
            self._to_view("close")

    def poll(self, final: bool = False) -> None:
        for rank, path in self.folder.output_streams():
            for event in self._new_events(path, final):
                self._to_view(deliver, self.view, rank, event)
        for rank, path in self.folder.metric_streams():
            for event in self._new_events(path, final):
                try:
                    row = json.loads(event.text)
                except ValueError:
                    continue  # not a row distlab.report wrote
                self._to_view("metric", rank, row)

    def _to_view(self, call, *args) -> None:
        """``call``: a method name of the view, or a function; a view that raises is switched off."""
        if self._view_broken:
            return
        try:
            (getattr(self.view, call) if isinstance(call, str) else call)(*args)
        except Exception as e:
            self._view_broken = True
            self._warn(f"distlab: the live view failed ({type(e).__name__}: {e}) and is switched off; "
                       f"every rank's output is still in {self.folder.logs}")

    def _guard(self, step) -> None:
        """Run one step; an error is reported once and the watcher carries on."""
        try:
            step()
        except Exception as e:
            self._warn(f"distlab: the run's watcher hit {type(e).__name__}: {e}; it carries on")

    def _warn(self, text: str) -> None:
        if text not in self._warned:
            self._warned.add(text)
            print(text, file=sys.stderr, flush=True)

    def _new_events(self, path: Path, final: bool) -> list:
        """What ``path`` gained since the last look: whole lines, and the latest state of a progress
        bar redrawing the unfinished one (:mod:`distlab.view.streams`); at the end, the rest."""
        with open(path, "rb") as f:
            f.seek(self._offsets.get(path, 0))
            chunk = f.read()
        self._offsets[path] = self._offsets.get(path, 0) + len(chunk)
        return self._streams.feed(path, chunk) + (self._streams.flush(path) if final else [])

    def dump_stacks(self) -> dict[int, str]:
        """Ask every verified, ready rank for its Python stacks (faulthandler on SIGUSR1) and read them."""
        workers = verified_workers(self.run_id, self.folder.ready_pids())
        for p in workers.values():
            _signal(p, signal.SIGUSR1)
        if workers:
            time.sleep(STACK_WAIT_S)
        missing = self.never_started if self.never_started and not workers else NOT_STARTED
        stacks = {}
        for rank in range(self.world_size):
            path = self.folder.stack(rank)
            text = path.read_text(errors="replace") if path.exists() else ""
            stacks[rank] = annotate_dump(rank_stack(text), self.folder.path) or missing
        return stacks


RUNTIME_FRAMES = ("distlab/worker.py", "distlab/launch/rank.py", "<frozen runpy>", "threading.py",
                  "distlab/forkserver/spare.py", "distlab/forkserver/server.py",  # how a forked rank started
                  "distlab/slurm/bound.py")  # how a rank of a multi-node Slurm job started


def rank_stack(dump: str) -> str:
    """A rank's stack dump with only the learner's frames (:func:`distlab.view.stacks.clean_stack`)."""
    return clean_stack(dump, RUNTIME_FRAMES)
