"""The one-machine cluster's daemons as processes: started, recorded, waited for.

Each daemon (munged, MariaDB, slurmdbd, slurmctld, slurmd) is started in a session of its own with a
*minimal environment* (:func:`daemon_env`: a system ``PATH`` and the cluster's ``SLURM_CONF``), never the
notebook's: a token in the notebook's environment would otherwise be readable in ``/proc/<pid>/environ`` by
whoever the daemon runs as (MariaDB runs as ``mysql``). It is known by pid *and* start time (a recycled pid
is never hit) and recorded at once in the private folder's ``daemons.json``, which the watchdog reads.

Where the daemons listen on this host's own loopback (a container that refuses namespaces: see
:mod:`distlab.slurm.privnet`), a port picked free may be taken by another user before the daemon binds it;
so nothing is sent to a port (no readiness probe, which carries root's munge credential) before
:func:`who_listens` finds that the daemon just started is the one listening there.

Runs in the kernel (the records also in the watchdog, :mod:`distlab.slurm.stopping`).
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from distlab.folders.private import open_private, write_private

from .errors import ClusterError

START_TIMEOUT_S = 30.0
#: the only PATH a daemon gets (Debian keeps the daemons in /usr/sbin)
DAEMON_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class Daemon:
    """One process this cluster started: known by pid *and* start time, so a recycled pid is never hit."""

    name: str
    pid: int
    started: float
    group: bool = False  # stopped with its whole process group (a script that runs others: mariadb-install-db)

    def alive(self) -> bool:
        import psutil

        try:
            p = psutil.Process(self.pid)
            return abs(p.create_time() - self.started) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False


def daemon_env(conf: Path) -> dict[str, str]:
    """Everything a daemon's environment holds (pure): a system PATH and its cluster's slurm.conf."""
    return {"PATH": DAEMON_PATH, "SLURM_CONF": str(conf)}


def start(folder: Path, daemons: list[Daemon], name: str, argv: list[str], env: dict, group: bool = False) -> Daemon:
    """Start daemon ``name`` (output to ``log/<name>.stdout``) and add it to ``daemons`` and to
    ``daemons.json`` at once."""
    import psutil

    with open_private(folder / "log" / f"{name}.stdout", "ab") as log:
        p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True, cwd=folder)
    d = Daemon(name, p.pid, psutil.Process(p.pid).create_time(), group)
    daemons.append(d)
    save(folder, daemons)
    return d


def forget(folder: Path, daemons: list[Daemon], d: Daemon) -> None:
    daemons.remove(d)
    save(folder, daemons)


def save(folder: Path, daemons: list[Daemon]) -> None:
    write_private(folder / "daemons.json", json.dumps([d.__dict__ for d in daemons]))


def load(folder: Path) -> list[Daemon]:
    return [Daemon(**d) for d in json.loads((Path(folder) / "daemons.json").read_text())]


def wait(ready, problem: str, log: Path, alive=None) -> bool:
    """Wait until ``ready()`` (True); False as soon as ``alive()`` says the daemon is gone."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if alive is not None and not alive():
            return False
        if time.monotonic() > deadline:
            raise ClusterError(f"{problem} within {START_TIMEOUT_S:.0f} s", "Its log ends:\n" + "\n".join(tail(log)))
        time.sleep(0.05)
    return True


def tail(log: Path, n: int = 8) -> list[str]:
    return log.read_text(errors="replace").splitlines()[-n:] if log.exists() else []


def ok(argv: list[str], env: dict, needle: bytes) -> bool:
    """``argv`` succeeds within 5 s and prints ``needle``."""
    try:
        done = subprocess.run(argv, env=env, capture_output=True, timeout=5)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and needle in done.stdout


def run(argv: list[str], folder: Path) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, cwd=folder, env={"PATH": DAEMON_PATH})
    if done.returncode:
        raise ClusterError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}", "See the message above.")


def lost_its_port(lines: list[str]) -> bool:
    """A daemon's last log lines say that it could not bind its port (another process holds it)."""
    return any("Address already in use" in line or "Unable to bind listen port" in line for line in lines)


TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
TCP_LISTEN = "0A"


def listening_inodes(port: int, tables: list[str]) -> set[int]:
    """The socket inodes listening on TCP ``port`` (any address) in the text of ``/proc/net/tcp``-like
    ``tables`` (pure)."""
    found = set()
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and fields[3] == TCP_LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(int(fields[9]))
    return found


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds open."""
    found = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


def who_listens(pid: int, port: int, tables=TCP_TABLES) -> str:
    """Who listens on TCP ``port`` in this network namespace: ``"none"``, ``"daemon"`` (process ``pid``
    alone) or ``"other"`` (another process: another user's, which took the port first)."""
    texts = []
    for table in tables:
        try:
            texts.append(Path(table).read_text())
        except OSError:
            continue
    listening = listening_inodes(port, texts)
    if not listening:
        return "none"
    return "daemon" if listening <= socket_inodes(pid) else "other"
