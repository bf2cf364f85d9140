"""A fresh ordinary Linux account, a learner, with the environment such a user really has.

The suite runs as root (as CI does). :func:`fresh_learner` makes a new account with its own home
(``useradd --create-home``) and removes it at the end with everything it still runs and the files
it left in the shared temporary folders, also when the test fails. :func:`run_as` runs a program
as that user with Debian's default user environment: ``env -i``, its ``HOME``, and ``PATH`` as
``/etc/login.defs`` gives it (no ``/usr/sbin``, no virtual environment on it).

The learner needs this test run's Python (the repository's ``.venv`` and the interpreter it is
made from), which may sit under a folder only root may enter (``/root``). So each command runs in
a mount namespace of its own (``unshare --mount --propagation private``), where a small tmpfs
covers that folder and only the interpreter's and the venv's folders are bound back at their own
paths: the learner sees them where they are, and nothing else of root's. The namespace, and its
mounts, end with the command. distlab itself comes from a copy in the learner's home
(``PYTHONPATH``), as if the learner had installed it: the checkout may be as closed as the venv.
"""
from __future__ import annotations

import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"  # Debian's ENV_PATH for users
PREFIX = "dl-learner-"  # + the pid of the test process that made it
SHARED_TEMP = ("/tmp", "/var/tmp", "/dev/shm")


@dataclass(frozen=True)
class Learner:
    name: str
    uid: int
    gid: int
    home: Path


@contextmanager
def fresh_learner():
    """A new account with its own home; removed afterwards with all it runs and left behind."""
    remove_stale_learners()
    name = f"{PREFIX}{os.getpid()}"
    made = subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--user-group", name],
                          capture_output=True, text=True)
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        raise AssertionError(f"could not create a learner account: {made.stderr}") from None
    try:
        yield Learner(name, account.pw_uid, account.pw_gid, Path(account.pw_dir))
    finally:
        remove_learner(name, account.pw_uid)


def remove_learner(name: str, uid: int) -> None:
    """End the account's processes (by pid), delete it with its home, and its files in the shared
    temporary folders (a fresh uid: what it owns there is what this test's learner left)."""
    end_processes(uid)
    subprocess.run(["userdel", "--remove", name], capture_output=True)
    for folder in SHARED_TEMP:
        for entry in _entries(folder):
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                continue


def end_processes(uid: int, timeout: float = 30) -> None:
    """SIGKILL every process of ``uid`` until none is left (nodes' holders, ranks, a kernel)."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
        if not left:
            return
        assert time.monotonic() < deadline, f"processes of the learner would not end: {[p.pid for p in left]}"
        for proc in left:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def remove_stale_learners() -> None:
    """Accounts a killed test run left (its pid is gone)."""
    for account in pwd.getpwall():
        pid = account.pw_name[len(PREFIX):]
        if account.pw_name.startswith(PREFIX) and pid.isdigit() and not psutil.pid_exists(int(pid)):
            remove_learner(account.pw_name, account.pw_uid)


def _entries(folder: str) -> list:
    try:
        with os.scandir(folder) as it:
            return list(it)
    except OSError:
        return []


def give(learner: Learner, sources: dict[str, Path]) -> Path:
    """Copy each source (file or folder) to ``~/distlab/<name>``, owned by the learner: its copy."""
    dest = learner.home / "distlab"
    dest.mkdir(exist_ok=True)
    for name, source in sources.items():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pt"))
        else:
            shutil.copy(source, target)
    for path in [dest, *dest.rglob("*")]:
        os.chown(path, learner.uid, learner.gid, follow_symlinks=False)
    return dest


def closed_at(path: Path) -> Path | None:
    """The highest folder on the way to ``path`` that other users may not enter, or None."""
    for folder in reversed([path, *path.parents]):
        if not os.stat(folder).st_mode & 0o001:
            return folder
    return None


def reach_script(paths: list[Path], stage: Path) -> str:
    """Shell lines (run as root in a private mount namespace) that make ``paths`` reachable for
    everyone at their own paths: a tmpfs over each closed folder above them, the paths bound back."""
    lines, covers = ["set -e", "umask 022"], {}
    for k, path in enumerate(paths):
        closed = closed_at(path)
        if closed is not None:
            lines.append(f"mkdir -p {stage}/{k} && mount --bind {shlex.quote(str(path))} {stage}/{k}")
            covers.setdefault(closed, []).append((k, path))
    for closed, bound in covers.items():
        lines.append(f"mount -t tmpfs -o mode=0755,size=1m distlab-learner {shlex.quote(str(closed))}")
        lines += [f"mkdir -p {shlex.quote(str(p))} && mount --bind {stage}/{k} {shlex.quote(str(p))}"
                  for k, p in bound]
    return "\n".join(lines)


def python_paths() -> list[Path]:
    """This run's interpreter: the venv and the Python it was made from."""
    return sorted({Path(os.path.realpath(sys.prefix)), Path(os.path.realpath(sys.base_prefix))})


def run_as(learner: Learner, argv: list[str], timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` as the learner, with its default environment and this run's Python reachable."""
    env = {"HOME": str(learner.home), "USER": learner.name, "LOGNAME": learner.name, "SHELL": "/bin/bash",
           "PATH": DEFAULT_PATH, "LANG": "C.UTF-8", "PYTHONPATH": str(learner.home / "distlab" / "src")}
    stage = Path(tempfile.mkdtemp(prefix="distlab-learner-stage-"))
    script = reach_script(python_paths(), stage) + '\nexec runuser -u "$0" -- env -i "$@"'
    command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, learner.name,
               *(f"{k}={v}" for k, v in env.items()), *argv]
    try:
        done = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=timeout,
                              cwd=cwd or learner.home)
        done.left_behind = left_behind(learner.uid)
        return done
    finally:
        end_processes(learner.uid)  # also after a timeout: nothing of the learner outlives its command
        shutil.rmtree(stage, ignore_errors=True)


def left_behind(uid: int, grace_s: float = 10) -> list[str]:
    """The command lines of ``uid``'s processes still running ``grace_s`` after its command ended
    (a holder or agent gets that long to see its pipe close); what distlab should not leave."""
    deadline = time.monotonic() + grace_s
    while True:
        left = []
        for proc in psutil.process_iter(["uids", "cmdline", "status"]):
            if proc.info["uids"] and proc.info["uids"].real == uid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                left.append(" ".join(proc.info["cmdline"] or [])[:200])
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
