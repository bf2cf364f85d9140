"""distlab.slurm: submit a notebook function or a script as a Slurm job, and watch it from the cell.

    from distlab import slurm
    cluster = slurm.local_cluster()          # only without a real cluster: one node on this machine
    res = slurm.submit("ddp_train.py", ["--epochs", "1"], ranks_per_node=2)
    res.job_id, res.exit_codes, res.logs[1]

* :func:`submit` writes a readable sbatch script into the private run folder, submits it, streams
  every rank's output live and returns a :class:`SlurmResult` (``join=False``: a :class:`SlurmJob`).
* :func:`attach` finds a job again by id, from another kernel.
* :func:`local_cluster` starts munged + slurmctld + slurmd in a private folder (root only; its daemons listen
  on 127.0.0.1, and its jobs run as its job user, never as root), and for ``sacct`` slurmdbd with a MariaDB
  of its own (:mod:`distlab.slurm.accounting`).
"""
from .cluster import ExistingCluster, LocalCluster, local_cluster
from .commands import JobState
from .errors import (
    ClusterError,
    SlurmArgumentError,
    SlurmError,
    SlurmInterrupted,
    SlurmJobFailedError,
    SlurmNotFoundError,
    SlurmTimeoutError,
    SubmitError,
)
from .job import SlurmJob, SlurmResult, attach
from .submit import submit

__all__ = ["submit", "attach", "local_cluster", "LocalCluster", "ExistingCluster", "SlurmJob", "SlurmResult",
           "JobState", "SlurmError", "SlurmNotFoundError", "SlurmArgumentError", "SubmitError", "SlurmJobFailedError",
           "SlurmTimeoutError", "SlurmInterrupted", "ClusterError"]
