"""The one-machine cluster's job user: who its jobs run as, the account made for them, and its removal.

Jobs never run as root (``DisableRootJobs=YES``): they run as ``local_cluster(user=...)``, else the user who
became root with ``sudo`` (``SUDO_USER``), else :data:`JOB_ACCOUNT`, a dedicated unprivileged account made with
``useradd --system`` if missing and removed with ``userdel`` when the cluster that made it stops (unless another
cluster still uses it).

Runs in the kernel; :func:`remove_account` also in the watchdog (:mod:`distlab.slurm.watchdog`).
"""
from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
import time
from pathlib import Path

from .door import SYSTEM_TMPS, usable_tmp
from .errors import ClusterError

JOB_ACCOUNT = "distlab-job"
ACCOUNT_RECORD = "made-account"  # in the private folder: the job account this cluster created, if it did


def choose_job_user(requested: str | None, environ) -> tuple[str, bool]:
    """(the job user's name, whether distlab may create that account). Pure.

    ``requested`` first; else whoever became root with sudo (``SUDO_USER``: the person at the
    keyboard); else :data:`JOB_ACCOUNT`, an account that exists only to run this cluster's jobs (a
    container or CI where everybody is root: nobody to run them as, and root is refused)."""
    if requested is not None:
        if requested in ("root", "0"):
            raise ClusterError("its jobs would run as root", "Name an unprivileged user: local_cluster(user=...).")
        return requested, False
    sudo = environ.get("SUDO_USER")
    if sudo and sudo != "root":
        return sudo, False
    return JOB_ACCOUNT, True


def account_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def ensure_account(name: str, create: bool) -> pwd.struct_passwd:
    """The account ``name``; :data:`JOB_ACCOUNT` is made if missing (a system account: no home, no
    login shell, its own group, a uid that owns no leftovers). Refuses an account with uid 0."""
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        if not create:
            raise ClusterError(f"its job user {name!r} does not exist", "Create it, or pass another user=.") from None
        from .jobuser import new_account_uid

        uid = str(new_account_uid())  # never one a deleted account's leftovers still name
        made = subprocess.run(["useradd", "--system", "--user-group", "--uid", uid, "--no-create-home",
                               "--shell", "/usr/sbin/nologin", name], capture_output=True, text=True)
        try:
            account = pwd.getpwnam(name)
        except KeyError:
            raise ClusterError(f"could not create its job user {name!r}: {made.stderr.strip()}",
                               "Create an unprivileged account and pass it as user=.") from None
    if account.pw_uid == 0:
        raise ClusterError(f"its job user {name!r} has uid 0", "Name an unprivileged user: local_cluster(user=...).")
    return account


def remove_account(name: str) -> bool:
    """Delete the job account a cluster created (``userdel``), once its files went with the door.

    Kept while another cluster's door still belongs to its group (a second kernel's cluster shares
    the account; the next cluster to stop removes it). An account made for these jobs runs nothing
    else, so what it still runs (an ``srun`` outliving its daemons) is stopped first.
    Returns whether it went."""
    import psutil

    try:
        account = pwd.getpwnam(name)
    except KeyError:
        return False
    if account.pw_uid == 0 or other_doors(account.pw_gid):
        return False
    left = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and account.pw_uid in p.info["uids"]]
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(left, timeout=5)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    deadline = time.monotonic() + 10  # userdel refuses while a zombie of it waits to be reaped (by init)
    while subprocess.run(["userdel", name], capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def other_doors(gid: int, environ=os.environ) -> list[Path]:
    """Doors of running clusters (``distlab-slurm-*`` in every folder a door may go to) whose job user's
    group is ``gid`` (the door's group: a marker, which grants nothing)."""
    places = [p for p in dict.fromkeys([environ.get("TMPDIR") or "", *SYSTEM_TMPS]) if p and usable_tmp(p) is None]
    found = []
    for place in places:
        for path in Path(place).glob("distlab-slurm-*"):
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if st.st_uid == 0 and st.st_gid == gid:
                found.append(path)
    return found
