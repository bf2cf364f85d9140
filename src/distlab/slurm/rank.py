"""``python -m distlab.slurm.rank TARGET [ARGS...]``: one rank of a Slurm job started by distlab.slurm.

Run by ``srun`` (one task per rank) or by ``torchrun`` (``-m distlab.slurm.rank``) on a compute
node, with DISTLAB_RUN_DIR naming the job's run folder (on a file system the nodes share). It

1. sets RANK / LOCAL_RANK / WORLD_SIZE / LOCAL_WORLD_SIZE from SLURM_PROCID / SLURM_LOCALID /
   SLURM_NTASKS / the tasks per node, unless a launcher (torchrun) already set them;
2. starts the rank as ``python -m distlab._start`` (distlab's worker runtime: stack dumps on
   SIGUSR1, return values and ``report()`` rows into the run folder, TARGET run as ``__main__``)
   with stdout and stderr going to ``logs/attempt<SLURM_RESTART_COUNT>/rank<RANK>.out`` (0600):
   a requeued job writes a new attempt;
3. waits for it, passing on SIGTERM/SIGINT/SIGHUP, and writes its exit code to ``rank<RANK>.exit``.

Only the standard library and :mod:`distlab.runfolder` are imported: this process stays small.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

from ..runfolder import RunFolder, open_private, write_private
from .layout import exit_file, rank_run_json

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
IGNORED_HERE = (signal.SIGUSR1, signal.SIGUSR2)  # meant for the rank (stack dumps, the job's own handlers)


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


def main(argv: list[str]) -> int:
    os.environ.update(rank_environment(os.environ))
    folder = RunFolder(os.environ["DISTLAB_RUN_DIR"])
    folder.check()
    rank = int(os.environ["RANK"])
    attempt = folder.make_attempt(int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0))
    run = json.loads(folder.run_json.read_text())
    run.update(parent_pid=os.getpid(), single_node=False, run_dir=str(folder.path))
    run_json = rank_run_json(attempt, rank)
    write_private(run_json, json.dumps(run))
    with open_private(RunFolder.rank_log(attempt, rank, "out"), "ab") as out:
        child = subprocess.Popen([sys.executable, "-u", "-m", "distlab._start", str(run_json), *argv],
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    for sig in FORWARDED:
        signal.signal(sig, lambda s, _f: child.poll() is None and child.send_signal(s))
    for sig in IGNORED_HERE:
        signal.signal(sig, lambda s, _f: None)
    code = child.wait()
    write_private(exit_file(attempt, rank), str(code))
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
