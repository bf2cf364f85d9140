"""What every job of the one-machine cluster finds, however it was submitted: the notebook's Python,
``torchrun`` and packages on ``PATH``, and a private ``TMPDIR``.

On a real cluster a job sees the software of the login node. On the book's cluster the notebook's
environment may be where the job user cannot go (a virtual environment in root's home, 0700): a batch
script written by hand that calls ``torchrun`` or ``python`` got ``execve(): torchrun: No such file or
directory`` or ``Permission denied``. So the cluster prepares, in its door (which only the job user's
group enters):

* ``env/bin/``: ``python``, ``python3`` and ``torchrun``, small scripts that run the job user's Python
  (:func:`distlab.slurm.jobuser.job_python`: the notebook's own when that user may run it, else the
  system's Python of the same version with the notebook's packages on ``PYTHONPATH``); ``torchrun`` is
  ``python -m torch.distributed.run``, the program the ``torchrun`` command starts;
* ``task-prolog``: Slurm's ``TaskProlog``, which slurmstepd runs as the job user before every task
  (the batch script's too) and whose ``export`` lines it sets in the task's environment. It puts
  ``env/bin`` first on ``PATH``, the packages on ``PYTHONPATH``, and ``TMPDIR`` at ``tmp/job-<id>``
  (the job user's, 0700), as distlab's own jobs have: torchrun's ``torchelastic_*`` folders and
  torch's error files then go where nobody else looks, and they go with the door when the cluster
  stops, never left in the shared temporary directory for whoever gets the job user's uid next.

Pure but for :func:`install`.
"""
from __future__ import annotations

import os
import pwd
import shlex
from pathlib import Path

BIN = "env/bin"
PROLOG = "task-prolog"
TMP = "tmp"

WRAPPER = """#!/bin/sh
# distlab: the notebook's `{name}` for this cluster's jobs (the job user may not enter the notebook's environment)
exec {python} {args}"$@"
"""

TASK_PROLOG = """#!/bin/sh
# distlab: Slurm's TaskProlog. slurmstepd runs it as the job user before each task and sets every
# `export NAME=value` line it prints in the task's environment.
echo "export PATH={bin}:$PATH"
{pythonpath}tmp={tmp}/job-"$SLURM_JOB_ID"
mkdir -p -m 700 "$tmp" && echo "export TMPDIR=$tmp"
"""


def wrappers(python: Path) -> dict[str, str]:
    """name -> the text of each program in ``env/bin`` (pure)."""
    q = shlex.quote(str(python))
    return {"python": WRAPPER.format(name="python", python=q, args=""),
            "python3": WRAPPER.format(name="python3", python=q, args=""),
            "torchrun": WRAPPER.format(name="torchrun", python=q, args="-m torch.distributed.run ")}


def prolog_text(door: Path, import_paths: list[str]) -> str:
    """The TaskProlog (pure). ``import_paths`` go first on the task's PYTHONPATH (none: left as it is)."""
    pythonpath = ""
    if import_paths:
        joined = ":".join(import_paths)
        pythonpath = f'echo "export PYTHONPATH={joined}${{PYTHONPATH:+:$PYTHONPATH}}"\n'
    return TASK_PROLOG.format(bin=door / BIN, tmp=door / TMP, pythonpath=pythonpath)


def import_paths(sites: tuple[str, ...]) -> list[str]:
    """distlab's own folder, then the notebook's packages when the job runs another Python (``sites``)."""
    import distlab

    return list(dict.fromkeys([str(Path(distlab.__file__).resolve().parents[1]), *sites]))


def install(door: Path, account: pwd.struct_passwd) -> Path:
    """Write ``env/bin``, the TaskProlog and ``tmp/`` into ``door``; returns the TaskProlog's path.

    Root's, readable and runnable by the door's group (0750/0710), but ``tmp/``: the job user's (0700)."""
    from .jobuser import job_python

    python, sites = job_python(account)
    os.makedirs(door / BIN, 0o750)
    for folder in (door / "env", door / BIN):
        os.chown(folder, 0, account.pw_gid)
        os.chmod(folder, 0o750)
    for name, text in wrappers(python).items():
        _write(door / BIN / name, text, account.pw_gid)
    _write(door / PROLOG, prolog_text(door, import_paths(sites)), account.pw_gid)
    os.mkdir(door / TMP, 0o700)
    os.chown(door / TMP, account.pw_uid, account.pw_gid)
    return door / PROLOG


def _write(path: Path, text: str, gid: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chown(path, 0, gid)
    os.chmod(path, 0o750)
