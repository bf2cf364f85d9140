"""Starting the one-machine cluster's daemons, in order, each ready before the next.

munged first (every other daemon asks it); with accounting MariaDB (its system tables made while the rest
starts), then slurmdbd; then slurmctld, then slurmd (one per node on :class:`distlab.Nodes`). Where they run:

* on nodes: slurmctld and slurmdbd on ``node0``, one slurmd on each node, on the nodes' private network;
* on this host, wherever a network namespace can be made: slurmctld, slurmd and slurmdbd in the cluster's
  own private network (:mod:`distlab.slurm.privnet`), on Slurm's default ports;
* on this host where namespaces are refused (a container): on the host's loopback, on ports picked free,
  each daemon found listening on its port before any probe is sent there (:func:`start_on_a_free_port`).

Every daemon gets a minimal environment (:func:`distlab.slurm.daemons.daemon_env`). Runs in the kernel.
"""
from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
from pathlib import Path

from distlab.folders.private import PRIVATE_DIR, open_private, write_private
from distlab.forkserver import mode as launchmode

from . import accounting as acct
from . import daemons as dm
from . import jobenv, login, privnet
from .door import close_spools, make_door
from .errors import ClusterError
from .slurmconf import config_text, free_port, node_resources
from .stopping import stop_daemon

PORT_TRIES = 4
#: the ports in a private network (the nodes', or the cluster's own): Slurm's defaults, free there
NODE_PORTS = {"ctld": 6817, "slurmd": 6818}


def prepare(cluster) -> None:
    """The private folder's parts; with accounting, the database folder and MariaDB's install (half a
    second or more: it runs while the rest starts)."""
    for sub in ("run", "state", "log", "munge"):
        os.mkdir(cluster.folder / sub, PRIVATE_DIR)
    if not cluster.no_accounting:
        os.mkdir(cluster.folder / "dbd", PRIVATE_DIR)
        cluster.db = acct.make_db_folder(cluster.folder, cluster.tmp)
        _daemon(cluster, acct.INSTALL, acct.install_argv(cluster.db, acct.sql_dir()), group=True)


def start(cluster) -> None:
    """Everything after :func:`prepare`: the door, the configuration, the daemons, the watchdog."""
    folder = cluster.folder
    account = pwd.getpwnam(cluster.user)
    holder = privnet.begin() if cluster.nodes is None else None  # comes up while the door and munged do
    try:
        _start(cluster, folder, account, holder)
    except BaseException:
        if cluster.net is None:
            privnet.abandon(holder)
        raise


def _start(cluster, folder: Path, account: pwd.struct_passwd, holder) -> None:
    cluster.door = make_door(folder, account, cluster.hosts if cluster.nodes is not None else (), cluster.tmp)
    jobenv.install(cluster.door, account)
    sock = cluster.door / "munge.sock"
    cluster.net = privnet.finish(holder)
    private = cluster.nodes is not None or cluster.net is not None
    cluster.ports = dict(NODE_PORTS) if private else {"ctld": free_port(), "slurmd": free_port()}
    if not cluster.no_accounting:
        cluster.ports["dbd"] = acct.NODE_PORT if private else free_port()
    write_conf(cluster, sock)
    dm.run(["mungekey", "--create", "--keyfile", str(folder / "munge" / "munge.key")], folder)
    # --force: munged would refuse a socket folder others may enter; only the job user can.
    _daemon(cluster, "munged", [
        "munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={folder}/munge/munge.key",
        f"--log-file={folder}/log/munged.log", f"--pid-file={folder}/run/munged.pid",
        f"--seed-file={folder}/munge/seed"])
    dm.wait(lambda: sock.exists(), "munged did not create its socket", folder / "log" / "munged.stdout")
    if cluster.nodes is not None:  # Slurm's commands run on node0, as on a login node (slurmdbd's first)
        login.write_shims(cluster.folder, login.door(cluster.nodes.namespaces_of(0)), cluster.nodes.hosts[0])
        cluster.nodes.on_close(cluster.stop)  # a cluster whose nodes close stops with them: its shims leave PATH
    elif cluster.net is not None:  # ... in the cluster's own network
        login.write_shims(cluster.folder, login.door(cluster.net.held), cluster.hosts[0])
    if not cluster.no_accounting:  # before slurmctld: without the database or its state files, it exits
        start_accounting(cluster, sock)
    if cluster.nodes is not None:
        start_on_nodes(cluster)
    else:
        start_on_this_host(cluster, sock)
    with open_private(folder / "log" / "watchdog.log", "ab") as log:
        cluster.watchdog = subprocess.Popen(watchdog_argv(os.getpid(), _own_start_time(), folder),
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)


def write_conf(cluster, sock: Path) -> None:
    """The slurm.conf in the door: 0640, root and the job user's group (its srun reads it); with accounting,
    slurmdbd.conf in the private folder (0600: slurmdbd refuses it otherwise)."""
    cpus, memory = node_resources()
    user = pwd.getpwuid(os.geteuid()).pw_name
    nodes = None
    if cluster.nodes is not None:  # every node has the machine's cores; its memory is shared among them
        nodes = list(zip(cluster.nodes.hosts, cluster.nodes.addresses, strict=True))
        memory //= len(nodes)
    dbd = None
    if "dbd" in cluster.ports:  # slurmdbd on the address its host's name resolves to (node0's, or loopback)
        where = nodes[0][1] if nodes else ("127.0.0.1" if not acct.loopback_only(acct.host_addresses())
                                           else acct.host_addresses()[0])
        dbd = (where, cluster.ports["dbd"])
        write_private(cluster.folder / "dbd" / "slurmdbd.conf",
                      acct.dbd_conf_text(cluster.folder, sock, cluster.ports["dbd"], user))
    write_private(cluster.conf, config_text(cluster.folder, socket.gethostname().split(".")[0],
                                            cluster.ports["ctld"], cluster.ports["slurmd"], user, cpus, memory, sock,
                                            spool=cluster.door / "spool", nodes=nodes,
                                            task_prolog=cluster.door / jobenv.PROLOG, dbd=dbd))
    os.chown(cluster.conf, 0, os.stat(cluster.door).st_gid)
    os.chmod(cluster.conf, 0o640)


def start_accounting(cluster, sock: Path) -> None:
    """Once MariaDB's install has ended: MariaDB, then slurmdbd (on node0 when on nodes), ready when they
    answer (:mod:`distlab.slurm.accounting`)."""
    folder, db = cluster.folder, cluster.db
    install = next(d for d in cluster.daemons if d.name == acct.INSTALL)
    dm.wait(lambda: not install.alive(), "MariaDB's install did not end", folder / "log" / f"{acct.INSTALL}.stdout")
    dm.forget(folder, cluster.daemons, install)
    if not (db / "data" / "mysql").is_dir():
        raise ClusterError("MariaDB's install failed", "Its output ends:\n" + "\n".join(
            dm.tail(folder / "log" / f"{acct.INSTALL}.stdout")))
    maria = _daemon(cluster, "mariadbd", acct.mariadbd_argv(db))
    _ready_or_exited(lambda: acct.socket_answers(db), "MariaDB did not answer", db / "mariadbd.log", maria)
    ready = lambda: dm.ok(_probe(cluster, ["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"]),  # noqa: E731
                          cluster.env, b"")
    rename = not acct.loopback_only(acct.host_addresses())
    if cluster.nodes is not None:
        argv = cluster.nodes.command(0, acct.slurmdbd_argv(folder, db, rename_host=False))
    elif cluster.net is not None:
        argv = cluster.net.command(acct.slurmdbd_argv(folder, db, rename))
    else:
        start_on_a_free_port(cluster, sock, "slurmdbd", acct.slurmdbd_argv(folder, db, rename), "dbd", ready,
                             "slurmdbd did not answer")
        return
    _ready_or_exited(ready, "slurmdbd did not answer", folder / "log" / "slurmdbd.log", _daemon(cluster, "slurmdbd",
                                                                                             argv))


def start_on_this_host(cluster, sock: Path) -> None:
    ctld = (["slurmctld", "-D", "-i"], lambda: dm.ok(_probe(cluster, ["scontrol", "ping"]), cluster.env, b"UP"),
            "slurmctld did not answer")
    slurmd = (["slurmd", "-D"], lambda: dm.ok(_probe(cluster, ["sinfo", "-h", "-o", "%t"]), cluster.env, b"idle"),
              "slurmd's node did not become idle")
    for name, port, (argv, ready, problem) in (("slurmctld", "ctld", ctld), ("slurmd", "slurmd", slurmd)):
        if cluster.net is not None:
            _ready_or_exited(ready, problem, cluster.folder / "log" / f"{name}.log",
                             _daemon(cluster, name, cluster.net.command(argv)))
        else:
            start_on_a_free_port(cluster, sock, name, argv, port, ready, problem)
    close_spools(cluster.door, [])


def start_on_a_free_port(cluster, sock: Path, name: str, argv: list[str], port: str, ready, problem: str) -> None:
    """Start daemon ``name`` on the host's loopback and wait until ``ready()``. A port is picked free, then
    handed to the daemon: another process (another user's) may bind it in between. So a port somebody
    listens on already is replaced before the daemon starts, and nothing is sent to the port before the
    daemon itself listens there; a daemon whose port another process holds (it exits, or waits to bind) is
    stopped and started again on a new port (the slurm.conf rewritten; slurmctld re-reads it)."""
    log = cluster.folder / "log" / f"{name}.log"
    for _ in range(PORT_TRIES):
        if dm.who_listens(0, cluster.ports[port]) != "none":  # taken while the daemons before it started
            _new_port(cluster, sock, name, port)
            continue
        d = _daemon(cluster, name, argv)
        holder = _listener(d, cluster.ports[port], problem, log)
        if holder == "daemon" and dm.wait(ready, problem, log, alive=d.alive):
            return
        stop_daemon(d, 5.0)
        dm.forget(cluster.folder, cluster.daemons, d)
        if holder != "other" and not dm.lost_its_port(dm.tail(log) + dm.tail(cluster.folder / "log" /
                                                                             f"{name}.stdout")):
            break
        _new_port(cluster, sock, name, port)
    raise ClusterError(f"{problem}: it exited", "Its log ends:\n" + "\n".join(dm.tail(log)))


def _new_port(cluster, sock: Path, name: str, port: str) -> None:
    cluster.ports[port] = free_port()
    write_conf(cluster, sock)
    if name != "slurmctld" and any(d.name == "slurmctld" for d in cluster.daemons):
        dm.ok(["scontrol", "reconfigure"], cluster.env, b"")


def _listener(d: dm.Daemon, port: int, problem: str, log: Path) -> str:
    """Wait until somebody listens on ``port``: ``"daemon"`` (``d`` itself), ``"other"`` (another process,
    another user's perhaps: nothing may be sent there), or ``"exited"`` (``d`` ended first)."""
    found = ["none"]

    def decided() -> bool:
        found[0] = dm.who_listens(d.pid, port)
        return found[0] != "none"

    return found[0] if dm.wait(decided, problem, log, alive=d.alive) else "exited"


def start_on_nodes(cluster) -> None:
    """slurmctld on node0, one slurmd per node (``-N`` its node name), Slurm's commands through the
    login shims (:mod:`distlab.slurm.login`); ready when every node is idle."""
    nodes = cluster.nodes
    log = cluster.folder / "log"
    ctld = _daemon(cluster, "slurmctld", nodes.command(0, ["slurmctld", "-D", "-i"]))
    _ready_or_exited(lambda: dm.ok(["scontrol", "ping"], cluster.env, b"UP"), "slurmctld did not answer",
                     log / "slurmctld.log", ctld)
    for k, host in enumerate(nodes.hosts):
        _daemon(cluster, f"slurmd-{host}", nodes.command(k, ["slurmd", "-D", "-N", host]))
    every = [d for d in cluster.daemons if d.name.startswith("slurmd-")]
    dm.wait(lambda: _all_idle(cluster.env, len(nodes.hosts)), "the nodes did not all become idle",
            log / f"slurmd-{nodes.hosts[-1]}.log", alive=lambda: all(d.alive() for d in every))
    if not all(d.alive() for d in every):
        dead = next(d for d in every if not d.alive())
        raise ClusterError(f"{dead.name} exited", "Its log ends:\n" + "\n".join(dm.tail(log / f"{dead.name}.log")))
    close_spools(cluster.door, nodes.hosts)


def _probe(cluster, argv: list[str]) -> list[str]:
    """A readiness probe: in the cluster's private network straight through ``nsenter`` (a login shim takes
    five more programs, tens of ms each time), else as typed."""
    if cluster.net is None:
        return argv
    return cluster.net.command([shutil.which(argv[0], path=dm.DAEMON_PATH) or argv[0], *argv[1:]])


def _ready_or_exited(ready, problem: str, log: Path, d: dm.Daemon) -> None:
    if not dm.wait(ready, problem, log, alive=d.alive):
        raise ClusterError(f"{problem}: it exited", "Its log ends:\n" + "\n".join(dm.tail(log)))


def _all_idle(env: dict, n: int) -> bool:
    """``sinfo -N`` lists ``n`` nodes, every one idle."""
    try:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=env, capture_output=True, text=True, timeout=5)
    except subprocess.TimeoutExpired:
        return False
    states = done.stdout.split()
    return done.returncode == 0 and len(states) == n and all(s == "idle" for s in states)


def _daemon(cluster, name: str, argv: list[str], group: bool = False) -> dm.Daemon:
    """Start a daemon of ``cluster`` with the minimal environment."""
    return dm.start(cluster.folder, cluster.daemons, name, argv, dm.daemon_env(cluster.conf), group)


def watchdog_argv(pid: int, started: float, folder: Path) -> list[str]:
    """The watchdog's command line (:func:`~distlab.forkserver.mode.python_argv`): the current folder
    (the notebook's, anyone's) is not put first on ``sys.path``, so a ``psutil.py`` or ``distlab/``
    planted there is never imported by this process, which runs as root on the local cluster."""
    return launchmode.python_argv("distlab.slurm.watchdog", str(pid), repr(started), str(folder), flags=())


def _own_start_time() -> float:
    import psutil

    return psutil.Process().create_time()
