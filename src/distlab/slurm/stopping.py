"""Stopping the one-machine cluster: its jobs cancelled, its daemons stopped, its files gone, the learner's
work kept.

Everything here works from the cluster's private folder alone (``daemons.json``, the door's and the
database folder's records), so it runs in the kernel (``LocalCluster.stop()``, at exit) and in the watchdog
(:mod:`distlab.slurm.watchdog`, a root process of its own) when the kernel died.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from . import accounting as acct
from . import login
from .account import ACCOUNT_RECORD, remove_account
from .daemons import Daemon, load, save
from .door import DOOR_RECORD

WORK_RECORD = "workdirs"  # in the private folder: the names of the work folders workdir() made in jobs/
#: who stops first: the nodes' daemons, the controller (it hands slurmdbd what it still holds), slurmdbd,
#: MariaDB, munged (which every other one asks until it ends)
#: (by the name before any ``-``: ``slurmd-node1``, ``mariadb-install-db``)
STOP_FIRST = ("slurmd", "slurmctld", "slurmdbd", "mariadbd", "mariadb", "munged")


def stop_folder(folder: Path, grace_s: float = 10.0) -> None:
    """Cancel the cluster's jobs, stop the daemons listed in its ``daemons.json`` (newest first), and
    remove the folder once none of them runs (the runs root is never pruned of cluster folders)."""
    if not (Path(folder) / "daemons.json").exists():
        return
    daemons = load(folder)
    record = Path(folder) / DOOR_RECORD
    conf = Path(record.read_text()) / "slurm.conf" if record.exists() else Path(folder) / "slurm.conf"
    env = {**os.environ, "SLURM_CONF": str(conf)}
    if (Path(folder) / "bin").is_dir():  # behind a login door: the commands run in the cluster's network
        env["PATH"] = login.with_bin_first(env, Path(folder) / "bin")
    if any(d.name == "slurmctld" and d.alive() for d in daemons):
        _cancel_all(env, grace_s)
    for d in stop_order(daemons):
        stop_daemon(d, grace_s)
    if any(d.alive() for d in daemons):
        save(Path(folder), [d for d in daemons if d.alive()])  # kept, with its logs, for a second try
        return
    if record.exists():
        door = Path(record.read_text())
        if door.name.startswith("distlab-slurm-") and os.stat(door).st_uid == 0:
            keep_work(Path(folder), door)
            shutil.rmtree(door, ignore_errors=True)  # the jobs' run folders go with it
    acct.remove_db_folder(Path(folder))
    made = Path(folder) / ACCOUNT_RECORD
    if made.exists():
        remove_account(made.read_text().strip())
    shutil.rmtree(folder, ignore_errors=True)  # nothing left running: the folder goes too


def stop_daemon(d: Daemon, grace_s: float) -> None:
    import psutil

    if not d.alive():
        return
    p = psutil.Process(d.pid)
    if d.group:  # its own session (start_new_session): the script and what it started
        with contextlib.suppress(ProcessLookupError):
            os.killpg(d.pid, signal.SIGTERM)
    p.terminate()
    try:
        p.wait(grace_s)
    except psutil.TimeoutExpired:
        p.kill()
        p.wait(grace_s)


def stop_order(daemons: list[Daemon]) -> list[Daemon]:
    """``daemons`` in the order to stop them: by :data:`STOP_FIRST`, newest first among equals. Pure."""
    def rank(d: Daemon) -> int:
        kind = d.name.split("-")[0]
        return STOP_FIRST.index(kind) if kind in STOP_FIRST else len(STOP_FIRST)

    return sorted(reversed(daemons), key=rank)


def keep_work(folder: Path, door: Path) -> Path | None:
    """Move the learner's work folders (:meth:`LocalCluster.workdir`: scripts, job output, checkpoints) out
    of the door before it goes, into ``slurm-work-*`` next to the cluster's folder (the notebook user's
    runs root, 0700), and make them the notebook user's: the job user may be deleted next, and a file of
    a deleted account belongs to whoever gets its uid. Prints where they stay; returns it (None: none)."""
    record = folder / WORK_RECORD
    names = [n for n in record.read_text().split() if n] if record.exists() else []
    found = [door / "jobs" / n for n in names if os.path.isdir(door / "jobs" / n)
             and not os.path.islink(door / "jobs" / n)]
    if not found:
        return None
    kept = Path(tempfile.mkdtemp(prefix="slurm-work-", dir=folder.parent))
    for work in found:
        shutil.move(str(work), str(kept / work.name))  # a rename (same file system), else a copy of links as links
    for where, dirs, files in os.walk(kept, topdown=False):
        for name in files + dirs:
            os.lchown(os.path.join(where, name), os.getuid(), os.getgid())
    print(f"distlab.slurm: the cluster stopped; its jobs' work folders stay in {kept}: "
          f"{', '.join(sorted(w.name for w in found))}", flush=True)
    return kept


def _cancel_all(env: dict, grace_s: float) -> None:
    """scancel every job of this cluster and wait (up to ``grace_s``) until none is left running."""
    try:
        jobs = subprocess.run(["squeue", "-h", "-o", "%A"], env=env, capture_output=True, text=True, timeout=5)
        ids = jobs.stdout.split()
        if ids:
            subprocess.run(["scancel", *ids], env=env, capture_output=True, timeout=5)
        deadline = time.monotonic() + grace_s
        while ids and time.monotonic() < deadline:
            left = subprocess.run(["squeue", "-h", "-o", "%A"], env=env, capture_output=True, text=True, timeout=5)
            if not left.stdout.split():
                break
            time.sleep(0.1)
    except (subprocess.TimeoutExpired, OSError):
        pass
