"""``submit``: a notebook function or a script file as a Slurm job, checked before anything reaches sbatch.

A function goes through the same capture as :func:`distlab.spawn` (the generated script is written
with :func:`distlab.api.write_script`); a file is run as it is. Either way the run folder gets
``job.sbatch`` (the script ``sbatch`` receives), ``run.json`` (what each rank's runtime needs),
``slurm-job.json`` (for :func:`~distlab.slurm.job.attach`) and, while the job runs, every rank's log.
All of them are 0600 in a 0700 folder; the job itself runs with umask 077.

On distlab's one-machine cluster, run as root, the job runs as the cluster's job user (never root):
the run folder is made in the cluster's ``jobs/`` folder, handed over to that user, and ``sbatch``
runs as that user (see :mod:`distlab.slurm.jobuser`).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import distlab
from distlab import config
from distlab.capture import collect as capture
from distlab.capture import origins
from distlab.folders.private import PRIVATE_DIR, write_private
from distlab.folders.runfolder import SUBFOLDERS, RunFolder

from . import commands, jobuser, spec
from .cluster import current_cluster
from .errors import NOT_FOUND, SlurmNotFoundError
from .job import SlurmJob, save_meta
from .layout import SBATCH, batch_log, folder_prefix


def submit(target, args=(), *, nodes: int = 1, ranks_per_node: int = 1, mode: str = "torchrun",
           gpus_per_node: int = 0, cpus_per_task: int | None = None, time_limit="00:10:00",
           partition: str | None = None, requeue: bool = False, signal: str | None = None, extra=(),
           name: str | None = None, style: str = "spawn", backend: str = "auto", workdir=None,
           join: bool = True, timeout: float | None = None, view="text", root=None):
    """Submit ``target`` (a function, called as ``fn(rank, *args)``; or a script path, run with ``args``
    as its command line) on ``nodes`` x ``ranks_per_node`` ranks; watch it and return its result.

    It writes a readable sbatch script (``job.sbatch``) into a private run folder, submits it, and streams
    the job's state changes and every rank's lines into the cell. Wrong arguments, no Slurm or no
    controller fail before ``sbatch``; Kernel > Interrupt cancels the job. ``gpus_per_node``,
    ``cpus_per_task``, ``time_limit`` and ``partition`` are the job's ``#SBATCH`` request.

    :param mode: ``"torchrun"``: ``srun`` starts one agent per node that starts the node's ranks;
        ``"tasks"``: one Slurm task per rank (RANK etc. from ``SLURM_PROCID``, ...).
    :param requeue: allow ``scontrol requeue`` (a job that checkpoints and resumes).
    :param signal: the warning before the time limit, as ``#SBATCH --signal`` (``"USR1@90"``, ``"B:USR1@90"``).
    :param extra: more ``#SBATCH`` options, as a list of strings.
    :param style: ``"spawn"`` calls ``fn(rank, *args)``; ``"launch"`` calls ``fn(*args)`` with the process
        group initialised (as :func:`distlab.launch`).
    :param join: ``False`` returns the :class:`SlurmJob` at once (``state``, ``logs``, ``cancel()``, ``join()``).
    :param timeout: seconds of running before the job is cancelled with each rank's stack.
    :param root: the runs root (default ``DISTLAB_RUNS`` or distlab's private default); on a real
        cluster it must be on a file system the nodes share.
    :returns: a :class:`SlurmResult`: job id, state, exit codes, logs, return values (functions) and
        ``distlab.report()`` rows; a failed job raises :class:`SlurmJobFailedError` naming the rank that
        failed first.
    """
    __tracebackhide__ = True
    job_spec, prepare = check_job(target, args, nodes, ranks_per_node, mode, gpus_per_node, cpus_per_task,
                               time_limit, partition, requeue, signal, extra, name, style, backend, workdir)
    timeout = config.check_timeout(timeout)
    folder, account = prepare_folder(job_spec, prepare, root, is_file=not callable(target))
    job = _sbatch(folder, job_spec, returns=callable(target), account=account)
    return job.join(timeout=timeout, view=view) if join else job


def prepare_folder(job_spec: spec.JobSpec, prepare, root=None, is_file: bool = False):
    """The job's run folder with its target written, and the account the job runs as (None: whoever
    submits). For distlab's local cluster run by root: the job user's Python, checks that the job user
    reaches the working folder, the script and distlab, and a folder in the cluster's ``jobs/``."""
    account = job_account()
    if account is not None:
        job_spec.python, job_spec.site_paths = jobuser.job_python(account)
        jobuser.check_reachable(account, job_spec.workdir, prepare(None) if is_file else Path("/"),
                                [job_spec.import_path])
        folder = _job_folder(f"slurm-{job_spec.name}", current_cluster().jobs)
    else:
        folder = RunFolder.create(f"slurm-{job_spec.name}", root)
    os.mkdir(folder.path / "tmp", PRIVATE_DIR)
    job_spec.run_dir = folder.path
    job_spec.target = prepare(folder)
    return folder, account


def job_account():
    """The account the job runs as, when distlab's local cluster runs it for root; None: as whoever submits."""
    import pwd

    running = current_cluster()
    return pwd.getpwnam(running.user) if running is not None and os.geteuid() == 0 else None


def _job_folder(name: str, jobs: Path) -> RunFolder:
    """A run folder in the cluster's ``jobs/`` folder (the job user's; handed over once written)."""
    path = Path(tempfile.mkdtemp(prefix=folder_prefix(name, time.strftime("%Y%m%d-%H%M%S")), dir=jobs))
    for sub in SUBFOLDERS:
        os.mkdir(path / sub, PRIVATE_DIR)
    return RunFolder(path)


def check_job(target, args, nodes, ranks_per_node, mode, gpus, cpus, time_limit, partition, requeue, signal,
           extra, name, style, backend, workdir):
    """Every check that can fail, before a file is written: (JobSpec, prepare(folder) -> target path)."""
    job = spec.requested(nodes=nodes, ranks_per_node=ranks_per_node, gpus_per_node=gpus, cpus_per_task=cpus,
                         time_limit=time_limit, mode=mode, requeue=requeue, signal=signal, extra=extra,
                         python=Path(sys.executable), import_path=Path(distlab.__file__).resolve().parents[1],
                         workdir=Path(workdir or os.getcwd()).resolve())
    if callable(target):
        prepare = _function(target, args, job.world_size, style, backend)
        job.name = spec.check_name(name or getattr(target, "__name__", "fn"))
    else:
        prepare, job.target_args = _file(target, args)
        job.name = spec.check_name(name or Path(target).stem)
    commands.ping()  # also: the commands exist
    job.partition = spec.check_partition(partition, commands.partitions() if partition else [])
    return job, prepare


def _function(fn, args, world_size: int, style: str, backend: str):
    """Capture now (a CaptureError names what cannot travel); write the script once the folder exists."""
    from distlab.api import write_script

    spec.check_style(style)
    config.check_function(fn)
    args = config.check_args(args)
    captured = capture.capture(fn, args)

    def prepare(folder: RunFolder) -> Path:
        path = write_script(folder.path, captured, capture.compact(args), world_size, style, backend)
        origins.save(path, getattr(fn, "func", fn).__globals__)
        made = origins.origins_path(path)
        if made.exists():  # origins.save writes with the umask (0644 here): this folder's files are 0600
            os.chmod(made, 0o600)
        return path

    return prepare


def _file(path, args):
    path = Path(path)
    if not path.is_file():
        raise SlurmNotFoundError(NOT_FOUND.format(what=f"the script {str(path)!r}",
                                                  hint="Write it first (e.g. with %%writefile), or fix the path."))
    return (lambda folder: path.resolve()), spec.script_args(args)


def write_files(folder: RunFolder, job: spec.JobSpec) -> Path:
    """Write run.json (what each rank's runtime reads) and job.sbatch; returns the sbatch script's path."""
    write_private(folder.run_json, json.dumps({
        "run_dir": str(folder.path), "parent_pid": 0, "single_node": job.single_node,
        "sys_path": [p for p in sys.path if p], "plain_python": False}))
    script = folder.path / SBATCH
    write_private(script, spec.render(job, script, batch_log(folder.path, "%j")))
    return script


def _sbatch(folder: RunFolder, job: spec.JobSpec, returns: bool, account=None) -> SlurmJob:
    """Write the files, submit (as the job user, when there is one), remember the job id."""
    script = write_files(folder, job)
    submitted = time.time()
    meta = {"world_size": job.world_size, "target": str(job.target), "sbatch": str(script),
            "returns": returns, "submitted": submitted, "slurm_conf": os.environ.get("SLURM_CONF"),
            "mode": job.mode, "uid": os.geteuid() if account is None else account.pw_uid}
    if account is None:
        job_id = commands.sbatch(script)
        meta["job_id"] = job_id
        save_meta(folder, meta)
    else:  # root writes nothing into the folder once the job user has it: the record goes to the cluster's folder
        jobuser.hand_over(folder.path, account)
        env = jobuser.job_environment(os.environ, account, folder.path)
        job_id = commands.sbatch(script, as_user=current_cluster().job_user_args(env))
        meta["job_id"] = job_id
        meta["run_dir"] = str(folder.path)
        jobuser.record(current_cluster().folder, meta)
    print(f"[slurm] submitted job {job_id}: {job.nodes} node(s) x {job.ranks_per_node} rank(s), "
          f"sbatch script {script}", flush=True)
    return SlurmJob(job_id, folder.path, meta)
