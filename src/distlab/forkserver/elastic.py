"""torchelastic with ranks forked from distlab's forkserver: the engine's ``start="forkserver"`` path.

Still ``elastic_launch`` (restarts, error files, stopping survivors, the loopback rendezvous),
with the function entrypoint :func:`distlab.forkserver.rank.run_rank` and distlab's start method in
place of ``python -m distlab.launch.rank``. Two things differ from the fresh-interpreter path, and
are mended here:

* a forked rank's output is written by the rank itself (``RankLogs``), into the same files;
* for a function entrypoint torchelastic reports only the one failed rank it noticed first,
  which need not be the root cause: :func:`add_unreported_failures` adds every other rank that
  failed, so the engine can still name the first failure.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

from distlab.errors import FORKSERVER_REFUSED
from distlab.forkserver.mode import AGENT_VARS, LOG_VARS, current_umask

MONITOR_S = 1e-4  # torchelastic's sleep between looks (must be > 0): the agent waits for its ranks in agent_wait
REFUSAL_HINT = 'A Python >= 3.11.1 (or >= 3.10.9) fixes it; pass start="spawn" to silence this.'
_REFUSAL_SAID: list[str] = []
FALLBACK = ("distlab: could not start the forkserver ({error}); starting fresh interpreters instead "
            '(slower). Pass start="spawn" to choose that and silence this warning.')


def server_or_warning() -> int | None:
    """The running server's pid (started if needed), or None after a warning: a refusal
    (:class:`~distlab.forkserver.client.ForkserverRefused`) is said once per process, a failure to start
    every time it happens."""
    from distlab.forkserver import client as forkserver

    try:
        return forkserver.ensure_server()
    except forkserver.ForkserverRefused as e:
        if not _REFUSAL_SAID:  # the reason cannot change while this process lives: say it once
            _REFUSAL_SAID.append(str(e))
            warnings.warn(FORKSERVER_REFUSED.format(why=e, hint=REFUSAL_HINT), RuntimeWarning, stacklevel=3)
    except Exception as e:
        warnings.warn(FALLBACK.format(error=e), RuntimeWarning, stacklevel=3)
    return None


def run(config, plan, run_json: Path) -> bool:
    """Run the plan's ranks forked from the server; False (after a warning) if it cannot start."""
    from distlab.forkserver import agent_wait
    from distlab.forkserver import client as forkserver

    server_pid = server_or_warning()
    if server_pid is None:
        return False
    forkserver.register()
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from distlab.forkserver.rank import run_rank

    logs = rank_logs(config.logs_specs)
    config.logs_specs, config.start_method, config.monitor_interval = logs, forkserver.START_METHOD, MONITOR_S
    from distlab.forkserver import enter

    # on a node (this is its agent): the node's namespaces travel with every rank's request
    kernel = {"env": dict(os.environ), "server_pid": server_pid, "umask": current_umask(), **enter.passed_on()}
    with forkserver.launching(plan.elastic_run_id) as started, agent_wait.prompt():
        try:
            elastic_launch(config, run_rank)(str(run_json), str(plan.target), list(plan.target_args), kernel)
        except ChildFailedError as e:
            add_unreported_failures(e, started[-plan.nproc:], logs.error_files, logs.global_ranks)
            raise
    return True


def rank_logs(inner):
    """The engine's log layout, with the files opened by each rank (torchelastic leaves a forked
    rank's output alone on macOS) and the names of torchelastic's variables passed along."""
    from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs

    class RankLogs(LogsSpecs):
        def __init__(self):
            super().__init__(log_dir=inner.root_log_dir)
            self.error_files: dict[int, str] = {}  # rank -> error file of the latest attempt
            self.global_ranks: dict[int, int] = {}  # local rank -> rank (they differ on nodes after node 0)

        @property
        def root_log_dir(self) -> str:
            return inner.root_log_dir

        def reify(self, envs):
            dest, mine = inner.reify(envs), LogsDest()
            for local, env in envs.items():
                env[LOG_VARS[0]], env[LOG_VARS[1]] = dest.stdouts[local], dest.stderrs[local]
                env[AGENT_VARS] = ",".join(sorted(env))
                mine.stdouts[local] = mine.stderrs[local] = ""  # "": torchelastic does not redirect
                mine.error_files[local] = dest.error_files[local]
                self.global_ranks[local] = int(env.get("RANK", local))
                self.error_files[self.global_ranks[local]] = dest.error_files[local]
            return mine

    return RankLogs()


def _complete_json(path: str) -> bool:
    """Whether ``path`` holds a whole JSON error file (torchelastic's ProcessFailure parses it)."""
    import json

    try:
        with open(path) as f:
            json.load(f)
    except (OSError, ValueError):
        return False
    return True


def add_unreported_failures(exc, processes: list, error_files: dict[int, str],
                            global_ranks: dict[int, int] | None = None) -> None:
    """Add to ``exc.failures`` every rank of the last attempt that failed but was not reported.

    A rank that wrote an error file failed in Python; one without an error file and a non-zero
    exit code died by a signal or in C code. ``global_ranks``: local rank -> rank (an agent on a
    node after node 0); without it a local rank is the rank (one node).
    """
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from distlab.forkserver import client as forkserver

    for index, proc in enumerate(processes):
        local = forkserver.rank_of(proc, index)
        rank = (global_ranks or {}).get(local, local)
        if rank in exc.failures:
            continue
        path = error_files.get(rank, "")
        if path and not _complete_json(path):
            path = ""  # a rank killed while writing it (gloo aborts): report it by its exit code
        code = proc.exitcode
        if code in (0, None) and not path:
            continue
        exc.failures[rank] = ProcessFailure(local_rank=local, pid=proc.pid, exitcode=code or 1,
                                            error_file=path or "<N/A>")

