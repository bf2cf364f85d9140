"""One engine under spawn/launch/run_script: torchelastic's agent, run in this process.

``elastic_launch`` (torchrun's engine) starts the ranks, writes per-rank logs and error files,
stops survivors when a rank fails and restarts on request. distlab adds: a store it hosts on
127.0.0.1 only (torch's ``TCPStore`` otherwise listens on every interface), live output, a
timeout with stacks, and clean ends on interrupt.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from . import forklaunch, watch
from .errors import INTERRUPTED, WorkerFailedError, WorkerTimeoutError
from .results import RunResult, collect, read_logs

LOOPBACK_BACKEND = "distlab-loopback"
_HANDLERS: dict = {}  # run_id -> the loopback rendezvous of a live single-node run


@dataclass
class Plan:
    """What to run: ``python -m distlab._start run.json TARGET ARGS`` on ``nproc`` local ranks."""

    run_dir: Path
    target: Path
    nproc: int
    target_args: list[str] = field(default_factory=list)
    timeout: float | None = None
    max_restarts: int = 0
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str = ""
    script: Path | None = None
    plain_python: bool = False  # run TARGET like `python TARGET`: no torchrun variables
    rdzv_id: str = "distlab"  # the c10d rendezvous id shared by all nodes (nnodes > 1)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    start: str = "spawn"  # "forkserver": ranks forked from distlab's torch-preloaded server (#18)

    @property
    def elastic_run_id(self) -> str:
        """torchelastic's run id (TORCHELASTIC_RUN_ID in every worker): how distlab finds them."""
        return self.run_id if self.nnodes == 1 else self.rdzv_id

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes


def new_run_dir(name: str) -> Path:
    """A fresh per-run folder under $DISTLAB_RUNS (default: <tmp>/distlab-runs)."""
    import tempfile

    root = Path(os.environ.get("DISTLAB_RUNS", Path(tempfile.gettempdir()) / "distlab-runs"))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = root / f"{stamp}-{name}-{uuid.uuid4().hex[:6]}"
    for sub in ("logs", "stacks", "ready", "returns", "metrics"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    return path


def execute(plan: Plan, view, collect_returns: bool = True) -> RunResult:
    """Run the plan to completion; raise a distlab error naming the rank when it fails."""
    run_json = plan.run_dir / "run.json"
    run_json.write_text(json.dumps({"run_dir": str(plan.run_dir), "parent_pid": os.getpid(),
                                    "single_node": plan.nnodes == 1,
                                    "sys_path": [p for p in sys.path if p], "plain_python": plan.plain_python}))
    watcher = watch.Watcher(plan.run_dir, plan.elastic_run_id, plan.world_size, view, plan.timeout)
    start = time.perf_counter()
    failure = interrupted = None
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    watcher.start()
    try:
        with _quiet_torchelastic():
            _launch_agent(plan, run_json)
    except KeyboardInterrupt as e:
        interrupted = e
    except Exception as e:
        if _is_interrupt(e):
            interrupted = e
        elif type(e).__name__ != "ChildFailedError":
            raise
        failure = e
    finally:
        _restore_signals(saved)
        watcher.finish()
        watch.stop_workers(plan.elastic_run_id)
        handler = _HANDLERS.pop(plan.run_id, None)
        if handler is not None:
            handler.shutdown()
    wall = time.perf_counter() - start
    result = collect(plan.run_dir, plan.script, plan.world_size, wall, returns=collect_returns and not failure)
    if interrupted is not None:
        raise KeyboardInterrupt(INTERRUPTED.format(n=plan.world_size, run_dir=plan.run_dir))
    if watcher.timed_out:
        raise WorkerTimeoutError(plan.timeout, watcher.stacks, plan.run_dir, result)
    if failure is not None:
        raise first_failure_error(failure, plan.run_dir, result)
    return result


def _launch_agent(plan: Plan, run_json: Path) -> None:
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    local = plan.nnodes == 1
    if local:
        _register_loopback_backend()
    config = LaunchConfig(
        min_nodes=plan.nnodes, max_nodes=plan.nnodes, nproc_per_node=plan.nproc,
        run_id=plan.elastic_run_id,
        rdzv_backend=LOOPBACK_BACKEND if local else "c10d",
        rdzv_endpoint="" if local else plan.rdzv_endpoint,
        rdzv_configs={} if local else {"rank": plan.node_rank},
        max_restarts=plan.max_restarts, monitor_interval=0.05,
        logs_specs=_run_logs(plan.run_dir), signals_to_handle="SIGINT,SIGTERM",
    )
    # -- start-mode hook (#18): fork the ranks from distlab's forkserver; False: it could not start
    if plan.start == "forkserver" and local and not plan.plain_python and forklaunch.run(config, plan, run_json):
        return
    args = ["-u", "-m", "distlab._start", str(run_json), str(plan.target), *plan.target_args]
    elastic_launch(config, sys.executable)(*args)


PEER_FAILURE_SIGNS = ("closed by peer", "reset by peer", "likely closed", "Broken pipe", "pair closure")


def first_failure_error(exc, run_dir: Path, result: RunResult) -> WorkerFailedError:
    """Name the rank that failed *first*: the root cause, not a survivor reporting it.

    Survivors fail too (a dead peer breaks their collective; torchelastic SIGTERMs the rest), and
    they write their error a few ms *after* the root cause. So a failure that only reports a lost
    peer, or a SIGTERM, ranks after every other; within each kind the sub-second time decides.
    """
    rank, failure = min(exc.failures.items(), key=_failure_order)
    code = failure.exitcode
    tb = _callstack(failure)
    if not tb:
        tb = f"rank {rank} wrote no Python traceback: " + (
            f"it was killed by signal {signal.Signals(-code).name}" if code < 0 else f"it exited with code {code}")
    last = "\n".join(lines_before_traceback(read_logs(run_dir, rank))[-15:])
    return WorkerFailedError(rank, code, tb, last, run_dir, result)


def _failure_order(item) -> tuple:
    rank, failure = item
    text = _callstack(failure)
    secondary = failure.exitcode == -signal.SIGTERM or any(sign in text for sign in PEER_FAILURE_SIGNS)
    try:
        when = json.loads(Path(failure.error_file).read_text())["message"]["extraInfo"]["time"]
    except Exception:
        when = float(failure.timestamp)  # no error file: died in C code or by a signal
    return (secondary, when, rank)


def _callstack(failure) -> str:
    if isinstance(failure.message, dict):
        return failure.message.get("extraInfo", {}).get("py_callstack") or failure.message.get("message", "")
    return ""


def lines_before_traceback(log: str) -> list[str]:
    """A rank's output up to its final traceback (the traceback itself is shown separately)."""
    lines = log.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    return lines[:starts[-1]] if starts else lines


def _is_interrupt(exc: BaseException) -> bool:
    return type(exc).__name__ == "SignalException" and getattr(exc, "sigval", None) == signal.SIGINT


def _restore_signals(saved: dict) -> None:
    """torchelastic installs its handlers in the main thread only; put the kernel's back."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, handler in saved.items():
        if handler is not None:
            signal.signal(sig, handler)


class _quiet_torchelastic:
    """torchelastic logs every start and failure at WARNING; distlab reports those itself."""

    names = ("torch.distributed.elastic", "torch.distributed.launcher", "torchelastic-events-null")

    def __enter__(self):
        self.levels = {n: logging.getLogger(n).level for n in self.names}
        for n in self.names:
            logging.getLogger(n).setLevel(logging.CRITICAL)

    def __exit__(self, *exc):
        for n, level in self.levels.items():
            logging.getLogger(n).setLevel(level)


class _LoopbackStore:
    """A TCPStore on 127.0.0.1 only: distlab binds the socket and hands torch its fd.

    Holding the bound socket means no other launch can take the port (no bind-then-close
    race), and nothing listens beyond loopback.
    """

    def __init__(self):
        from datetime import timedelta

        from torch.distributed import TCPStore

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        self.port = sock.getsockname()[1]
        self.store = TCPStore("127.0.0.1", self.port, is_master=True, wait_for_workers=False,
                              timeout=timedelta(seconds=300), master_listen_fd=sock.fileno())
        sock.detach()  # the store owns the listening fd now and closes it when released


def _register_loopback_backend() -> None:
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry as registry

    registry.register(LOOPBACK_BACKEND, _create_loopback_handler)  # idempotent for the same creator


def _create_loopback_handler(params):
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

    class LoopbackRendezvous(StaticTCPRendezvous):
        """Single-node static rendezvous with a fresh loopback store per attempt.

        A new store each time torchelastic (re)starts the workers: keys a failed attempt left
        behind (gloo's peer addresses) must not reach the next one.
        """

        _loopback = None

        def get_backend(self) -> str:
            return LOOPBACK_BACKEND

        def next_rendezvous(self):
            self.shutdown()
            self._loopback = _LoopbackStore()
            self._store, self.master_port = self._loopback.store, self._loopback.port
            return super().next_rendezvous()

        def shutdown(self) -> bool:
            self._store = self._loopback = None
            return True

    handler = LoopbackRendezvous("127.0.0.1", 0, 0, 1, params.run_id, timeout=300)
    _HANDLERS[params.run_id] = handler
    return handler


def _run_logs(run_dir: Path):
    """torchelastic's LogsSpecs with distlab's layout (defined here: torch is imported lazily)."""
    from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs

    class RunLogs(LogsSpecs):
        """Predictable log paths: ``logs/attempt<k>/rank<r>.{out,err,error.json}``."""

        def __init__(self, run_dir: Path):
            super().__init__(log_dir=str(run_dir / "logs"))
            self.run_dir = run_dir

        @property
        def root_log_dir(self) -> str:
            return str(self.run_dir / "logs")

        def reify(self, envs):
            attempt = envs[0].get("TORCHELASTIC_RESTART_COUNT", "0") if envs else "0"
            folder = self.run_dir / "logs" / f"attempt{attempt}"
            folder.mkdir(parents=True, exist_ok=True)
            dest = LogsDest()
            for local, env in envs.items():
                rank = env.get("RANK", str(local))
                dest.stdouts[local] = str(folder / f"rank{rank}.out")
                dest.stderrs[local] = str(folder / f"rank{rank}.err")
                dest.error_files[local] = env["TORCHELASTIC_ERROR_FILE"] = str(folder / f"rank{rank}.error.json")
            return dest

    return RunLogs(run_dir)
