"""Slurm's commands, run: sbatch, squeue, scontrol, scancel, sinfo (what their output means: :mod:`.jobstate`).

Every command finds its controller the way a terminal user's does: ``SLURM_CONF`` (set by
:func:`distlab.slurm.local_cluster`) or the system's ``/etc/slurm/slurm.conf``, with one difference:
where neither exists, a Slurm client asks the site's DNS for ``_slurmctld._tcp`` (configless mode)
and would submit wherever that record points; distlab then runs no Slurm command at all, and each
command it runs gets the file it found in ``SLURM_CONF`` (:func:`.clientconf.client_env`).
"""
from __future__ import annotations

import os
import shutil
import subprocess

from .clientconf import client_env
from .errors import NO_CONTROLLER, NO_SLURM_HINT, NOT_FOUND, SBATCH_FAILED, SlurmNotFoundError, SubmitError
from .jobstate import SQUEUE_FORMAT, JobState, controller_state, parse_scontrol, parse_squeue


def run(argv: list[str], timeout: float = 30, check: bool = True, umask: int = -1,
        **kwargs) -> subprocess.CompletedProcess:
    """Run a Slurm command with ``SLURM_CONF`` set (:func:`client_env`); a missing command is a
    :class:`SlurmNotFoundError` naming it."""
    if shutil.which(argv[0]) is None:
        raise SlurmNotFoundError(NOT_FOUND.format(what=f"the Slurm command {argv[0]!r}", hint=NO_SLURM_HINT))
    kwargs["env"] = client_env(kwargs.get("env"))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, umask=umask, **kwargs)
    if check and done.returncode:
        raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
    return done


def ping() -> None:
    """Raise :class:`SlurmNotFoundError` unless a controller answers ``scontrol ping``."""
    done = run(["scontrol", "ping"], check=False, timeout=15)
    if done.returncode or "UP" not in done.stdout:
        detail = (done.stdout + done.stderr).strip().replace("\n", "; ") or f"exit code {done.returncode}"
        raise SlurmNotFoundError(NO_CONTROLLER.format(detail=detail, conf=os.environ.get("SLURM_CONF")))


def partitions() -> list[str]:
    """The cluster's partition names (``sinfo``)."""
    return sorted(set(run(["sinfo", "-h", "-o", "%R"]).stdout.split()))


def sbatch(script, as_user: dict | None = None) -> int:
    """Submit; returns the job id. Run with umask 077: Slurm gives the job the submitter's umask.
    ``as_user``: ``subprocess`` arguments that submit as another account, in the script's folder
    (:meth:`distlab.slurm.cluster.LocalCluster.job_user_args`)."""
    where = {} if as_user is None else {**as_user, "cwd": os.path.dirname(script)}
    done = run(["sbatch", "--parsable", str(script)], check=False, umask=0o077, **where)
    if done.returncode:
        raise SubmitError(SBATCH_FAILED.format(code=done.returncode, stderr=done.stderr.strip(), script=script))
    return int(done.stdout.strip().split(";")[0])


def job_state(job_id: int) -> JobState | None:
    """The job as squeue sees it (all states); scontrol's view once squeue forgot it; None if unknown."""
    done = run(["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", SQUEUE_FORMAT], check=False)
    found = parse_squeue(done.stdout) if done.returncode == 0 else None
    return found or controller_view(job_id)


def controller_view(job_id: int) -> JobState | None:
    """``scontrol show job``: the state and Slurm's exit code (``code:signal``), while the controller remembers."""
    done = run(["scontrol", "show", "job", "-o", str(job_id)], check=False)
    return controller_state(parse_scontrol(done.stdout) if done.returncode == 0 else {})


def controller_fields(job_id: int | str, keys, env: dict) -> dict[str, str] | None:
    """``keys`` of ``scontrol show job -o`` (with ``env``: the cluster's), while the controller remembers the
    job; None once it forgot it (or does not answer)."""
    try:
        done = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], env=env, capture_output=True, text=True,
                              timeout=10)
    except subprocess.TimeoutExpired:
        return None
    fields = parse_scontrol(done.stdout) if done.returncode == 0 else {}
    return {k: fields[k] for k in keys} if all(k in fields for k in keys) else None


def in_queue(job_id: int) -> bool:
    """Still pending, running or completing (what a plain ``squeue`` lists)."""
    done = run(["squeue", "-h", "-j", str(job_id), "-o", "%i"], check=False)
    return done.returncode == 0 and bool(done.stdout.strip())


def scancel(job_id: int, signal: str | None = None) -> None:
    run(["scancel", *([f"--signal={signal}"] if signal else []), str(job_id)], check=False)
