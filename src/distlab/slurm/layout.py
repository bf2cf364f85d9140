"""Where distlab.slurm keeps its own files in a run folder (the rest is :class:`~distlab.folders.runfolder.RunFolder`)::

    job.sbatch                        the script sbatch received
    slurm-job.json                    job id, world size, target: what attach() reads
    tmp/                              the job's TMPDIR (torchrun's error files)
    logs/slurm-<job id>.out           the batch script's own output (srun's and Slurm's messages)
    logs/attempt<k>/rank<r>.exit      rank r's exit code in attempt k (k = SLURM_RESTART_COUNT)
    logs/attempt<k>/rank<r>.run.json  rank r's runtime settings in attempt k
"""
from __future__ import annotations

import re
from pathlib import Path

from distlab.folders.runfolder import RunFolder

META = "slurm-job.json"
SBATCH = "job.sbatch"


def exit_file(attempt: Path, rank: int) -> Path:
    return RunFolder.rank_log(attempt, rank, "exit")


def rank_run_json(attempt: Path, rank: int) -> Path:
    return attempt / f"rank{rank}.run.json"


def batch_log(run_dir: Path, job_id: int | str) -> Path:
    return RunFolder(run_dir).logs / f"slurm-{job_id}.out"


def folder_prefix(name: str, stamp: str) -> str:
    """A job folder's name up to its random letters: ``<stamp>-<name>-``, with each character a file
    name should not hold replaced by ``_`` and at most 40 of the name's (``run`` for an empty name)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:40] or "run"
    return f"{stamp}-{safe}-"
