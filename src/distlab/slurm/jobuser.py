"""Jobs of the one-machine cluster run as its job user, never as root: what that user needs, checked
and handed over before ``sbatch``.

The notebook runs as root (the cluster needs root) but a job is the notebook's code: it runs as the
cluster's job user (:func:`distlab.slurm.cluster.choose_job_user`). That user must be able to

* run a Python with torch and distlab: the notebook's own when it may execute it; else (a virtual
  environment whose interpreter lives in root's home, as with pyenv) the system's Python of the
  same version, with the notebook's ``site-packages`` and distlab's folder on ``PYTHONPATH``;
* enter the working folder and read the script (:func:`check_reachable` says so before sbatch,
  with the way out: ``os.chdir(cluster.workdir())``);
* write the run folder: root makes and fills it in the cluster's ``jobs/`` folder (root's, 0711),
  then hands it over to that user (:func:`hand_over`) and writes nothing there afterwards; the
  notebook, as root, reads it back and checks that it is still the job user's alone before it
  unpickles a return value (:func:`check_job_folder`).

What the job user writes, the notebook trusts: that user is you (``SUDO_USER``), one you named, or
an account that runs nothing but this cluster's jobs.
"""
from __future__ import annotations

import functools
import grp
import json
import os
import pwd
import shutil
import site
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

from distlab.errors import RunFolderError

from .errors import SlurmArgumentError

#: what the job gets instead of root's own (root's home and runtime folder are closed to the job user)
# the submitter's own folders, which the job user cannot (and must not) use; the job's own distlab
# chooses its runs root and torch.compile cache again (distlab.folders.compile_cache)
DROPPED = ("XDG_RUNTIME_DIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "DISTLAB_RUNS", "MAIL", "TMPDIR",
           "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def as_user(account: pwd.struct_passwd) -> dict:
    """``subprocess`` arguments that run a command as ``account`` (its group, no supplementary groups)."""
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def job_environment(environ: dict, account: pwd.struct_passwd, run_dir: Path) -> dict[str, str]:
    """The environment ``sbatch`` passes to the job (Slurm exports the submitter's): the job user's
    names, a home it may write (its own, else the run folder), none of root's private folders. Pure."""
    env = {k: v for k, v in environ.items() if k not in DROPPED}
    home = account.pw_dir if account.pw_dir and os.path.isdir(account.pw_dir) and \
        os.stat(account.pw_dir).st_uid == account.pw_uid else str(run_dir)
    env.update(USER=account.pw_name, LOGNAME=account.pw_name, HOME=home)
    return env


def can_run(account: pwd.struct_passwd, argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=60, cwd="/", **as_user(account)).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.lru_cache(maxsize=8)
def job_python(account: pwd.struct_passwd) -> tuple[Path, tuple[str, ...]]:
    """(the Python the job runs, folders to add to its PYTHONPATH). See the module docstring."""
    if can_run(account, [sys.executable, "-c", "pass"]):
        return Path(sys.executable), ()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in python_candidates(version, sys.base_prefix):
        if candidate and can_run(account, [candidate, "-c", "pass"]):
            return Path(candidate), tuple(dict.fromkeys(site.getsitepackages() + [sysconfig.get_path("purelib")]))
    raise SlurmArgumentError("python", sys.executable, f"cannot be run by the job user {account.pw_name!r}",
                             f"Install a Python {version} it can run (e.g. apt-get install python3), or a "
                             "virtual environment outside root's home.")


def python_candidates(version: str, base_prefix: str) -> list[str]:
    """Interpreters of the same version to try, in order (pure)."""
    name = f"python{version}"
    return [str(Path(base_prefix) / "bin" / name), shutil.which(name, path="/usr/local/bin:/usr/bin:/bin"),
            f"/usr/bin/{name}"]


def check_reachable(account: pwd.struct_passwd, workdir: Path, target: Path, import_paths) -> None:
    """Before sbatch: the job user can enter the working folder, read the script and import distlab."""
    probe = 'cd "$1" || exit 3; test -r "$2" || exit 4; shift 2; for p; do test -r "$p" || exit 5; done'
    done = subprocess.run(["sh", "-c", probe, "sh", str(workdir), str(target), *map(str, import_paths)],
                          capture_output=True, cwd="/", **as_user(account))
    here = "Work in a folder that user owns: os.chdir(cluster.workdir()) (scripts, data and checkpoints go there)."
    what = {3: ("workdir", workdir, "cannot be entered by", here), 4: ("target", target, "cannot be read by", here),
            5: ("distlab", [str(p) for p in import_paths], "cannot be read by",
                "Install distlab where that user can read it (a virtual environment outside root's home).")
            }.get(done.returncode)
    if what:
        name, value, problem, hint = what
        raise SlurmArgumentError(name, str(value), f"{problem} the cluster's job user {account.pw_name!r} (jobs "
                                 "never run as root)", hint)


def hand_over(path: Path, account: pwd.struct_passwd) -> None:
    """Give the run folder (everything in it) to the job user; modes stay 0700/0600.

    The folder is root's (0700) until its own owner changes, last: the job user cannot touch anything
    in it while root walks it (no link swapped in under root's feet), and its parent, ``jobs/``, is
    root's. After this, root writes nothing there (:func:`record` keeps the job id elsewhere)."""
    for folder, dirs, files in os.walk(path, topdown=False):
        for name in files + dirs:
            os.lchown(os.path.join(folder, name), account.pw_uid, account.pw_gid)
    os.lchown(path, account.pw_uid, account.pw_gid)


RECORDS = "submitted"  # in the cluster's private folder: one <job id>.json per job submitted as the job user


def record(cluster_folder: Path, meta: dict) -> None:
    """Keep a job's record (what :func:`distlab.slurm.attach` reads) in the cluster's private folder:
    the run folder belongs to the job user, whose files root must not be made to trust for this."""
    from distlab.folders.private import PRIVATE_DIR, write_private

    folder = Path(cluster_folder) / RECORDS
    os.makedirs(folder, PRIVATE_DIR, exist_ok=True)
    write_private(folder / f"{int(meta['job_id'])}.json", json.dumps(meta))


def records(cluster_folder: Path) -> list[Path]:
    return sorted((Path(cluster_folder) / RECORDS).glob("*.json"))


def check_job_folder(path: Path, uid: int) -> None:
    """The run folder of a job still belongs to the job user alone (checked before anything in it is
    unpickled): a directory, not a link, owned by ``uid``, closed to group and others."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        raise RunFolderError(f"distlab.slurm: refusing the job's run folder {path}: it is no longer a private "
                             f"folder of uid {uid} (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}).")


def check_job_file(path: Path, uid: int) -> None:
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_mode & 0o022:
        raise RunFolderError(f"distlab.slurm: refusing {path}: not a file only uid {uid} may write "
                             f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}).")


#: where a job's leftovers of the past would be (torchrun's ``torchelastic_*`` before jobs had their TMPDIR)
SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm")


def leftover_uids(dirs=SHARED_TMP, known: set[int] | None = None) -> set[int]:
    """uids of no account that own an entry at the top of ``dirs``: a deleted job user's files. An account
    made with such a uid would own them, and whatever they hold would be the new account's."""
    known = {a.pw_uid for a in pwd.getpwall()} if known is None else known
    found = set()
    for folder in dirs:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                uid = entry.stat(follow_symlinks=False).st_uid
            except OSError:
                continue
            if uid not in known:
                found.add(uid)
    return found


def system_uid_range(login_defs: str = "/etc/login.defs") -> tuple[int, int]:
    """(SYS_UID_MIN, SYS_UID_MAX) as useradd reads them; Debian's defaults (100, 999) where unset."""
    found = {"SYS_UID_MIN": 100, "SYS_UID_MAX": 999}
    try:
        lines = Path(login_defs).read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0] in found and parts[1].isdigit():
            found[parts[0]] = int(parts[1])
    return found["SYS_UID_MIN"], found["SYS_UID_MAX"]


def fresh_system_uid(taken: set[int], low: int, high: int) -> int:
    """The highest uid from ``high`` down to ``low`` not in ``taken`` (pure); useradd counts down the same way."""
    for uid in range(high, low - 1, -1):
        if uid not in taken:
            return uid
    raise SlurmArgumentError("user", "distlab-job", f"no free system uid from {low} to {high} that owns no "
                             "leftover files", "Remove the leftovers of deleted accounts, or pass user=.")


def new_account_uid() -> int:
    """A uid for a new job account: no account's, no group's (its own group gets the same number) and
    none that owns leftovers in the shared temporary folders (:func:`leftover_uids`)."""
    taken = {a.pw_uid for a in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()} | leftover_uids(SHARED_TMP)
    return fresh_system_uid(taken, *system_uid_range())
