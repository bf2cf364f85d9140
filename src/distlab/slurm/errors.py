"""Errors of :mod:`distlab.slurm`, with their message templates (tested word for word).

Each says what failed, where (which job, which rank) and what to do next, like
:mod:`distlab.errors`, whose base class they share.
"""
from __future__ import annotations

from distlab.errors import DistlabError, notebook_message

NOT_FOUND = ("distlab.slurm: {what} not found. {hint}")
NO_SLURM_HINT = ("Install Slurm's client commands (Debian/Ubuntu: apt-get install slurm-client; on a cluster: "
                 "`module load slurm`), or start a one-machine cluster with distlab.slurm.local_cluster().")
NO_CONFIG = ("distlab.slurm: no Slurm configuration here (SLURM_CONF is {conf!r}; {defaults} does not exist), and "
             "distlab does not let Slurm ask the network's DNS for a controller (configless mode: the site's record "
             "would decide where your job goes). Set SLURM_CONF to your cluster's slurm.conf, or start a "
             "one-machine cluster with distlab.slurm.local_cluster().")
NO_CONTROLLER = ("distlab.slurm: no Slurm controller answers ({detail}). Check `scontrol ping` and SLURM_CONF "
                 "(now {conf!r}), or start a one-machine cluster with distlab.slurm.local_cluster().")
BAD_OPTION = "distlab.slurm: invalid {name}={value!r}: {problem}. {hint}"
SBATCH_FAILED = "distlab.slurm: sbatch refused the job (exit code {code}): {stderr}\nScript: {script}"
JOB_FAILED = (
    "distlab.slurm: job {job_id} ended {state} (Slurm exit code {exit_code}); rank {rank} failed first "
    "(exit code {rank_exit}).\n--- last lines rank {rank} printed ---\n{last_lines}\n"
    "Run folder (sbatch script and every rank's log): {run_dir}"
)
JOB_ENDED = (
    "distlab.slurm: job {job_id} ended {state} (Slurm exit code {exit_code}){reason}.\n"
    "--- last lines of the batch script's output ---\n{batch_tail}\n"
    "Run folder (sbatch script and every rank's log): {run_dir}"
)
TIMED_OUT = (
    "distlab.slurm: job {job_id} did not finish within timeout={timeout}s of running; it was cancelled "
    "(scancel).\nWhere each rank was when the time ran out:\n{stacks}\n"
    "A rank waiting in a collective usually means another rank never called it. Run folder: {run_dir}"
)
INTERRUPTED = ("distlab.slurm: interrupted; job {job_id} was cancelled (scancel) and has left the queue. "
               "Run folder: {run_dir}")
NOT_OURS = ("distlab.slurm: no run folder of yours holds job {job_id} (looked in {root}). "
            "Reattach from the account and DISTLAB_RUNS that submitted it.")
CLUSTER = "distlab.slurm: cannot start a one-machine cluster: {problem}. {hint}"

class SlurmError(DistlabError, RuntimeError):
    """Base class: something about Slurm went wrong."""


class SlurmNotFoundError(SlurmError, FileNotFoundError):
    """No Slurm commands, no controller, or no such script: nothing was submitted."""


class SlurmArgumentError(SlurmError, ValueError):
    """A bad option (unknown partition, malformed time, ...), refused before sbatch."""

    def __init__(self, name: str, value, problem: str, hint: str = ""):
        self.name = name
        super().__init__(BAD_OPTION.format(name=name, value=value, problem=problem, hint=hint).rstrip())


class SubmitError(SlurmError):
    """sbatch itself refused the job."""


class SlurmJobFailedError(SlurmError):
    """The job ended in a state other than COMPLETED; carries the job's result."""

    def __init__(self, message: str, result=None, rank: int | None = None):
        self.result, self.rank = result, rank
        super().__init__(message)


class SlurmTimeoutError(SlurmError, TimeoutError):
    """The job ran past ``timeout``: cancelled, with each rank's stack where it could be had."""

    def __init__(self, job_id: int, timeout: float, stacks: dict[int, str], run_dir, result=None):
        self.job_id, self.timeout, self.stacks, self.result = job_id, timeout, stacks, result
        text = "\n".join(f"--- rank {r} ---\n{s.rstrip()}" for r, s in sorted(stacks.items()))
        super().__init__(TIMED_OUT.format(job_id=job_id, timeout=timeout, run_dir=run_dir,
                                          stacks=text or "(no rank had started)"))


class SlurmInterrupted(KeyboardInterrupt):
    """Kernel > Interrupt while watching: the job was cancelled. Still a KeyboardInterrupt."""

    def __init__(self, job_id: int, run_dir):
        self.job_id, self.run_dir = job_id, run_dir
        super().__init__(INTERRUPTED.format(job_id=job_id, run_dir=run_dir))

    def _render_traceback_(self) -> list[str]:
        """The message, not distlab's frames (``run_cell_magic``, ``slurm/job.py``) above it."""
        return notebook_message("KeyboardInterrupt", str(self))


class ClusterError(SlurmError):
    """The one-machine cluster could not start (missing packages, not root, a daemon failed)."""

    def __init__(self, problem: str, hint: str):
        super().__init__(CLUSTER.format(problem=problem, hint=hint))
