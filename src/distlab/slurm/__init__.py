"""distlab.slurm: submit a notebook function or a script as a Slurm job, and watch it from the cell.

    from distlab import slurm
    cluster = slurm.local_cluster()          # only without a real cluster: one node on this machine
    res = slurm.submit("ddp_train.py", ["--epochs", "1"], ranks_per_node=2)
    res.job_id, res.exit_codes, res.logs[1]

* :func:`submit` writes a readable sbatch script into the private run folder, submits it, streams
  every rank's output live and returns a :class:`SlurmResult` (``join=False``: a :class:`SlurmJob`).
* :func:`attach` finds a job again by id, from another kernel.
* :func:`local_cluster` starts munged + slurmctld + slurmd in a private folder (root only; on this host its
  daemons run in a private network of its own where namespaces can be made, else on 127.0.0.1; its jobs run
  as its job user, never as root), and for ``sacct`` slurmdbd with a MariaDB of its own
  (:mod:`distlab.slurm.accounting`).

Modules, each with the process it runs in:

* ``spec``, ``layout``, ``errors``: what a job is and the sbatch script it becomes; where its files go;
  the errors (pure).
* ``jobstate``, ``clientconf``: what a job's state means and which error it ends in; which ``slurm.conf`` Slurm's
  commands read (pure).
* ``submit``, ``job``, ``tail``, ``commands``: submitting, watching, reading the rank logs, Slurm's commands
  (kernel).
* ``rank``: ``python -m distlab.slurm.rank``: the ranks of a job; ``bound``: ``python -m distlab.slurm.bound``,
  its torchrun or rank with the store bound to the endpoint's address (in the job's tasks, as the job user).
* The one-machine cluster, all in the kernel unless said:

  * ``cluster``: :func:`local_cluster`, :class:`LocalCluster`, :class:`ExistingCluster`, the face.
  * ``slurmconf``, ``accounting``: its ``slurm.conf`` and its slurmdbd and MariaDB (pure, mostly).
  * ``account``: who its jobs run as; the account made for them (and its removal, also in the watchdog).
  * ``door``: the folder the job user alone reaches, and where it may go (``system_tmp``, also in the watchdog).
  * ``jobuser``, ``jobenv``: what the job user needs, and what every job finds (its TaskProlog runs in each task).
  * ``privnet``: the private network its daemons run in on this host.
  * ``login``: the login shims that take Slurm's commands into the cluster's network (the shims run as
    ``sh`` wherever the notebook runs a Slurm command).
  * ``daemons``: a daemon as a process: started with a minimal environment, recorded, waited for.
  * ``starting``: the daemons in order, each ready before the next.
  * ``stopping``: cancel, stop, remove, keep the learner's work (kernel, and the watchdog).
  * ``watchdog``: ``python -m distlab.slurm.watchdog``: stops the cluster when the kernel died (its own process,
    root).

May import: the face (``distlab``), ``api``, ``nodes`` and everything below them; never ``teach``.
"""
from .cluster import ExistingCluster, LocalCluster, local_cluster
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
from .jobstate import JobState
from .submit import submit

__all__ = ["submit", "attach", "local_cluster", "LocalCluster", "ExistingCluster", "SlurmJob", "SlurmResult",
           "JobState", "SlurmError", "SlurmNotFoundError", "SlurmArgumentError", "SubmitError", "SlurmJobFailedError",
           "SlurmTimeoutError", "SlurmInterrupted", "ClusterError"]
