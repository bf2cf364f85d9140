"""A one-machine Slurm cluster for learning and for tests: munged, slurmctld and slurmd on this host.

Everything lives in one private folder (made by :func:`distlab.folders.private.private_root`'s rules:
0700, yours): its own ``slurm.conf`` (every Slurm command finds it through ``SLURM_CONF``), its
own munge key and socket, state, spool, logs and pid files. Nothing in ``/etc`` is read or changed,
and a cluster another program runs on this host is never touched: :meth:`LocalCluster.stop` stops
only the three daemons this object started (checked by pid *and* start time), after cancelling the
jobs they still hold. It runs on ``close()``, at interpreter exit, and from a small watchdog
process when the kernel that started the cluster dies (``kill -9`` included).

Why root: ``slurmd`` starts every job step as the job's user (setuid, setgroups), which only root
may do, and Debian's Slurm expects to run its daemons as root (CI runs as root). As another user,
use a real cluster's login node, or a container where you are root.

Who runs the jobs: never root (``DisableRootJobs=YES``). Jobs run as the cluster's *job user*:
``local_cluster(user=...)``, else the user who became root with ``sudo`` (``SUDO_USER``), else a
dedicated unprivileged account, ``distlab-job`` (made with ``useradd --system`` if missing, and
removed with ``userdel`` when the cluster that made it stops, unless another cluster still uses it): a job is
code a notebook chose to run, and as root any mistake in it, or anyone who reaches a port it opens,
owns the machine. That user needs a few things of this cluster, in its *door*: a folder made in the
system's temporary directory (``distlab-slurm-*``), owned by root and the job user's group, mode
0710 (enter, not list), holding ``slurm.conf`` (0640), munged's socket, slurmd's spool and ``jobs/``
(root's, 0711), where each job's run folder (the job user's, 0700) goes; slurmd's spool is put back
to 0711 once slurmd runs (it makes it 0755). Nobody outside that group can ask this munged for a
credential, so no other user can talk to the daemons; so that group must be the job user's own (a
job user whose primary group others share is refused). Everything else (key, state, logs) stays in
the private folder. When the cluster stops, the door goes, but the work folders of :meth:`LocalCluster.workdir`
(what the learner's jobs wrote) move out first, to the notebook user (:func:`keep_work`).
"""
from __future__ import annotations

import atexit
import contextlib
import grp
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from distlab.folders.private import PRIVATE_DIR, open_private, private_root, write_private
from distlab.forkserver import mode as launchmode

from . import accounting as acct
from . import commands, jobenv, login
from .errors import SHARED_GROUP_HINT, SHARED_GROUP_PROBLEM, ClusterError
from .slurmconf import (  # noqa: F401  (re-exported: the cluster's configuration)
    PARTITION,
    PROGRAMS,
    config_text,
    free_port,
    install_hint,
    missing_programs,
    node_resources,
)

START_TIMEOUT_S = 30.0


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


JOB_ACCOUNT = "distlab-job"


@dataclass
class LocalCluster:
    """The running cluster: ``conf`` (its slurm.conf), ``folder``, ``partition``, ``env`` for Slurm commands,
    ``user`` (who its jobs run as) and ``door`` (the folder that user reaches: conf, munge socket, jobs)."""

    folder: Path
    door: Path | None = None
    user: str = JOB_ACCOUNT
    partition: str = PARTITION
    daemons: list[Daemon] = field(default_factory=list)
    watchdog: subprocess.Popen | None = None
    _old_conf: str | None = None
    ports: dict[str, int] = field(default_factory=dict)
    nodes: object | None = None  # the distlab.Nodes it runs on (None: this host, 127.0.0.1)
    owns_nodes: bool = False  # made for it: closed when it stops
    _old_path: str | None = None
    no_accounting: str | None = None  # why sacct answers nothing here (None: slurmdbd keeps every job)
    db: Path | None = None  # MariaDB's folder (accounting.make_db_folder)

    @property
    def conf(self) -> Path:
        return (self.door or self.folder) / "slurm.conf"

    @property
    def jobs(self) -> Path:
        """Where the run folders of this cluster's jobs go (root's, 0711; each run folder the job user's, 0700)."""
        return self.door / "jobs"

    @property
    def as_job_user(self) -> dict:
        """``subprocess`` arguments that run a command (``sbatch`` typed by hand) as the job user: root may
        not submit to this cluster (``DisableRootJobs``)."""
        from .jobuser import job_environment

        pw = pwd.getpwnam(self.user)
        # what sbatch passes on to the job: the job user's names, none of root's private folders (root's
        # TORCHINDUCTOR_CACHE_DIR made the job's `import distlab` fail: Permission denied)
        return self.job_user_args(job_environment(self.env, pw, Path(pw.pw_dir or "/")))

    def job_user_args(self, env: dict) -> dict:
        """``subprocess`` arguments that run a Slurm command as the job user with ``env`` as its
        environment: setuid on this host; on nodes the login node's script enters node0's network as root,
        then becomes that user (:mod:`distlab.slurm.login`)."""
        if self.nodes is not None:
            return {"env": {**env, login.AS_USER: self.user}}
        pw = pwd.getpwnam(self.user)
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": [], "env": env}

    def workdir(self, prefix: str = "work-") -> Path:
        """A fresh working folder that the job user owns (0700) and root may use: for scripts, data and
        checkpoints that jobs read and write (``os.chdir`` to it from a notebook). It outlives the
        cluster: ``stop()`` moves it to a folder of the notebook user's and prints where (:func:`keep_work`)."""
        made = Path(tempfile.mkdtemp(prefix=prefix, dir=self.jobs))
        pw = pwd.getpwnam(self.user)
        os.chown(made, pw.pw_uid, pw.pw_gid)
        with open_private(self.folder / WORK_RECORD, "a") as f:  # kept when the cluster stops (keep_work)
            f.write(made.name + "\n")
        return made

    @property
    def env(self) -> dict[str, str]:
        env = {**os.environ, "SLURM_CONF": str(self.conf)}
        if self.nodes is not None:
            env["PATH"] = login.with_bin_first(env, self.folder / "bin")
        return env

    def environment_lines(self) -> list[str]:
        """``export`` lines that give a batch script this notebook's Python, torchrun, torch and distlab.

        Every job of this cluster already has them (its TaskProlog, :mod:`distlab.slurm.jobenv`): these lines
        say the same in the script, for a reader, or for a job that ``--export=NONE`` would leave bare."""
        import shlex

        from .jobuser import job_python

        _, sites = job_python(pwd.getpwnam(self.user))
        return [f"export PATH={shlex.quote(str(self.door / jobenv.BIN))}:\"$PATH\"   # this cluster's stand-in "
                "for the venv", f"export PYTHONPATH={shlex.quote(':'.join(jobenv.import_paths(sites)))}"]

    @property
    def hosts(self) -> list[str]:
        """The compute nodes' names (``node0``, ``node1``... on nodes; this host's name otherwise)."""
        return list(self.nodes.hosts) if self.nodes is not None else [socket.gethostname().split(".")[0]]

    def running(self) -> bool:
        return any(d.alive() for d in self.daemons)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running() else "stopped"
        if self.no_accounting:  # sacct will say "accounting storage is disabled": here, why
            state += f", no accounting: {self.no_accounting}"
        if self.nodes is None:
            return f"LocalCluster({state}, partition={self.partition!r}, SLURM_CONF='{self.conf}')"
        # no SLURM_CONF here: from a terminal on the host it would send requests to 10.77.0.1 out of the real
        # network interface; the controller is reached only through this notebook's login shims
        return (f"LocalCluster({state}, nodes={','.join(self.hosts)}, partition={self.partition!r}, "
                "Slurm commands from this notebook only)")

    def accounted(self, job_id: int | str, timeout: float = 30.0) -> str:
        """Wait until ``sacct`` has job ``job_id``'s whole final record; its state (:func:`accounted`)."""
        from .errors import SlurmError

        if self.no_accounting:
            raise SlurmError(f"this cluster keeps no job accounting: {self.no_accounting}.")
        return accounted(job_id, self.env, timeout)

    def stop(self) -> None:
        """Cancel its jobs, stop its daemons, put SLURM_CONF back. Safe to call twice."""
        stop_folder(self.folder)
        if self.watchdog is not None and self.watchdog.poll() is None:
            self.watchdog.terminate()
            self.watchdog.wait(5)
        if self.owns_nodes and self.nodes is not None:
            self.nodes.close()
        if os.environ.get("SLURM_CONF") == str(self.conf):
            if self._old_conf is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = self._old_conf
        if self.nodes is not None:
            os.environ["PATH"] = login.without_bin(os.environ.get("PATH", ""), self.folder / "bin")
        global _CURRENT
        if _CURRENT is self:
            _CURRENT = None

    close = stop


class ExistingCluster:
    """A controller that already answered (a real cluster, or one another program runs): not ours to stop."""

    as_job_user: dict = {}  # jobs run as whoever submits them
    user = None

    def __init__(self, conf: str | None):
        self.conf, self.folder, self.daemons = conf, None, []

    def __repr__(self) -> str:
        return f"ExistingCluster(SLURM_CONF={self.conf!r}: a controller answered; distlab started nothing)"

    def running(self) -> bool:
        return True

    def accounted(self, job_id: int | str, timeout: float = 30.0) -> str:
        """Wait until ``sacct`` has job ``job_id``'s whole final record; its state (:func:`accounted`)."""
        return accounted(job_id, commands.client_env(), timeout)

    def workdir(self, prefix: str = "work-") -> Path:
        """A fresh working folder of yours (a real cluster's jobs run as you)."""
        return Path(tempfile.mkdtemp(prefix=prefix, dir=Path.cwd()))

    def stop(self) -> None:
        """Nothing to stop: distlab did not start this cluster."""

    close = stop


def accounted(job_id: int | str, env: dict, timeout: float = 30.0) -> str:
    """Wait until ``sacct`` has job ``job_id``'s whole final record, and return its state (``COMPLETED``,
    ``FAILED``...). The record arrives in parts, after the job has left the queue: first its steps and
    state, under a stand-in name (``allocation``) and the first node only, then, a second or two later,
    the job's own name and node list; so it waits until those match the controller's (while it remembers
    the job: ``MinJobAge``)."""
    from .errors import SlurmError

    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run(["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "State,JobName,NodeList"],
                              env=env, capture_output=True, text=True)
        fields = (done.stdout.strip().splitlines() or [""])[0].split("|")
        state = fields[0].split(" ")[0]
        if done.returncode == 0 and state and state not in ("PENDING", "RUNNING", "REQUEUED", "SUSPENDED"):
            want = commands.controller_fields(job_id, ("JobName", "NodeList"), env)
            if want is None or fields[1:] == [want["JobName"], want["NodeList"]]:
                return state
        if time.monotonic() > deadline:
            raise SlurmError(f"sacct has no whole final record of job {job_id} after {timeout:.0f} s: "
                             f"{(done.stdout + done.stderr).strip() or 'nothing'}")
        time.sleep(0.2)


_CURRENT: LocalCluster | None = None


def controller_answers(timeout: float = 10) -> bool:
    """True when ``scontrol ping`` (with the current SLURM_CONF) reports a controller UP. Where no
    slurm.conf exists, nothing runs: Slurm would ask the site's DNS for one (:mod:`.commands`)."""
    if shutil.which("scontrol") is None or commands.config_file() is None:
        return False
    try:
        done = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=timeout,
                              env=commands.client_env())
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and "UP" in done.stdout


def local_cluster(root: Path | None = None, use_existing: bool = True,
                  user: str | None = None, nodes=None, accounting: bool = True) -> LocalCluster | ExistingCluster:
    """A Slurm cluster to submit to: the one that already answers (``use_existing``), this process's
    running one-machine cluster, or a new one (SLURM_CONF then points at it) whose jobs run as ``user``
    (default: ``SUDO_USER``, else the ``distlab-job`` account; never root: see the module docstring).

    Raises :class:`~distlab.slurm.errors.ClusterError` naming the packages to install, or why root
    is needed. A cluster started here stops on ``close()``, at exit, or by its watchdog when this
    process dies.

    ``nodes``: run it on :class:`distlab.Nodes` instead of this host: a number (nodes made for the
    cluster, closed when it stops) or nodes you made. The controller then runs on ``node0``, one
    ``slurmd`` on each node, every daemon on the nodes' private network, and Slurm's commands typed
    in the notebook run on ``node0`` as on a login node (:mod:`distlab.slurm.login`).

    ``accounting``: keep every job in a database, so ``sacct`` answers (slurmdbd and a MariaDB of the
    cluster's own: :mod:`distlab.slurm.accounting`), where this machine can (``cluster.no_accounting`` says
    why not); False: no accounting (a faster start, one process less).
    """
    global _CURRENT
    wanted = check_nodes_argument(nodes)
    if _CURRENT is not None and _CURRENT.running():
        check_same_shape(_CURRENT, wanted)
        return _CURRENT
    if nodes is None and use_existing and controller_answers():
        return ExistingCluster(os.environ.get("SLURM_CONF"))
    check_can_start()
    own = isinstance(nodes, int)
    name, create = choose_job_user(user, os.environ)
    existed = account_exists(name)
    account = ensure_account(name, create)
    check_own_group(account)
    folder = Path(tempfile.mkdtemp(prefix="slurm-cluster-", dir=private_root(root)))
    if not existed:  # made for this cluster: it goes when the cluster stops
        write_private(folder / ACCOUNT_RECORD, name)
    cluster = LocalCluster(folder=folder, user=account.pw_name, _old_conf=os.environ.get("SLURM_CONF"),
                           owns_nodes=own)
    cluster.no_accounting = acct.problem(on_nodes=nodes is not None) if accounting else "not asked for"
    try:
        _prepare(cluster)  # MariaDB's install starts here, and runs while the nodes and munged start
        if own:
            from distlab.nodes.cluster import Nodes

            nodes = Nodes(nodes)
        cluster.nodes = nodes
        _start(cluster)
    except BaseException:
        stop_folder(folder)
        if own and not isinstance(nodes, int):
            nodes.close()
        raise
    os.environ["SLURM_CONF"] = str(cluster.conf)
    if nodes is not None:
        os.environ["PATH"] = cluster.env["PATH"]
    atexit.register(cluster.stop)
    _CURRENT = cluster
    return cluster


def check_nodes_argument(nodes) -> int | None:
    """How many nodes ``local_cluster(nodes=)`` asks for (None: this host), checked before anything starts."""
    if nodes is None:
        return None
    if isinstance(nodes, bool) or not isinstance(nodes, int) and not hasattr(nodes, "pids"):
        raise ClusterError(f"nodes={nodes!r} is neither a number of nodes nor distlab.Nodes",
                           "Pass nodes=2, or nodes=distlab.Nodes(2), or leave it out for this host alone.")
    if isinstance(nodes, int):
        from distlab.nodes import plan

        return plan.count(nodes)
    if nodes.closed:
        raise ClusterError("the nodes given are closed", "Make new ones: distlab.Nodes(2).")
    return nodes.n


def check_same_shape(running: LocalCluster, wanted: int | None) -> None:
    """A cluster already runs in this process: asking for another number of nodes is an error, not a
    silent reuse (no ``nodes=``: whichever runs)."""
    has = None if running.nodes is None else running.nodes.n
    if wanted is not None and has != wanted:
        raise ClusterError(f"a local cluster already runs here with {has or 'no'} nodes, and this asks for "
                           f"{wanted or 'none'}", "Stop it first: cluster.stop().")


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


def group_sharers(account: pwd.struct_passwd, accounts=None, group=None) -> list[str]:
    """Who else has ``account``'s primary group, as their own primary group or as a listed member
    (``accounts``/``group``: the system's tables unless given)."""
    accounts = pwd.getpwall() if accounts is None else accounts
    if group is None:
        with contextlib.suppress(KeyError):
            group = grp.getgrgid(account.pw_gid)
    others = {a.pw_name for a in accounts if a.pw_gid == account.pw_gid} | set(getattr(group, "gr_mem", ()))
    return sorted(others - {account.pw_name})


def check_own_group(account: pwd.struct_passwd) -> None:
    """The door is root:<the job user's primary group> 0710: whoever else has that group could reach
    munged and the jobs. So the job user's primary group must be its own; refused otherwise."""
    others = group_sharers(account)
    if others:
        try:
            group = grp.getgrgid(account.pw_gid).gr_name
        except KeyError:
            group = str(account.pw_gid)
        raise ClusterError(SHARED_GROUP_PROBLEM.format(user=account.pw_name, group=group, gid=account.pw_gid,
                                                       others=", ".join(others)), SHARED_GROUP_HINT)


def check_can_start() -> None:
    missing = missing_programs()
    if missing:
        raise ClusterError(f"these programs are missing: {', '.join(sorted(missing))}", install_hint(missing))
    if os.geteuid() != 0:
        raise ClusterError(
            "it needs root (slurmd starts every job step as the job's user, which only root may do)",
            "Run as root (as CI does, or in a container), or use a real cluster's login node.")


def _prepare(cluster: LocalCluster) -> None:
    """The private folder's parts; with accounting, the database folder and MariaDB's install (half a
    second or more: it runs while the rest starts)."""
    for sub in ("run", "state", "log", "munge"):
        os.mkdir(cluster.folder / sub, PRIVATE_DIR)
    if not cluster.no_accounting:
        os.mkdir(cluster.folder / "dbd", PRIVATE_DIR)
        cluster.db = acct.make_db_folder(cluster.folder, system_tmp())
        _daemon(cluster, acct.INSTALL, acct.install_argv(cluster.db, acct.sql_dir()), group=True)


def _start(cluster: LocalCluster) -> None:
    folder = cluster.folder
    cluster.door = make_door(folder, pwd.getpwnam(cluster.user), cluster.hosts if cluster.nodes is not None else ())
    jobenv.install(cluster.door, pwd.getpwnam(cluster.user))
    sock = cluster.door / "munge.sock"
    cluster.ports = dict(NODE_PORTS) if cluster.nodes is not None else {"ctld": free_port(), "slurmd": free_port()}
    if not cluster.no_accounting:
        cluster.ports["dbd"] = acct.NODE_PORT if cluster.nodes is not None else free_port()
    _write_conf(cluster, sock)
    _run(["mungekey", "--create", "--keyfile", str(folder / "munge" / "munge.key")], folder)
    # --force: munged would refuse a socket folder others may enter; only the job user's group can.
    _daemon(cluster, "munged", [
        "munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={folder}/munge/munge.key",
        f"--log-file={folder}/log/munged.log", f"--pid-file={folder}/run/munged.pid",
        f"--seed-file={folder}/munge/seed"])
    _wait(lambda: sock.exists(), "munged did not create its socket", folder / "log" / "munged.stdout")
    if cluster.nodes is not None:  # Slurm's commands run on node0, as on a login node (slurmdbd's first)
        login.write_shims(cluster.folder, login.door(cluster.nodes.namespaces_of(0)), cluster.nodes.hosts[0])
        cluster.nodes.on_close(cluster.stop)  # a cluster whose nodes close stops with them: its shims leave PATH
    if not cluster.no_accounting:  # before slurmctld: without the database or its state files, it exits
        _start_accounting(cluster, sock)
    if cluster.nodes is not None:
        _start_on_nodes(cluster)
    else:
        _start_on_this_host(cluster, sock)
    with open_private(folder / "log" / "watchdog.log", "ab") as log:
        cluster.watchdog = subprocess.Popen(watchdog_argv(os.getpid(), _own_start_time(), folder),
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)


def _start_accounting(cluster: LocalCluster, sock: Path) -> None:
    """Once MariaDB's install has ended: MariaDB, then slurmdbd (on node0 when on nodes), ready when they
    answer (:mod:`distlab.slurm.accounting`)."""
    folder, db = cluster.folder, cluster.db
    install = next(d for d in cluster.daemons if d.name == acct.INSTALL)
    _wait(lambda: not install.alive(), "MariaDB's install did not end", folder / "log" / f"{acct.INSTALL}.stdout")
    _forget(cluster, install)
    if not (db / "data" / "mysql").is_dir():
        raise ClusterError("MariaDB's install failed", "Its output ends:\n" + "\n".join(
            _tail(folder / "log" / f"{acct.INSTALL}.stdout")))
    maria = _daemon(cluster, "mariadbd", acct.mariadbd_argv(db))
    if not _wait(lambda: acct.socket_answers(db), "MariaDB did not answer", db / "mariadbd.log",
                 alive=maria.alive):
        raise ClusterError("MariaDB did not answer: it exited",
                           "Its log ends:\n" + "\n".join(_tail(db / "mariadbd.log")))
    ready = lambda: _ok(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"], cluster.env, b"")  # noqa: E731
    if cluster.nodes is not None:
        argv = cluster.nodes.command(0, acct.slurmdbd_argv(folder, db, rename_host=False))
        d = _daemon(cluster, "slurmdbd", argv)
        if not _wait(ready, "slurmdbd did not answer", folder / "log" / "slurmdbd.log",
                     alive=d.alive):
            raise ClusterError("slurmdbd did not answer: it exited",
                               "Its log ends:\n" + "\n".join(_tail(folder / "log" / "slurmdbd.log")))
        return
    rename = not acct.loopback_only(acct.host_addresses())
    _start_on_a_free_port(cluster, sock, "slurmdbd", acct.slurmdbd_argv(folder, db, rename), "dbd", ready,
                          "slurmdbd did not answer")


def _start_on_this_host(cluster: LocalCluster, sock: Path) -> None:
    _start_on_a_free_port(cluster, sock, "slurmctld", ["slurmctld", "-D", "-i"], "ctld",
                          lambda: _ok(["scontrol", "ping"], cluster.env, b"UP"), "slurmctld did not answer")
    _start_on_a_free_port(cluster, sock, "slurmd", ["slurmd", "-D"], "slurmd",
                          lambda: _ok(["sinfo", "-h", "-o", "%t"], cluster.env, b"idle"),
                          "slurmd's node did not become idle")
    close_spools(cluster.door, [])


#: the ports on the nodes: Slurm's defaults, free there (each node's network is new and the user's own)
NODE_PORTS = {"ctld": 6817, "slurmd": 6818}


def _start_on_nodes(cluster: LocalCluster) -> None:
    """slurmctld on node0, one slurmd per node (``-N`` its node name), Slurm's commands through the
    login shims (:mod:`distlab.slurm.login`); ready when every node is idle."""
    nodes = cluster.nodes
    log = cluster.folder / "log"
    ctld = _daemon(cluster, "slurmctld", nodes.command(0, ["slurmctld", "-D", "-i"]))
    if not _wait(lambda: _ok(["scontrol", "ping"], cluster.env, b"UP"), "slurmctld did not answer",
                 log / "slurmctld.log", alive=ctld.alive):
        raise ClusterError("slurmctld did not answer: it exited",
                           "Its log ends:\n" + "\n".join(_tail(log / "slurmctld.log")))
    for k, host in enumerate(nodes.hosts):
        _daemon(cluster, f"slurmd-{host}", nodes.command(k, ["slurmd", "-D", "-N", host]))
    every = [d for d in cluster.daemons if d.name.startswith("slurmd-")]
    _wait(lambda: _all_idle(cluster.env, len(nodes.hosts)), "the nodes did not all become idle",
          log / f"slurmd-{nodes.hosts[-1]}.log", alive=lambda: all(d.alive() for d in every))
    if not all(d.alive() for d in every):
        dead = next(d for d in every if not d.alive())
        raise ClusterError(f"{dead.name} exited", "Its log ends:\n" + "\n".join(_tail(log / f"{dead.name}.log")))
    close_spools(cluster.door, nodes.hosts)


def _all_idle(env: dict, n: int) -> bool:
    """``sinfo -N`` lists ``n`` nodes, every one idle."""
    try:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=env, capture_output=True, text=True, timeout=5)
    except subprocess.TimeoutExpired:
        return False
    states = done.stdout.split()
    return done.returncode == 0 and len(states) == n and all(s == "idle" for s in states)


DOOR_RECORD = "door"  # in the private folder: where the door is (removed with the cluster)
ACCOUNT_RECORD = "made-account"  # in the private folder: the job account this cluster created, if it did


def make_door(folder: Path, account: pwd.struct_passwd, node_spools=()) -> Path:
    """The folder the job user reaches (see the module docstring): root:<its group> 0710 in the system's
    temporary directory (short: munged's socket path must fit 107 bytes), with ``spool/`` and ``jobs/``
    (root's, 0711: the job user enters its own folders there but cannot rename or plant entries)."""
    door = Path(tempfile.mkdtemp(prefix="distlab-slurm-", dir=system_tmp()))
    write_private(folder / DOOR_RECORD, str(door))
    os.chown(door, 0, account.pw_gid)
    os.chmod(door, 0o710)
    os.mkdir(door / "spool", 0o711)  # slurmd keeps each job's batch script in a folder of the job's user here
    os.chmod(door / "spool", 0o711)
    for host in node_spools:  # on nodes: one spool per slurmd (SlurmdSpoolDir=.../spool/%n)
        os.mkdir(door / "spool" / host, 0o711)
        os.chmod(door / "spool" / host, 0o711)
    os.mkdir(door / "jobs", 0o711)  # root's: the job user enters its own folders here, but renames nothing
    os.chmod(door / "jobs", 0o711)
    return door


def close_spools(door: Path, hosts) -> None:
    """Once slurmd runs: its spool (one per node: ``spool/<host>``) back to 0711. slurmd makes it 0755
    when it starts, and the door's group could then list every job's folder there."""
    for spool in [door / "spool", *(door / "spool" / host for host in hosts)]:
        os.chmod(spool, 0o711)


def system_tmp() -> str:
    """A temporary directory every user can enter (``tempfile``'s may be a private folder of this process)."""
    for candidate in (os.environ.get("TMPDIR"), "/tmp", "/var/tmp", tempfile.gettempdir()):
        if candidate and os.path.isdir(candidate) and os.stat(candidate).st_mode & 0o001:
            return candidate
    raise ClusterError("no temporary directory that other users can enter", "Make /tmp world-enterable (1777).")


PORT_TRIES = 4


def _write_conf(cluster: LocalCluster, sock: Path) -> None:
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


def _start_on_a_free_port(cluster: LocalCluster, sock: Path, name: str, argv: list[str], port: str, ready,
                          problem: str) -> None:
    """Start daemon ``name`` and wait until ``ready()``. A port is picked free, then handed to the daemon:
    another process (another user's) may bind it in between. A daemon that then dies for want of its
    port is started again on a new port (the slurm.conf rewritten; slurmctld re-reads it)."""
    log = cluster.folder / "log" / f"{name}.log"
    for _ in range(PORT_TRIES):
        d = _daemon(cluster, name, argv)
        if _wait(ready, problem, log, alive=d.alive):
            return
        _forget(cluster, d)
        if not lost_its_port(_tail(log) + _tail(cluster.folder / "log" / f"{name}.stdout")):
            break
        cluster.ports[port] = free_port()
        _write_conf(cluster, sock)
        if name != "slurmctld":
            _ok(["scontrol", "reconfigure"], cluster.env, b"")
    raise ClusterError(f"{problem}: it exited", "Its log ends:\n" + "\n".join(_tail(log)))


def lost_its_port(lines: list[str]) -> bool:
    """A daemon's last log lines say that it could not bind its port (another process holds it)."""
    return any("Address already in use" in line or "Unable to bind listen port" in line for line in lines)


def watchdog_argv(pid: int, started: float, folder: Path) -> list[str]:
    """The watchdog's command line (:func:`~distlab.forkserver.mode.python_argv`): the current folder
    (the notebook's, anyone's) is not put first on ``sys.path``, so a ``psutil.py`` or ``distlab/``
    planted there is never imported by this process, which runs as root on the local cluster."""
    return launchmode.python_argv("distlab.slurm.watchdog", str(pid), repr(started), str(folder), flags=())


def _own_start_time() -> float:
    import psutil

    return psutil.Process().create_time()




def _daemon(cluster: LocalCluster, name: str, argv: list[str], group: bool = False) -> Daemon:
    """Start a daemon and add it to the cluster's list and its ``daemons.json`` at once (the watchdog
    reads that file)."""
    import psutil

    with open_private(cluster.folder / "log" / f"{name}.stdout", "ab") as log:
        p = subprocess.Popen(argv, env=cluster.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True, cwd=cluster.folder)
    d = Daemon(name, p.pid, psutil.Process(p.pid).create_time(), group)
    cluster.daemons.append(d)
    _save(cluster.folder, cluster.daemons)
    return d


def _forget(cluster: LocalCluster, d: Daemon) -> None:
    cluster.daemons.remove(d)
    _save(cluster.folder, cluster.daemons)


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


def _wait(ready, problem: str, log: Path, alive=None) -> bool:
    """Wait until ``ready()`` (True); False as soon as ``alive()`` says the daemon is gone."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if alive is not None and not alive():
            return False
        if time.monotonic() > deadline:
            raise ClusterError(f"{problem} within {START_TIMEOUT_S:.0f} s", "Its log ends:\n" + "\n".join(_tail(log)))
        time.sleep(0.05)
    return True


def _tail(log: Path, n: int = 8) -> list[str]:
    return log.read_text(errors="replace").splitlines()[-n:] if log.exists() else []


def stop_folder(folder: Path, grace_s: float = 10.0) -> None:
    """Cancel the cluster's jobs, stop the daemons listed in its ``daemons.json`` (newest first), and
    remove the folder once none of them runs (the runs root is never pruned of cluster folders)."""
    import psutil

    path = Path(folder) / "daemons.json"
    if not path.exists():
        return
    daemons = [Daemon(**d) for d in json.loads(path.read_text())]
    record = Path(folder) / DOOR_RECORD
    conf = Path(record.read_text()) / "slurm.conf" if record.exists() else Path(folder) / "slurm.conf"
    env = {**os.environ, "SLURM_CONF": str(conf)}
    if (Path(folder) / "bin").is_dir():  # on nodes: the commands run on the login node (gone with the nodes)
        env["PATH"] = login.with_bin_first(env, Path(folder) / "bin")
    if any(d.name == "slurmctld" and d.alive() for d in daemons):
        _cancel_all(env, grace_s)
    for d in stop_order(daemons):
        if not d.alive():
            continue
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
    if any(d.alive() for d in daemons):
        _save(Path(folder), [d for d in daemons if d.alive()])  # kept, with its logs, for a second try
        return
    record = Path(folder) / DOOR_RECORD
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


#: who stops first: the nodes' daemons, the controller (it hands slurmdbd what it still holds), slurmdbd,
#: MariaDB, munged (which every other one asks until it ends)
#: (by the name before any ``-``: ``slurmd-node1``, ``mariadb-install-db``)
STOP_FIRST = ("slurmd", "slurmctld", "slurmdbd", "mariadbd", "mariadb", "munged")


def stop_order(daemons: list[Daemon]) -> list[Daemon]:
    """``daemons`` in the order to stop them: by :data:`STOP_FIRST`, newest first among equals. Pure."""
    def rank(d: Daemon) -> int:
        kind = d.name.split("-")[0]
        return STOP_FIRST.index(kind) if kind in STOP_FIRST else len(STOP_FIRST)

    return sorted(reversed(daemons), key=rank)


WORK_RECORD = "workdirs"  # in the private folder: the names of the work folders workdir() made in jobs/


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


def other_doors(gid: int) -> list[Path]:
    """Doors of running clusters (``distlab-slurm-*`` in the system's temporary directory) whose job
    user's group is ``gid``."""
    found = []
    for path in Path(system_tmp()).glob("distlab-slurm-*"):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid == 0 and st.st_gid == gid:
            found.append(path)
    return found


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



def current_cluster():
    """distlab's one-machine cluster, when it is the one SLURM_CONF points at (else None)."""
    running = _CURRENT
    if running is not None and os.environ.get("SLURM_CONF") == str(running.conf) and running.door is not None:
        return running
    return None
