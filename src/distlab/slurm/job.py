"""A submitted job: watch it live from a cell, ask its state, cancel it, collect its result.

:class:`SlurmJob` is what :func:`distlab.slurm.submit` returns with ``join=False`` and what
:func:`attach` finds again by job id from another kernel. ``join()`` streams every rank's new
lines into the cell (``[rank1] ...``), prints each change of the job's state (``[slurm] ...``)
and the batch script's own output (``[batch] ...``), then returns a :class:`SlurmResult` or raises.
Kernel > Interrupt while watching cancels the job (``scancel``) and waits until it has left the
queue; ``timeout`` (seconds of *running*, not of waiting in the queue) first asks every rank for its
stack (SIGWINCH, which distlab's worker runtime answers with a faulthandler dump: SIGUSR1 and SIGUSR2 are left
to the job's own code, e.g. ``--signal=USR1@90``) and then cancels.
"""
from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from distlab import results
from distlab.folders.private import private_root
from distlab.folders.runfolder import RunFolder
from distlab.view.display import make_view
from distlab.view.streams import Line, deliver

from . import commands
from .errors import (
    NOT_OURS,
    SlurmInterrupted,
    SlurmJobFailedError,
    SlurmNotFoundError,
    SlurmTimeoutError,
)
from .jobstate import JobState, failure_error, first_failed, follow, gone_state, newest_record
from .layout import META, batch_log, exit_file

#: what asks a Slurm job's ranks for their stacks (distlab.worker.STACK_SIGNALS; not imported: the worker
#: runtime is the ranks' side)
STACK_SIGNAL = signal.SIGWINCH

POLL_S = 0.1
STACK_WAIT_S = 2.0
CANCEL_WAIT_S = 60.0


@dataclass(repr=False)
class SlurmResult(results.RunResult):
    """A finished job: ``returns``/``logs``/``metrics`` per rank (as :class:`RunResult`), plus Slurm's view."""

    job_id: int = 0
    state: str = ""
    exit_code: str = ""  # Slurm's "code:signal" of the batch script
    exit_codes: dict[int, int | None] = field(default_factory=dict)  # each rank's, last attempt
    attempts: int = 1
    sbatch_script: Path | None = None
    history: list[tuple[float, str]] = field(default_factory=list)  # (seconds since submit, state seen)

    def __repr__(self) -> str:
        return (f"SlurmResult(job_id={self.job_id}, state={self.state!r}, exit_codes={self.exit_codes}, "
                f"attempts={self.attempts}, wall_s={self.wall_s:.1f}, returns={self.returns!r})")


class SlurmJob:
    """Handle on one job: ``id``, ``state``, ``logs``, ``metrics``, ``cancel()``, ``watch()``, ``join()``."""

    def __init__(self, job_id: int, run_dir, meta: dict):
        self.id, self.folder, self.meta = job_id, RunFolder(run_dir), meta
        self.world_size = meta["world_size"]
        self.history: list[tuple[float, str]] = []
        self._tail = None
        self._last: JobState | None = None
        self._requeues = 0  # REQUEUED entries in history

    def __repr__(self) -> str:
        return f"SlurmJob(id={self.id}, state={self.state.describe()!r}, run_dir='{self.folder.path}')"

    # ------------------------------------------------------------------ looking
    @property
    def run_dir(self) -> Path:
        return self.folder.path

    @property
    def sbatch_script(self) -> Path:
        return Path(self.meta["sbatch"])

    @property
    def batch_log(self) -> Path:
        return batch_log(self.run_dir, self.id)

    @property
    def state(self) -> JobState:
        return commands.job_state(self.id) or JobState("UNKNOWN")

    @property
    def logs(self) -> dict[int, str]:
        return {r: results.read_logs(self.folder, r) for r in range(self.world_size)}

    @property
    def metrics(self) -> dict[int, list[dict]]:
        return {r: results.read_metrics(self.folder, r) for r in range(self.world_size)}

    def latest(self, key: str, rank: int = 0, default=None):
        """The last value rank ``rank`` reported for ``key`` (``distlab.report``), or ``default``."""
        values = [row[key] for row in results.read_metrics(self.folder, rank) if key in row]
        return values[-1] if values else default

    def exit_codes(self) -> dict[int, int | None]:
        """Each rank's exit code in the newest attempt (None: it has not ended, or never started)."""
        attempts = self.folder.attempts()
        out = {}
        for r in range(self.world_size):
            path = exit_file(attempts[-1], r) if attempts else None
            out[r] = int(path.read_text()) if path is not None and path.exists() else None
        return out

    # ------------------------------------------------------------------ acting
    def cancel(self, wait_s: float = CANCEL_WAIT_S) -> bool:
        """``scancel``, then wait until the job has left the queue (True) or ``wait_s`` passed."""
        commands.scancel(self.id)
        deadline = time.monotonic() + wait_s
        while commands.in_queue(self.id):
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
        return True

    def watch(self, until=None, timeout: float | None = None, view="text") -> JobState:
        """Stream the job live until it ends or ``until()`` is true; returns the last state seen."""
        __tracebackhide__ = True
        shown = make_view(view, self.world_size)
        try:
            return self._watch(shown, until, timeout)
        except KeyboardInterrupt:
            self.cancel()
            self._poll_state()
            self._show(shown, final=True)
            raise SlurmInterrupted(self.id, self.run_dir) from None
        finally:
            shown.close()

    def join(self, timeout: float | None = None, view="text") -> SlurmResult:
        """Watch until the job ends; its :class:`SlurmResult`, or an error naming what failed."""
        __tracebackhide__ = True
        last = self.watch(timeout=timeout, view=view)
        result = self.result(last)
        if result.state != "COMPLETED":
            raise failure(result, self.batch_log)
        return result

    def result(self, last: JobState | None = None) -> SlurmResult:
        last = commands.controller_view(self.id) or last or self.state
        base = results.collect(self.folder, Path(self.meta["target"]), self.world_size,
                               time.time() - self.meta["submitted"], returns=False)
        if self.meta["returns"]:
            base.returns = read_returns(self.folder, self.world_size, self.meta.get("uid", os.geteuid()))
        return SlurmResult(**base.__dict__, job_id=self.id, state=last.state, exit_code=last.exit_code,
                           exit_codes=self.exit_codes(), attempts=max(len(self.folder.attempts()), 1),
                           sbatch_script=self.sbatch_script, history=list(self.history))

    # ------------------------------------------------------------------ the loop
    def _watch(self, view, until, timeout) -> JobState:
        running_since = None
        while True:
            state = self._poll_state()
            self._show(view)
            if state.finished:
                self._show(view, final=True)
                return state
            if until is not None and until():
                return state
            if state.state == "RUNNING" and running_since is None:
                running_since = time.monotonic()
            if timeout is not None and running_since and time.monotonic() - running_since > timeout:
                self._time_out(view, timeout)
            time.sleep(POLL_S)

    def _poll_state(self) -> JobState:
        seen = follow(commands.job_state(self.id), self._last, len(self.folder.attempts()), self._requeues)
        state = seen.state
        if seen.changed:
            self._requeues += seen.requeued
            self._last = state
            self.history.append((round(time.time() - self.meta["submitted"], 3),
                                 "REQUEUED" if seen.requeued else state.state))
            print(f"[slurm] job {self.id} {'requeued, ' if seen.requeued else ''}{state.describe()}", flush=True)
        if state.state == "GONE":  # no Slurm record left: judge by the ranks' exit codes
            return gone_state(list(self.exit_codes().values()))
        return state

    def _show(self, view, final: bool = False) -> None:
        if self._tail is None:
            from .tail import JobTail

            self._tail = JobTail(self.folder, self.batch_log)
        for rank, event in self._tail.lines(final):
            if rank is not None:
                deliver(view, rank, event)
            elif isinstance(event, Line) or (event.done and event.text):
                print(f"[batch] {event.text}", flush=True)  # the batch script's own bars: their final state
        for rank, row in self._tail.metrics():
            view.metric(rank, row)

    def _time_out(self, view, timeout: float):
        # every rank dumps its stack (faulthandler; not SIGUSR1, which the job's own code may want)
        commands.scancel(self.id, signal=str(int(STACK_SIGNAL)))
        started = [r for r in range(self.world_size) if self.folder.ready(r).exists()]
        deadline = time.monotonic() + STACK_WAIT_S
        while time.monotonic() < deadline and not all(_nonempty(self.folder.stack(r)) for r in started):
            time.sleep(POLL_S)
        stacks = {r: job_stack(self.folder.stack(r).read_text(errors="replace"), self.folder.path) for r in started
                  if _nonempty(self.folder.stack(r))}
        self.cancel()
        self._poll_state()
        self._show(view, final=True)
        raise SlurmTimeoutError(self.id, timeout, stacks, self.run_dir, result=self.result())


def job_stack(dump: str, folder) -> str:
    """A rank's dump as ``spawn``'s timeout shows it: distlab's frames out (the watchdog, the worker
    runtime, ``runpy``, the rank's start), each frame of the job's script mapped to its notebook cell."""
    from distlab.capture.origins import annotate_dump
    from distlab.launch.watch import rank_stack

    return annotate_dump(rank_stack(dump), folder) or "(no Python frames: it may have just finished)"


def read_returns(folder: RunFolder, world_size: int, uid: int) -> dict:
    """Each rank's return value, unpickled only from a folder and files that still belong to the job's
    user alone (the job user's on distlab's local cluster, else yours)."""
    import torch

    from .jobuser import check_job_file, check_job_folder

    check_job_folder(folder.path, uid)
    out = {}
    for rank in range(world_size):
        path = folder.returned(rank)
        if path.exists():
            check_job_file(path, uid)
            out[rank] = torch.load(path, map_location="cpu", weights_only=False)
        else:
            out[rank] = None
    return out


def _nonempty(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 0


def failure(result: SlurmResult, batch_log: Path) -> SlurmJobFailedError:
    """The error for a job that did not complete (:func:`.jobstate.failure_error`), from its files."""
    first = first_failed(result.exit_codes, lambda rank: _exit_time(result.run_dir, rank))
    tail = batch_log.read_text(errors="replace").rstrip().splitlines() if batch_log.exists() else []
    return failure_error(result, first, tail)


def _exit_time(run_dir: Path, rank: int) -> float:
    attempts = RunFolder(run_dir).attempts()
    path = exit_file(attempts[-1], rank) if attempts else None
    return path.stat().st_mtime if path is not None and path.exists() else float("inf")


def save_meta(folder: RunFolder, meta: dict) -> None:
    from distlab.folders.private import write_private

    write_private(folder.path / META, json.dumps(meta))


def attach(job_id: int, root: Path | None = None) -> SlurmJob:
    """The :class:`SlurmJob` for ``job_id`` submitted earlier (from any kernel) by you, through distlab.

    Looks for the run folder holding it in your private runs root, and in the records of distlab's
    local cluster (its jobs' run folders belong to the job user); with several (two clusters
    numbered jobs alike), the newest submitted under the current SLURM_CONF wins.
    """
    root = private_root(root)
    from .cluster import current_cluster
    from .jobuser import check_job_folder, records

    local = current_cluster()
    found = []
    for path in [*root.glob(f"*/{META}"), *(records(local.folder) if local is not None else ())]:
        meta = json.loads(path.read_text())
        found.append({**meta, "run_dir": meta.get("run_dir") or str(path.parent)})
    meta = newest_record(found, job_id, os.environ.get("SLURM_CONF"))
    if meta is None:
        raise SlurmNotFoundError(NOT_OURS.format(job_id=job_id, root=root))
    run_dir = Path(meta["run_dir"])
    check_job_folder(run_dir, meta.get("uid", os.geteuid()))
    return SlurmJob(int(job_id), run_dir, meta)

