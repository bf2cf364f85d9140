"""One engine under spawn/launch/run_script: torchelastic's agent.

``elastic_launch`` (torchrun's engine) starts the ranks, writes per-rank logs and error files,
stops survivors when a rank fails and restarts on request. distlab adds: a rendezvous no other
local user can open (torch's ``TCPStore`` listens on every interface, with no password), torch's
temporary files kept in the private root, live output, a timeout with stacks, cancellation, and
clean ends on interrupt.

Where the agent runs:

* one node: in this process (the kernel), with distlab's rendezvous: an in-process store for the
  agent, a private ``FileStore`` for the ranks (no socket another user could open);
* several nodes (``nnodes > 1``): torch's c10d rendezvous unpickles what it reads from its
  store, and whoever reaches ``rdzv_endpoint`` can write there. That agent runs in a child
  process (``python -m distlab.launch.agent``, or on :class:`distlab.Nodes` forked from distlab's
  forkserver onto its node: ``distlab.launch.agent.run_forked``), never in the kernel; its ranks'
  output streams from the run folder as usual. It still runs as you: see the README's "On a shared machine".

Cleanup (watcher, agent process, workers, store) always runs to its end: a Ctrl-C that arrives
during it is held back, and only afterwards are the kernel's own signal handlers put back.
Nothing torch raised is kept: a failure is copied into plain records, so an exception that
IPython holds on to does not hold the agent, or its store, alive.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import subprocess
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import SimpleNamespace

from distlab.errors import (
    AGENT_FAILED,
    CANCELLED,
    NEVER_STARTED,
    DistlabError,
    RunCancelledError,
    RunInterrupted,
    WorkerFailedError,
    WorkerTimeoutError,
)
from distlab.folders import privtmp
from distlab.folders.private import open_private, write_private
from distlab.folders.runfolder import RunFolder
from distlab.forkserver import elastic as forklaunch
from distlab.forkserver import mode as launchmode
from distlab.launch import standby, watch
from distlab.launch.compat import check_torch
from distlab.rendezvous import loopback as rendezvous
from distlab.results import RunResult, collect, read_logs

LOOPBACK_BACKEND = rendezvous.LOOPBACK_BACKEND
AGENT_MODULE = "distlab.launch.agent"  # a multi-node run's agent (python -m, or forked onto a node)


@dataclass
class Plan:
    """What to run: ``python -m distlab.launch.rank run.json TARGET ARGS`` on ``nproc`` local ranks."""

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
    cancel: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    @property
    def elastic_run_id(self) -> str:
        """torchelastic's run id (TORCHELASTIC_RUN_ID in every worker): how distlab finds them."""
        return self.run_id if self.nnodes == 1 else self.rdzv_id

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    @property
    def folder(self) -> RunFolder:
        return RunFolder(self.run_dir)

    def to_json(self) -> dict:
        """The plan for the out-of-process agent (``distlab.launch.agent``)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "cancel"}
        return {k: str(v) if isinstance(v, Path) else v for k, v in data.items()}

    @classmethod
    def from_json(cls, data: dict) -> Plan:
        paths = {k: Path(data[k]) for k in ("run_dir", "target", "script") if data.get(k)}
        return cls(**{**data, **paths})


def new_run_dir(name: str) -> Path:
    """A fresh private run folder (see :mod:`distlab.folders.runfolder` for where and how)."""
    return RunFolder.create(name).path


@dataclass
class Outcome:
    """How the agent ended, as plain data (no torch object, so no store kept alive)."""

    interrupted: bool = False
    failures: dict | None = None  # rank -> SimpleNamespace(exitcode, error_file, message, timestamp)
    error: str | None = None  # an unexpected agent error, as text


def execute(plan: Plan, view, collect_returns: bool = True, nodes=None) -> RunResult:
    """Run the plan to completion; raise a distlab error naming the rank when it fails.
    ``nodes``: run it across :class:`distlab.Nodes`, one agent on each."""
    __tracebackhide__ = True  # IPython shows the learner's cell, not distlab's frames
    check_torch()
    folder = plan.folder
    write_private(folder.run_json, json.dumps(run_config(plan)))
    never = NEVER_STARTED.format(endpoint=plan.rdzv_endpoint) if plan.nnodes > 1 else None
    watcher = watch.Watcher(folder, plan.elastic_run_id, plan.world_size, view, plan.timeout,
                            cancel=plan.cancel, never_started=never)
    start = time.perf_counter()
    tell_view(view, "begin", folder.path)  # the view may watch ranks start and return
    outcome = run_to_the_end(plan, watcher, nodes)
    wall = time.perf_counter() - start
    ok = outcome.failures is None and outcome.error is None
    result = collect(folder.path, plan.script, plan.world_size, wall, returns=collect_returns and ok)
    error = None
    if outcome.interrupted:
        error = RunInterrupted(plan.world_size, folder.path, result)
    elif watcher.cancelled:
        error = RunCancelledError(CANCELLED.format(n=plan.world_size, run_dir=folder.path))
    elif watcher.timed_out:
        error = WorkerTimeoutError(plan.timeout, watcher.stacks, folder.path, result)
    elif outcome.failures:
        error = first_failure_error(SimpleNamespace(failures=outcome.failures), folder.path, result)
    elif outcome.error:
        error = DistlabError(AGENT_FAILED.format(error=outcome.error.rstrip(), run_dir=folder.path))
    tell_view(view, "finish", error or result)  # the cell keeps a static record of the run
    if error is not None:
        raise error
    return result


def run_config(plan: Plan) -> dict:
    """run.json: what every worker's runtime reads first."""
    return {"run_dir": str(plan.run_dir), "parent_pid": os.getpid(), "single_node": plan.nnodes == 1,
            "sys_path": launchmode.importable_path(), "plain_python": plan.plain_python}


def run_to_the_end(plan: Plan, watcher: watch.Watcher, nodes=None) -> Outcome:
    """Run the agent; whatever happens, clean up completely before the kernel's handlers return."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    signals = KernelSignals()
    outcome = Outcome()
    watcher.start()
    try:
        if plan.nnodes == 1 and nodes is None:
            with quiet_torchelastic():
                launch_agent(plan, plan.folder.run_json)
        else:
            run_agent_process(plan, watcher, outcome, nodes)
    except KeyboardInterrupt:
        outcome.interrupted = True
    except SignalException as e:
        outcome.interrupted = e.sigval == signal.SIGINT
        signals.note(e.sigval)  # a SIGTERM is delivered to the kernel's own handler after cleanup
    except ChildFailedError as e:
        outcome.failures = {rank: SimpleNamespace(**failure_record(f)) for rank, f in e.failures.items()}
    except Exception:
        outcome.error = traceback.format_exc()
    finally:
        signals.defer()
        try:
            cleanup(plan, watcher)
        finally:
            outcome.interrupted |= signals.restore()
    return outcome


def cleanup(plan: Plan, watcher: watch.Watcher) -> None:
    """Stop everything the run started. Every step runs even if one fails; each may be repeated."""
    steps = (watcher.finish, watcher.stop_agent, lambda: watch.stop_workers(plan.elastic_run_id),
             lambda: rendezvous.close_handler(plan.run_id),
             lambda: launchmode.wait_forked_ranks_gone(plan.elastic_run_id),  # they told their exit early
             lambda: launchmode.wait_forked_ranks_gone(agents_label(plan.run_id)))  # forgets forked agents
    errors = []
    for step in steps:
        try:
            step()
        except Exception as e:  # noqa: PERF203  (each step must run)
            errors.append(e)
    if errors:
        raise errors[0]


class KernelSignals:
    """The kernel's own SIGINT/SIGTERM handlers, put back only once cleanup is over.

    torchelastic replaces them while its agent runs in the main thread. During cleanup both
    signals are only noted (a second Ctrl-C must not cut cleanup short); ``restore`` puts the
    kernel's handlers back, delivers a noted SIGTERM to them, and says whether a SIGINT came.
    Outside the main thread signals never reach this code, so there is nothing to do.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.active = threading.current_thread() is threading.main_thread()
        self.saved = {s: signal.getsignal(s) for s in self.SIGNALS} if self.active else {}
        self.noted: set[int] = set()

    def note(self, signum) -> None:
        self.noted.add(int(signum))

    def defer(self) -> None:
        for s in self.saved:
            signal.signal(s, lambda signum, frame: self.note(signum))

    def restore(self) -> bool:
        for s, handler in self.saved.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        if self.active and signal.SIGTERM in self.noted:
            signal.raise_signal(signal.SIGTERM)
        return signal.SIGINT in self.noted


def failure_record(failure) -> dict:
    """The parts of torchelastic's ProcessFailure distlab reports, as JSON-able data."""
    return {"exitcode": failure.exitcode, "error_file": str(failure.error_file), "message": failure.message,
            "timestamp": int(failure.timestamp), "local_rank": failure.local_rank}


def tell_view(view, event: str, *args) -> None:
    """Call an optional view method (``begin``, ``finish``); views without it, or failing in it,
    never change how a run ends."""
    method = getattr(view, event, None)
    if method is None:
        return
    try:
        method(*args)
    except Exception as e:  # a display problem must not hide the run's own result or error
        import warnings

        warnings.warn(f"distlab: the live view failed in {event}(): {e!r}", stacklevel=2)


def launch_agent(plan: Plan, run_json: Path) -> None:
    """torchelastic's agent, with every temporary file torch makes in this process kept in the
    private root (torch unpickles its error files: see :mod:`distlab.folders.privtmp`)."""
    with privtmp.private_tempfiles():
        _launch_agent_here(plan, run_json)


def _launch_agent_here(plan: Plan, run_json: Path) -> None:
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    local = plan.nnodes == 1
    if local:
        rendezvous.register_backend()
    config = LaunchConfig(
        min_nodes=plan.nnodes, max_nodes=plan.nnodes, nproc_per_node=plan.nproc,
        run_id=plan.elastic_run_id,
        rdzv_backend=LOOPBACK_BACKEND if local else "c10d",
        rdzv_endpoint="" if local else plan.rdzv_endpoint,
        rdzv_configs={} if local else {"rank": plan.node_rank},
        max_restarts=plan.max_restarts, monitor_interval=0.05,
        logs_specs=_run_logs(plan.folder), signals_to_handle="SIGINT,SIGTERM",
    )
    # -- start-mode hook (#18): fork the ranks from distlab's forkserver; False: it could not start.
    # Across nodes only in an agent the server forked onto its node, which asks that server (#46).
    here = local or launchmode.adopted_server() is not None
    if plan.start == "forkserver" and here and not plan.plain_python and forklaunch.run(config, plan, run_json):
        return
    argv = launchmode.python_argv("distlab.launch.rank", str(run_json), str(plan.target), *plan.target_args)
    elastic_launch(config, argv[0])(*argv[1:])


def run_agent_process(plan: Plan, watcher: watch.Watcher, outcome: Outcome, nodes=None) -> None:
    """Multi-node: torchelastic's agent in a child process (it unpickles rendezvous data); with
    ``nodes`` (:class:`distlab.Nodes`), one agent on each node, inside its namespaces, as
    ``torchrun`` would be started on each machine: forked from distlab's forkserver where ranks are
    (``start="forkserver"``), else a fresh interpreter (a standby started after the last launch).
    The first agent that fails ends the wait: the others' ranks would otherwise wait in a
    collective for a rank that is gone."""
    folder = plan.folder
    here = [None] if nodes is None else list(range(nodes.n))
    forked = nodes is not None and plan.start == "forkserver" and forklaunch.server_or_warning() is not None
    for node in here:
        agent_plan = plan if node is None else replace(plan, node_rank=node)
        write_private(folder.node_file(folder.agent_plan, node),
                      json.dumps({"plan": agent_plan.to_json(), "kernel_pid": os.getpid()}))
        log_path = folder.node_file(folder.agent_log, node)
        if forked:
            watcher.agents.append(fork_agent(folder, nodes, node, plan.run_id))
            continue
        ready = None if node is None else standby.take(nodes, node)  # started after the last launch here
        if ready is not None and standby.hand(ready, folder.path, node, log_path):
            watcher.agents.append(ready)
            continue
        node_arg = [] if node is None else [str(node)]
        argv = launchmode.python_argv(AGENT_MODULE, str(folder.path), *node_arg)
        if node is not None:
            argv = nodes.command(node, argv)
        with open_private(log_path, "wb") as log:
            watcher.agents.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                                   stderr=subprocess.STDOUT))
    try:
        codes = wait_agents(watcher.agents)
    except KeyboardInterrupt:
        outcome.interrupted = True
        return  # cleanup stops the agents, which stop their workers
    finally:
        if nodes is not None and not forked:
            standby.refill(nodes)  # the next launch here finds its agents started
    for node, code in zip(here, codes, strict=True):
        read_agent_report(folder, node, code, watcher, outcome)


def fork_agent(folder: RunFolder, nodes, node: int, run_id: str):
    """Node ``node``'s agent, forked from distlab's forkserver; it enters the node itself
    (:func:`distlab.launch.agent.run_forked`). Its output goes to the node's agent log."""
    from distlab.forkserver import client as forkserver
    from distlab.forkserver.enter import Entry

    door = nodes.entry(node)
    entry = Entry(door["fds"], os.getcwd(), door["env"])
    open_private(folder.node_file(folder.agent_log, node), "wb").close()
    kernel = {"env": dict(os.environ), "umask": launchmode.current_umask()}
    with forkserver.launching(agents_label(run_id)):
        process = forkserver.get_context().Process(
            target=forkserver.call_by_name, args=(AGENT_MODULE, "run_forked", str(folder.path), node, entry, kernel),
            daemon=True, name=f"distlab-agent-node{node}")
        process.start()
    return forkserver.Forked(process)


def agents_label(run_id: str) -> str:
    """What the forkserver's client files a run's forked agents under (never the run's ranks' id)."""
    return f"agents-{run_id}"


def wait_agents(agents: list, grace_s: float = 3.0, poll_s: float = 0.05) -> list[int | None]:
    """Each agent's exit code, once all have ended, or ``grace_s`` after the first that failed
    (time for the others to report their ranks' failures; None for one still running)."""
    failed_at = None
    while True:
        codes = [agent.poll() for agent in agents]
        if all(code is not None for code in codes):
            return codes
        if failed_at is None and any(code not in (None, 0) for code in codes):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > grace_s:
            return codes
        running = [agent for agent, code in zip(agents, codes, strict=True) if code is None]
        sentinels = [getattr(agent, "sentinel", None) for agent in running]
        if None in sentinels:
            time.sleep(poll_s)
        else:  # forked agents: woken when one ends, not by a clock
            from multiprocessing.connection import wait

            wait(sentinels, poll_s)


def read_agent_report(folder: RunFolder, node: int | None, code: int | None, watcher: watch.Watcher,
                      outcome: Outcome) -> None:
    """Add one agent's report (``agent.json``, plain data) to the run's outcome."""
    path = folder.node_file(folder.agent_json, node)
    report = json.loads(path.read_text()) if path.exists() else {}
    if report.get("status") == "failed":
        on_node = {} if node is None else {"node": node}  # the error names where the rank ran
        outcome.failures = {**(outcome.failures or {}),
                            **{int(r): SimpleNamespace(**f, **on_node) for r, f in report["failures"].items()}}
    elif report.get("status") == "interrupted":
        outcome.interrupted |= report.get("signal") == signal.SIGINT
    elif report.get("status") != "ok" and code is not None and not (watcher.timed_out or watcher.cancelled):
        outcome.error = outcome.error or report.get("error") or agent_exit(folder, node, code)


def agent_exit(folder: RunFolder, node: int | None, code: int) -> str:
    """What an agent that ended without a report says: where it ran, its exit status, the end of
    its log, or that it died before it wrote any (killed as it started: there is no log to show)."""
    where = "" if node is None else f" on node {node}"
    status = f"exited with code {code}" + (f" (killed by {signal_name(-code)})" if code < 0 else "")
    path = folder.node_file(folder.agent_log, node)
    tail = path.read_text(errors="replace")[-3000:] if path.exists() else ""
    if not tail.strip():
        return f"the agent{where} {status} before it wrote anything to its log ({path.name})"
    return f"the agent{where} {status}:\n{tail}"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


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
    node = getattr(failure, "node", None)  # set for a run across distlab.Nodes: where its agent ran
    return WorkerFailedError(rank, code, tb, last, run_dir, result, node=node,
                             local_rank=getattr(failure, "local_rank", None))


def _failure_order(item) -> tuple:
    rank, failure = item
    text = _callstack(failure)
    stopped = failure.exitcode == -signal.SIGTERM  # stopped by torchelastic after another rank failed
    secondary = stopped or any(sign in text for sign in PEER_FAILURE_SIGNS)
    try:
        when = json.loads(Path(failure.error_file).read_text())["message"]["extraInfo"]["time"]
    except Exception:
        when = float(failure.timestamp)  # no error file: died in C code or by a signal (whole seconds)
    # a rank that reported a lost peer says more than one that was only stopped, whose time is truncated
    return (secondary, stopped, when, rank)


def _callstack(failure) -> str:
    if isinstance(failure.message, dict):
        return failure.message.get("extraInfo", {}).get("py_callstack") or failure.message.get("message", "")
    return ""


def lines_before_traceback(log: str) -> list[str]:
    """A rank's output up to its final traceback (the traceback itself is shown separately)."""
    lines = log.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    return lines[:starts[-1]] if starts else lines


class quiet_torchelastic:
    """torchelastic logs every start and failure at WARNING; distlab reports those itself.

    Runs overlap (``join=False``), so the levels are saved by the first run that enters and put
    back by the last one that leaves, whatever the order.
    """

    names = ("torch.distributed.elastic", "torch.distributed.launcher", "torchelastic-events-null",
             "torch.multiprocessing")  # "Terminating process N via signal SIGTERM" after a failure distlab reports
    _lock = threading.Lock()
    _depth = 0
    _saved: dict = {}

    def __enter__(self):
        cls = type(self)
        with cls._lock:
            if cls._depth == 0:
                _events_ask_first()  # imports (and so levels) first: torchelastic sets levels at import
                quiet = self.loggers()
                cls._saved = {n: logging.getLogger(n).level for n in quiet}
                _set_levels(dict.fromkeys(quiet, logging.CRITICAL))
            cls._depth += 1
        return self

    @classmethod
    def loggers(cls) -> set[str]:
        """These names and every logger below them: torchelastic gives each module's logger its own
        level, so quieting the parents alone let "Received 2 death signal, shutting down workers"
        reach the cell. The modules that log during a run are imported first so their loggers exist."""
        import torch.distributed.elastic.rendezvous.static_tcp_rendezvous  # noqa: F401
        import torch.distributed.launcher.api  # noqa: F401

        below = tuple(n + "." for n in cls.names)
        return set(cls.names) | {k for k in list(logging.root.manager.loggerDict) if k.startswith(below)}

    def __exit__(self, *exc):
        cls = type(self)
        with cls._lock:
            cls._depth -= 1
            if cls._depth == 0:
                _set_levels(cls._saved)


def _events_ask_first() -> None:
    """torchelastic's ``events.record`` serialises each event (``dataclasses.asdict`` and JSON, about
    1.5 ms of the kernel's CPU per launch) before its logger drops it, and distlab keeps that logger
    quiet. The replacement asks the logger first; whenever it is enabled, it logs exactly what
    torch's would. Installed once, for every caller (the agent imported ``record`` by name)."""
    from torch.distributed.elastic import events
    from torch.distributed.elastic.agent.server import api as agent_api

    events._get_or_create_logger("null")  # made now: making it sets its level, which is then saved
    if getattr(events.record, "_distlab_asks_first", False):
        return

    def record(event, destination: str = "null") -> None:
        logger = events._get_or_create_logger(destination)
        if logger.isEnabledFor(logging.INFO):
            logger.info(event.serialize())

    record._distlab_asks_first = True
    record.__wrapped__ = events.record
    events.record = agent_api.record = record
    # every event names the host: a reverse lookup each (7 a launch), the same answer every time
    agent_api._get_fq_hostname = functools.lru_cache(maxsize=1)(agent_api._get_fq_hostname)


def _set_levels(levels: dict) -> None:
    """``setLevel`` for each named logger, emptying only the level caches it can change.

    ``setLevel`` empties the cache of every logger in the process (torch makes ~150): 28 calls
    cost a launch ~3 ms of the kernel's CPU, one full flush still ~0.5 ms. A logger's effective
    level depends only on its own and its parents' levels, and ``levels`` names every logger below
    the ones it quiets (``quiet_torchelastic.loggers``): their caches are the only stale ones."""
    loggers = [logging.getLogger(name) for name in levels]
    if not all(isinstance(getattr(lg, "_cache", None), dict) for lg in loggers):
        for name, level in levels.items():  # a logging without per-logger caches: the public way
            logging.getLogger(name).setLevel(level)
        return
    with logging._lock if hasattr(logging, "_lock") else contextlib.nullcontext():
        for lg, level in zip(loggers, levels.values(), strict=True):
            lg.level = level
        for lg in loggers:
            lg._cache.clear()


def _run_logs(folder: RunFolder):
    """torchelastic's LogsSpecs with distlab's layout (defined here: torch is imported lazily)."""
    from torch.distributed.elastic.multiprocessing import LogsDest, LogsSpecs

    class RunLogs(LogsSpecs):
        """Predictable log paths: ``logs/attempt<k>/rank<r>.{out,err,error.json}``, private files."""

        def __init__(self, folder: RunFolder):
            super().__init__(log_dir=str(folder.logs))
            self.folder = folder

        @property
        def root_log_dir(self) -> str:
            return str(self.folder.logs)

        def reify(self, envs):
            attempt = self.folder.make_attempt(envs[0].get("TORCHELASTIC_RESTART_COUNT", "0") if envs else 0)
            dest = LogsDest()
            for local, env in envs.items():
                rank = int(env.get("RANK", local))
                for stream, paths in (("out", dest.stdouts), ("err", dest.stderrs)):
                    paths[local] = str(self.folder.rank_log(attempt, rank, stream))
                    open_private(Path(paths[local])).close()  # 0600 before torchelastic opens it
                dest.error_files[local] = env["TORCHELASTIC_ERROR_FILE"] = str(
                    self.folder.rank_log(attempt, rank, "error.json"))
            return dest

    return RunLogs(folder)
