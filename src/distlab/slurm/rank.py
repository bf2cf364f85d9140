"""``python -m distlab.slurm.rank [--nproc-per-node N] TARGET [ARGS...]``: the ranks of a Slurm job started by
distlab.slurm.

Run by ``srun`` (one task per rank), by ``torchrun`` (``-m distlab.slurm.rank``, jobs on several
nodes) or, with ``--nproc-per-node N``, as the node's agent of a one-node ``mode="torchrun"`` job
(it starts the node's N ranks itself, as torchrun would, but with no TCP store: see
:mod:`distlab.slurm.spec`). DISTLAB_RUN_DIR names the job's run folder (on a file system the nodes
share). For each rank it

1. sets RANK / LOCAL_RANK / WORLD_SIZE / LOCAL_WORLD_SIZE from SLURM_PROCID / SLURM_LOCALID /
   SLURM_NTASKS / the tasks per node, unless a launcher (torchrun) already set them (the agent
   numbers its own ranks);
2. on one node, points MASTER_ADDR/MASTER_PORT at distlab's placeholder, so that every
   ``init_process_group`` meets the other ranks in a ``FileStore`` of the run folder (one per
   Slurm attempt: TORCHELASTIC_RESTART_COUNT is the attempt's SLURM_RESTART_COUNT), never a port;
3. gives the rank a private temporary folder (``TMPDIR``, hence ``tempfile``: torch's
   ``pytorch-errorfile-*.pickle`` is read back by its launcher, so it must never sit in a shared
   ``/tmp``): ``tmp/attempt<k>-rank<r>`` in the run folder, 0700;
4. starts the rank as ``python -m distlab.launch.rank`` (distlab's worker runtime: stack dumps on
   SIGUSR1 or SIGWINCH, return values and ``report()`` rows into the run folder, TARGET run as ``__main__``;
   on several nodes through :mod:`distlab.slurm.bound`, rank 0's store bound to MASTER_ADDR's address)
   with stdout and stderr going to ``logs/attempt<SLURM_RESTART_COUNT>/rank<RANK>.out`` (0600):
   a requeued job writes a new attempt;
5. waits for it, passing on SIGTERM/SIGINT/SIGHUP (SIGUSR1/SIGUSR2 reach the ranks from Slurm; one that came
   before the ranks existed is passed on once, :mod:`distlab.slurm.early_warning`), and writes its
   exit code to ``rank<RANK>.exit``. The agent stops the node's other ranks once one fails.

Only the standard library and :mod:`distlab.folders.runfolder` are imported: this process stays small.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

from distlab.folders.private import PRIVATE_DIR, open_private, write_private
from distlab.folders.runfolder import RunFolder
from distlab.forkserver import mode as launchmode

from . import early_warning
from .layout import exit_file, rank_run_json

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: meant for the ranks (the job's own handlers, e.g. ``--signal=USR1@90``), which Slurm signals themselves:
#: it signals every process of a step. Passed on as well, a rank would get them twice; not blocked,
#: this process would die of them and take its ranks along.
IGNORED_HERE = (signal.SIGUSR1, signal.SIGUSR2)
PLACEHOLDER_PORT = "1"  # distlab.rendezvous.loopback.PLACEHOLDER_PORT: nothing listens (not imported: stays small)
STOP_GRACE_S = 5.0


def tasks_on_node(value: str, node: int = 0) -> int:
    """Slurm's ``SLURM_STEP_TASKS_PER_NODE`` (``"2"``, ``"2(x3),1"``) -> the count on node ``node``."""
    counts = []
    for part in value.split(","):
        m = re.match(r"^(\d+)(?:\(x(\d+)\))?$", part.strip())
        if not m:
            raise ValueError(f"cannot read tasks per node from {value!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[min(node, len(counts) - 1)]


def rank_environment(env: dict) -> dict[str, str]:
    """What to add to the environment: torch's names from Slurm's (nothing when RANK is set)."""
    if "RANK" in env:
        return {}
    tasks = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "1"
    return {"RANK": env.get("SLURM_PROCID", "0"), "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
            "WORLD_SIZE": env.get("SLURM_NTASKS", env.get("SLURM_NPROCS", "1")),
            "LOCAL_WORLD_SIZE": str(tasks_on_node(tasks, int(env.get("SLURM_NODEID", "0"))))}


def agent_environment(local_rank: int, nproc: int) -> dict[str, str]:
    """What the one-node agent gives its rank ``local_rank`` of ``nproc`` (torchrun's names; the node is
    the whole job, so the local rank is the rank)."""
    return {"RANK": str(local_rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "ROLE_RANK": str(local_rank),
            "ROLE_WORLD_SIZE": str(nproc)}


def single_node_environment(attempt: int) -> dict[str, str]:
    """A one-node rank's rendezvous: the placeholder address (the worker runtime turns it into a FileStore
    in the run folder), one store per Slurm attempt (a requeued job never reads an old attempt's keys)."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": PLACEHOLDER_PORT, "TORCHELASTIC_RESTART_COUNT": str(attempt)}


def parse_args(argv: list[str]) -> tuple[int | None, list[str]]:
    """``[--nproc-per-node N] TARGET ARGS`` -> (N or None, [TARGET, *ARGS])."""
    if argv[:1] == ["--nproc-per-node"]:
        n = int(argv[1])
        if n < 1:
            raise ValueError(f"--nproc-per-node must be >= 1, not {n}")
        return n, argv[2:]
    return None, argv


def private_tmp(folder: RunFolder, attempt: int, rank: int) -> str:
    """The rank's own temporary folder in the run folder (0700; made again if a requeue finds it)."""
    tmp = folder.path / "tmp"
    os.makedirs(tmp, PRIVATE_DIR, exist_ok=True)
    mine = tmp / f"attempt{attempt}-rank{rank}"
    os.makedirs(mine, PRIVATE_DIR, exist_ok=True)
    return str(mine)


def start_rank(folder: RunFolder, attempt_dir, attempt: int, run: dict, env: dict, argv: list[str]):
    """Start one rank (``python -m distlab.launch.rank``) with its log, run.json and private TMPDIR."""
    rank = int(env["RANK"])
    run = {**run, "parent_pid": os.getpid(), "run_dir": str(folder.path)}
    run_json = rank_run_json(attempt_dir, rank)
    write_private(run_json, json.dumps(run))
    tmp = private_tmp(folder, attempt, rank)
    env = {**env, "TMPDIR": tmp}
    with open_private(RunFolder.rank_log(attempt_dir, rank, "out"), "ab") as out:
        return subprocess.Popen(launchmode.python_argv(*start_module(run), str(run_json), *argv),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)


def start_module(run: dict) -> list[str]:
    """How a rank starts: ``distlab.launch.rank``; on several nodes through :mod:`distlab.slurm.bound`, so that
    rank 0's ``env://`` store listens on MASTER_ADDR's address only, not on every interface."""
    return ["distlab.launch.rank"] if run.get("single_node") else ["distlab.slurm.bound", "start"]


def exit_status(code: int) -> int:
    """A child's return code as a shell would report it (killed by signal N -> 128 + N)."""
    return code if code >= 0 else 128 - code


def main(argv: list[str]) -> int:
    nproc, argv = parse_args(argv)
    folder = RunFolder(os.environ["DISTLAB_RUN_DIR"])
    folder.check()
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    attempt_dir = folder.make_attempt(attempt)
    run = json.loads(folder.run_json.read_text())
    base = dict(os.environ)
    if run.get("single_node"):
        base.update(single_node_environment(attempt))
    if nproc is None:
        ranks = [base | rank_environment(base)]
    else:
        ranks = [base | agent_environment(i, nproc) for i in range(nproc)]
    # The ranks start with the warning signals held (blocked, so pending, not lost): the worker runtime
    # delivers them once the job's own code has a handler (distlab.worker.release_on_handler); a warning
    # that came while a rank still imported torch killed it.
    signal.pthread_sigmask(signal.SIG_BLOCK, IGNORED_HERE)
    # They stay blocked here for this process's whole life: it has no use for them, and a handler would not
    # do (Python resets it at exit, when a late warning would then kill this process and fail the step).
    children = {int(env["RANK"]): start_rank(folder, attempt_dir, attempt, run, env, argv) for env in ranks}
    # a warning that came before they existed is pending here, not in them: theirs now (distlab.slurm.early_warning)
    early_warning.pass_on([c.pid for c in children.values()], IGNORED_HERE)
    for sig in FORWARDED:
        signal.signal(sig, lambda s, _f: [c.send_signal(s) for c in children.values() if c.poll() is None])
    codes = wait_all(children, lambda rank, code: write_private(exit_file(attempt_dir, rank), str(code)))
    first = next((c for c in codes if c != 0), 0)
    return exit_status(first)


def wait_all(children: dict, on_exit) -> list[int]:
    """Wait for every rank; once one fails, stop the others (SIGTERM, then SIGKILL after a grace), as
    torchrun does. Returns the exit codes in the order the ranks ended."""
    left, codes, stop_at = dict(children), [], None
    while left:
        for rank, child in list(left.items()):
            code = child.poll()
            if code is None:
                continue
            del left[rank]
            on_exit(rank, code)
            codes.append(code)
            if code != 0 and stop_at is None:
                stop_at = time.monotonic() + STOP_GRACE_S
                for other in left.values():
                    other.terminate()
        if stop_at is not None and time.monotonic() > stop_at:
            for other in left.values():
                other.kill()
        if left:
            time.sleep(0.02)
    return codes


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
