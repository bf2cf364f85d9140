"""A one-machine Slurm cluster for learning and for tests: munged, slurmctld and slurmd on this host.

Everything lives in one private folder (made by :func:`distlab.runfolder.private_root`'s rules:
0700, yours): its own ``slurm.conf`` (every Slurm command finds it through ``SLURM_CONF``), its
own munge key and socket, state, spool, logs and pid files. Nothing in ``/etc`` is read or changed,
and a cluster another program runs on this host is never touched: :meth:`LocalCluster.stop` stops
only the three daemons this object started (checked by pid *and* start time), after cancelling the
jobs they still hold. It runs on ``close()``, at interpreter exit, and from a small watchdog
process when the kernel that started the cluster dies (``kill -9`` included).

Why root: ``slurmd`` starts every job step as the job's user (setuid, setgroups), which only root
may do, and Debian's Slurm expects to run its daemons as root (CI runs as root). As another user,
use a real cluster's login node, or a container where you are root.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..runfolder import PRIVATE_DIR, open_private, private_root, write_private
from .errors import ClusterError
from .slurmconf import (  # noqa: F401  (re-exported: the cluster's configuration)
    PARTITION,
    PROGRAMS,
    config_text,
    free_port,
    install_hint,
    missing_programs,
    node_resources,
    socket_folder,
)

START_TIMEOUT_S = 30.0


@dataclass
class Daemon:
    """One process this cluster started: known by pid *and* start time, so a recycled pid is never hit."""

    name: str
    pid: int
    started: float

    def alive(self) -> bool:
        import psutil

        try:
            p = psutil.Process(self.pid)
            return abs(p.create_time() - self.started) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False


@dataclass
class LocalCluster:
    """The running cluster: ``conf`` (its slurm.conf), ``folder``, ``partition``, ``env`` for Slurm commands."""

    folder: Path
    partition: str = PARTITION
    daemons: list[Daemon] = field(default_factory=list)
    watchdog: subprocess.Popen | None = None
    _old_conf: str | None = None

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def running(self) -> bool:
        return any(d.alive() for d in self.daemons)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running() else "stopped"
        return f"LocalCluster({state}, partition={self.partition!r}, SLURM_CONF='{self.conf}')"

    def stop(self) -> None:
        """Cancel its jobs, stop its daemons, put SLURM_CONF back. Safe to call twice."""
        stop_folder(self.folder)
        if self.watchdog is not None and self.watchdog.poll() is None:
            self.watchdog.terminate()
            self.watchdog.wait(5)
        if os.environ.get("SLURM_CONF") == str(self.conf):
            if self._old_conf is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = self._old_conf
        global _CURRENT
        if _CURRENT is self:
            _CURRENT = None

    close = stop


class ExistingCluster:
    """A controller that already answered (a real cluster, or one another program runs): not ours to stop."""

    def __init__(self, conf: str | None):
        self.conf, self.folder, self.daemons = conf, None, []

    def __repr__(self) -> str:
        return f"ExistingCluster(SLURM_CONF={self.conf!r}: a controller answered; distlab started nothing)"

    def running(self) -> bool:
        return True

    def stop(self) -> None:
        """Nothing to stop: distlab did not start this cluster."""

    close = stop


_CURRENT: LocalCluster | None = None


def controller_answers(timeout: float = 10) -> bool:
    """True when ``scontrol ping`` (with the current SLURM_CONF) reports a controller UP."""
    if shutil.which("scontrol") is None:
        return False
    try:
        done = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and "UP" in done.stdout


def local_cluster(root: Path | None = None, use_existing: bool = True) -> LocalCluster | ExistingCluster:
    """A Slurm cluster to submit to: the one that already answers (``use_existing``), this process's
    running one-machine cluster, or a new one (SLURM_CONF then points at it).

    Raises :class:`~distlab.slurm.errors.ClusterError` naming the packages to install, or why root
    is needed. A cluster started here stops on ``close()``, at exit, or by its watchdog when this
    process dies.
    """
    global _CURRENT
    if _CURRENT is not None and _CURRENT.running():
        return _CURRENT
    if use_existing and controller_answers():
        return ExistingCluster(os.environ.get("SLURM_CONF"))
    check_can_start()
    folder = Path(tempfile.mkdtemp(prefix="slurm-cluster-", dir=private_root(root)))
    cluster = LocalCluster(folder=folder, _old_conf=os.environ.get("SLURM_CONF"))
    try:
        _start(cluster)
    except BaseException:
        stop_folder(folder)
        raise
    os.environ["SLURM_CONF"] = str(cluster.conf)
    atexit.register(cluster.stop)
    _CURRENT = cluster
    return cluster


def check_can_start() -> None:
    missing = missing_programs()
    if missing:
        raise ClusterError(f"these programs are missing: {', '.join(sorted(missing))}", install_hint(missing))
    if os.geteuid() != 0:
        raise ClusterError(
            "it needs root (slurmd starts every job step as the job's user, which only root may do)",
            "Run as root (as CI does, or in a container), or use a real cluster's login node.")


def _start(cluster: LocalCluster) -> None:
    folder = cluster.folder
    for sub in ("run", "spool", "state", "log", "munge"):
        os.mkdir(folder / sub, PRIVATE_DIR)
    # The socket's folder stays 0700: nobody else can ask this munged for a credential, so nobody else can
    # talk to this cluster's daemons (munged warns that others cannot reach it; --force: that is the point).
    sock = socket_folder(folder) / "munge.sock"
    cpus, memory = node_resources()
    import pwd

    user = pwd.getpwuid(os.geteuid()).pw_name
    write_private(cluster.conf, config_text(folder, socket.gethostname().split(".")[0], free_port(), free_port(),
                                            user, cpus, memory, sock))
    _run(["mungekey", "--create", "--keyfile", str(folder / "munge" / "munge.key")], folder)
    cluster.daemons.append(_daemon(cluster, "munged", [
        "munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={folder}/munge/munge.key",
        f"--log-file={folder}/log/munged.log", f"--pid-file={folder}/run/munged.pid",
        f"--seed-file={folder}/munge/seed"]))
    _wait(lambda: sock.exists(), "munged did not create its socket", folder / "log" / "munged.stdout")
    cluster.daemons.append(_daemon(cluster, "slurmctld", ["slurmctld", "-D", "-i"]))
    _wait(lambda: _ok(["scontrol", "ping"], cluster.env, b"UP"), "slurmctld did not answer",
          folder / "log" / "slurmctld.log")
    cluster.daemons.append(_daemon(cluster, "slurmd", ["slurmd", "-D"]))
    _wait(lambda: _ok(["sinfo", "-h", "-o", "%t"], cluster.env, b"idle"), "slurmd's node did not become idle",
          folder / "log" / "slurmd.log")
    with open_private(folder / "log" / "watchdog.log", "ab") as log:
        cluster.watchdog = subprocess.Popen(
            [sys.executable, "-m", "distlab.slurm.watchdog", str(os.getpid()), repr(_own_start_time()), str(folder)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)


def _own_start_time() -> float:
    import psutil

    return psutil.Process().create_time()


def _daemon(cluster: LocalCluster, name: str, argv: list[str]) -> Daemon:
    import psutil

    with open_private(cluster.folder / "log" / f"{name}.stdout", "ab") as log:
        p = subprocess.Popen(argv, env=cluster.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True, cwd=cluster.folder)
    d = Daemon(name, p.pid, psutil.Process(p.pid).create_time())
    _save(cluster.folder, cluster.daemons + [d])
    return d


def _save(folder: Path, daemons: list[Daemon]) -> None:
    write_private(folder / "daemons.json", json.dumps([d.__dict__ for d in daemons]))


def _run(argv: list[str], folder: Path) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, cwd=folder)
    if done.returncode:
        raise ClusterError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}", "See the message above.")


def _ok(argv: list[str], env: dict, needle: bytes) -> bool:
    try:
        done = subprocess.run(argv, env=env, capture_output=True, timeout=5)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and needle in done.stdout


def _wait(ready, problem: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace").splitlines()[-8:] if log.exists() else []
            raise ClusterError(f"{problem} within {START_TIMEOUT_S:.0f} s", "Its log ends:\n" + "\n".join(tail))
        time.sleep(0.05)


def stop_folder(folder: Path, grace_s: float = 10.0) -> None:
    """Cancel the cluster's jobs, stop the daemons listed in its ``daemons.json`` (newest first), and
    remove the folder once none of them runs (the runs root is never pruned of cluster folders)."""
    import psutil

    path = Path(folder) / "daemons.json"
    if not path.exists():
        return
    daemons = [Daemon(**d) for d in json.loads(path.read_text())]
    env = {**os.environ, "SLURM_CONF": str(Path(folder) / "slurm.conf")}
    if any(d.name == "slurmctld" and d.alive() for d in daemons):
        _cancel_all(env, grace_s)
    for d in reversed(daemons):
        if not d.alive():
            continue
        p = psutil.Process(d.pid)
        p.terminate()
        try:
            p.wait(grace_s)
        except psutil.TimeoutExpired:
            p.kill()
            p.wait(grace_s)
    if any(d.alive() for d in daemons):
        _save(Path(folder), [d for d in daemons if d.alive()])  # kept, with its logs, for a second try
        return
    elsewhere = Path(folder) / "munge-socket-folder"
    if elsewhere.exists():
        made = Path(elsewhere.read_text())
        if made.name.startswith("distlab-munge-"):
            shutil.rmtree(made, ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)  # nothing left running: the folder goes too


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
