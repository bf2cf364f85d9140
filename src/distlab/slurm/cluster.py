"""A one-machine Slurm cluster for learning and for tests: its face, :func:`local_cluster` and :class:`LocalCluster`.

munged, slurmctld and slurmd (and for ``sacct`` slurmdbd with a MariaDB of its own) on this host, or on
:class:`distlab.Nodes`. Everything lives in one private folder (made by
:func:`distlab.folders.private.private_root`'s rules: 0700, yours): its own ``slurm.conf`` (every Slurm command
finds it through ``SLURM_CONF``), its own munge key and socket, state, spool, logs and pid files. Nothing in
``/etc`` is read or changed, and a cluster another program runs on this host is never touched:
:meth:`LocalCluster.stop` stops only the daemons this object started (checked by pid *and* start time), after
cancelling the jobs they still hold. It runs on ``close()``, at interpreter exit, and from a small watchdog
process when the kernel that started the cluster dies (``kill -9`` included).

Why root: ``slurmd`` starts every job step as the job's user (setuid, setgroups), which only root
may do, and Debian's Slurm expects to run its daemons as root (CI runs as root). As another user,
use a real cluster's login node, or a container where you are root.

Who runs the jobs: never root (``DisableRootJobs=YES``) but the cluster's *job user*
(:mod:`distlab.slurm.account`), who reaches the cluster only through its *door* (:mod:`distlab.slurm.door`): a
folder in the system's temporary directory that the job user alone may enter (a POSIX ACL), holding
``slurm.conf``, munged's socket, slurmd's spool and ``jobs/``, where each job's run folder goes. Nobody else
can ask this munged for a credential, so no other user can talk to the daemons. Everything else (key, state,
logs) stays in the private folder. The daemons start in order (:mod:`distlab.slurm.starting`), on this host in
a private network of the cluster's own where namespaces can be made (:mod:`distlab.slurm.privnet`), each
with a minimal environment (:mod:`distlab.slurm.daemons`). When the cluster stops
(:mod:`distlab.slurm.stopping`), the door goes, but the work folders of :meth:`LocalCluster.workdir` (what the
learner's jobs wrote) move out first, to the notebook user.
"""
from __future__ import annotations

import atexit
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from distlab.folders.private import open_private, private_root, write_private

from . import accounting as acct
from . import clientconf, commands, jobenv, login, starting
from .account import (  # noqa: F401  (re-exported: who runs the jobs)
    ACCOUNT_RECORD,
    JOB_ACCOUNT,
    account_exists,
    choose_job_user,
    ensure_account,
    remove_account,
)
from .daemons import Daemon
from .door import DOOR_RECORD, system_tmp  # noqa: F401  (re-exported)
from .errors import ClusterError
from .slurmconf import (  # noqa: F401  (re-exported: the cluster's configuration)
    PARTITION,
    PROGRAMS,
    config_text,
    free_port,
    install_hint,
    missing_programs,
    node_resources,
)
from .stopping import WORK_RECORD, keep_work, stop_folder, stop_order  # noqa: F401  (re-exported)


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
    net: object | None = None  # on this host: its private network (privnet.PrivateNet; None: the host's loopback)
    tmp: str | None = None  # where the door and the database folder go (door.system_tmp)

    @property
    def behind_login(self) -> bool:
        """Whether Slurm's commands reach the daemons only through the login shims (:mod:`distlab.slurm.login`):
        on nodes, or on this host in the cluster's private network."""
        return self.nodes is not None or self.net is not None

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
        environment: setuid on this host's loopback; behind the login shims the script enters the cluster's
        network as root, then becomes that user (:mod:`distlab.slurm.login`)."""
        if self.behind_login:
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
        if self.behind_login:
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
        if not self.behind_login:
            return f"LocalCluster({state}, partition={self.partition!r}, SLURM_CONF='{self.conf}')"
        if self.nodes is None:  # in its private network: a terminal on the host reaches none of its daemons
            return f"LocalCluster({state}, partition={self.partition!r}, Slurm commands from this notebook only)"
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
        if self.net is not None:
            self.net.close()
        if os.environ.get("SLURM_CONF") == str(self.conf):
            if self._old_conf is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = self._old_conf
        if self.behind_login:
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
        return accounted(job_id, clientconf.client_env(), timeout)

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
    if shutil.which("scontrol") is None or clientconf.config_file() is None:
        return False
    try:
        done = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=timeout,
                              env=clientconf.client_env())
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
    tmp = system_tmp()  # says why, when it passes $TMPDIR over
    folder = Path(tempfile.mkdtemp(prefix="slurm-cluster-", dir=private_root(root)))
    if not existed:  # made for this cluster: it goes when the cluster stops
        write_private(folder / ACCOUNT_RECORD, name)
    cluster = LocalCluster(folder=folder, user=account.pw_name, _old_conf=os.environ.get("SLURM_CONF"),
                           owns_nodes=own, tmp=tmp)
    cluster.no_accounting = acct.problem(on_nodes=nodes is not None) if accounting else "not asked for"
    try:
        starting.prepare(cluster)  # MariaDB's install starts here, and runs while the nodes and munged start
        if own:
            from distlab.nodes.cluster import Nodes

            nodes = Nodes(nodes)
        cluster.nodes = nodes
        starting.start(cluster)
    except BaseException:
        stop_folder(folder)
        if cluster.net is not None:
            cluster.net.close()
        if own and not isinstance(nodes, int):
            nodes.close()
        raise
    os.environ["SLURM_CONF"] = str(cluster.conf)
    if cluster.behind_login:
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


def check_can_start() -> None:
    missing = missing_programs()
    if missing:
        raise ClusterError(f"these programs are missing: {', '.join(sorted(missing))}", install_hint(missing))
    if os.geteuid() != 0:
        raise ClusterError(
            "it needs root (slurmd starts every job step as the job's user, which only root may do)",
            "Run as root (as CI does, or in a container), or use a real cluster's login node.")


def current_cluster():
    """distlab's one-machine cluster, when it is the one SLURM_CONF points at (else None)."""
    running = _CURRENT
    if running is not None and os.environ.get("SLURM_CONF") == str(running.conf) and running.door is not None:
        return running
    return None
