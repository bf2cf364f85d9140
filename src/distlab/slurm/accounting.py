"""Job accounting for the one-machine cluster: slurmdbd and a MariaDB of its own, so ``sacct`` answers.

Slurm keeps finished jobs (state, exit code, elapsed time, memory) in a database that ``slurmdbd`` fronts;
``slurmctld`` sends it every job's record (and queues them while it is not up), ``sacct`` reads them back.
The cluster runs both from Debian's packages (``slurmdbd``, ``mariadb-server``), each its own:

* **MariaDB** (``mariadbd``), as Debian runs it: as the ``mysql`` account its package made, never root (a
  flaw in it, or a job name that slipped into a query, then writes files as ``mysql``, not as root). Its
  files are in the *database folder*: made in the system's temporary directory (``distlab-db-*``, the
  ``mysql`` account's, 0700: the cluster's private folder is root's, which ``mysql`` cannot enter), with its
  data, its socket and its log. No TCP port at all (``--skip-networking``), ``--no-defaults`` (the machine's
  ``my.cnf`` is not read), no file import or export (``--secure-file-priv``, ``--local-infile=0``). Only root
  and ``mysql`` can reach the socket; ``slurmdbd`` (root) logs in as MariaDB's ``root``, which MariaDB
  grants to the system's root by the socket's peer (``unix_socket``): no password exists anywhere.
* **slurmdbd**, as root (the cluster's ``SlurmUser``), with its ``slurmdbd.conf`` (0600) in the private
  folder. It binds the address its host name resolves to (``CommunicationParameters=NoInAddrAny``; without
  it, every interface), and checks every request's munge credential as slurmctld does. On this host that
  address must be loopback: where this host's name resolves elsewhere (a container's address), it runs in
  a UTS namespace of its own named ``localhost``. On :class:`distlab.Nodes` it runs on ``node0``, on the
  nodes' private network.

It all starts with the cluster, before slurmctld: Slurm 22.05's slurmctld exits ("we have no TRES") when its
database is down and it has no state files yet, so it cannot start first and leave its records queued for a
slurmdbd that comes later. MariaDB's system tables are made while the nodes and munged start (:func:`install_argv`),
then MariaDB starts, then slurmdbd (which makes its tables), then slurmctld (which registers the cluster). It
stops with the cluster: slurmd and slurmctld first (slurmctld hands slurmdbd what it still holds), then slurmdbd,
then MariaDB; the database folder goes with the cluster's own. Pure, but for :func:`make_db_folder`,
:func:`remove_db_folder`, :func:`socket_answers` and :func:`problem`.
"""
from __future__ import annotations

import os
import pwd
import shlex
import shutil
import socket
import subprocess
from pathlib import Path

#: program -> the Debian package that has it
PROGRAMS = {"slurmdbd": "slurmdbd", "mariadbd": "mariadb-server", "mariadb-install-db": "mariadb-server",
            "sacct": "slurm-client"}
DB_ACCOUNT = "mysql"  # the account Debian's mariadb-server runs MariaDB as
DB_RECORD = "db-folder"  # in the private folder: where the database folder is (removed with the cluster)
NODE_PORT = 6819  # slurmdbd's port on the nodes (Slurm's default; each node's network is new)
INSTALL = "mariadb-install-db"  # the daemon record of the install (stopped with its children if it still runs)

DBD_CONF = """# slurmdbd.conf written by distlab.slurm.local_cluster(): job accounting for sacct
AuthType=auth/munge
AuthInfo=socket={munge}
DbdHost=localhost
DbdPort={port}
# bind the address this host's name resolves to (loopback, or node0's private address), not every interface
CommunicationParameters=NoInAddrAny
SlurmUser={user}
PidFile={folder}/run/slurmdbd.pid
LogFile={folder}/log/slurmdbd.log
# this cluster's own MariaDB, through its socket only (MYSQL_UNIX_PORT); logged in as the system's root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
"""


def missing_programs(which=shutil.which) -> dict[str, str]:
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
    return {p: pkg for p, pkg in PROGRAMS.items() if which(p, path=path) is None}


def dbd_conf_text(folder: Path, munge_socket: Path, port: int, user: str) -> str:
    """slurmdbd.conf (pure). It lives in ``folder/dbd/`` (slurmdbd reads it next to its ``SLURM_CONF``)."""
    return DBD_CONF.format(folder=folder, munge=munge_socket, port=port, user=user)


def mariadb_options(db: Path) -> list[str]:
    """The options MariaDB's install and server share: everything in ``db``, no TCP, no file import/export,
    small (one user, a few jobs: 32 MB of buffer pool, 8 MB of redo log)."""
    return ["--no-defaults", f"--user={DB_ACCOUNT}", f"--datadir={db}/data", f"--socket={db}/mysqld.sock",
            f"--pid-file={db}/mysqld.pid", "--skip-networking", f"--secure-file-priv={db}/none",
            "--local-infile=0", "--innodb-buffer-pool-size=32M", "--innodb-log-file-size=8M",
            "--performance-schema=OFF", "--skip-name-resolve"]


#: the system tables MariaDB needs, as ``mariadb-install-db`` feeds them to ``mariadbd --bootstrap``; it also
#: loads the help tables and the ``sys`` schema (four fifths of its SQL, 2-3x its time), which slurmdbd never reads
SYSTEM_SQL = ("mysql_system_tables.sql", "mysql_performance_tables.sql", "mysql_system_tables_data.sql")
SQL_DIRS = ("/usr/share/mysql", "/usr/share/mariadb")


def sql_dir(dirs=SQL_DIRS) -> str | None:
    return next((d for d in dirs if all(os.path.isfile(os.path.join(d, name)) for name in SYSTEM_SQL)), None)


def install_argv(db: Path, sql: str | None = None) -> list[str]:
    """MariaDB's system tables in ``db/data``: ``mariadb-install-db``'s bootstrap without the help tables and the
    ``sys`` schema, where the package's SQL files are found (``sql``); else ``mariadb-install-db`` itself. Either
    way MariaDB's ``root`` is the system's root, by the socket's peer (``unix_socket``)."""
    if sql is None:
        return [INSTALL, *mariadb_options(db), "--auth-root-authentication-method=socket", "--skip-test-db"]
    head = "create database if not exists mysql;\nuse mysql;\nSET @auth_root_socket='root';\n"  # one a line
    files = " ".join(shlex.quote(os.path.join(sql, name)) for name in SYSTEM_SQL)
    boot = shlex.join(["mariadbd", *mariadb_options(db), "--bootstrap", "--log-warnings=0", "--enforce-storage-engine=",
                       "--max-allowed-packet=8M", "--net-buffer-length=16K"])
    return ["sh", "-c", f"{{ printf %s {shlex.quote(head)}; cat {files}; }} | exec {boot}"]


def mariadbd_argv(db: Path) -> list[str]:
    return ["mariadbd", *mariadb_options(db), f"--log-error={db}/mariadbd.log"]


def slurmdbd_argv(folder: Path, db: Path, rename_host: bool) -> list[str]:
    """slurmdbd in the foreground, with its conf (``folder/dbd/``) and MariaDB's socket. ``rename_host``: in a
    UTS namespace named ``localhost`` (this host's name resolves to an address others reach). Every wrapper
    execs, so the pid is slurmdbd's."""
    argv = ["env", f"SLURM_CONF={folder}/dbd/slurm.conf", f"MYSQL_UNIX_PORT={db}/mysqld.sock", "slurmdbd", "-D"]
    if rename_host:
        return ["unshare", "--uts", "sh", "-c", 'hostname localhost && exec "$@"', "slurmdbd", *argv]
    return argv


def loopback_only(addresses: list[str]) -> bool:
    return bool(addresses) and all(a.startswith("127.") or a == "::1" for a in addresses)


def host_addresses(name: str | None = None) -> list[str]:
    """The IPv4 addresses this host's name (or ``name``) resolves to, as slurmdbd will find them."""
    try:
        infos = socket.getaddrinfo(name or socket.gethostname(), None, socket.AF_INET)
    except OSError:
        return []
    return sorted({info[4][0] for info in infos})


def problem(on_nodes: bool = False, which=shutil.which) -> str | None:
    """Why this machine's cluster cannot keep job accounting (the packages to install, a missing account, a
    host whose name resolves off loopback where a namespace to rename it is refused); None where it can."""
    missing = missing_programs(which)
    if missing:
        return (f"job accounting needs {', '.join(sorted(missing))}: apt-get install "
                f"{' '.join(sorted(set(missing.values())))}")
    try:
        pwd.getpwnam(DB_ACCOUNT)
    except KeyError:
        return f"job accounting runs MariaDB as the {DB_ACCOUNT!r} account, which is missing (reinstall mariadb-server)"
    if not on_nodes and not loopback_only(host_addresses()) and not can_rename_host():
        return (f"slurmdbd would listen on {', '.join(host_addresses()) or 'no address'} (this host's name), which "
                "other machines may reach, and renaming the host for it needs a UTS namespace, refused here")
    return None


def can_rename_host() -> bool:
    try:
        return subprocess.run(["unshare", "--uts", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def make_db_folder(folder: Path, tmp: str) -> Path:
    """The database folder (see the module docstring): ``mysql``'s, 0700, in the system's temporary directory,
    recorded in the private ``folder`` first (so it goes with the cluster, however that stops). ``tmp``: the
    system's temporary directory, which every user may enter (:func:`distlab.slurm.cluster.system_tmp`)."""
    import tempfile

    from distlab.folders.private import write_private

    db = Path(tempfile.mkdtemp(prefix="distlab-db-", dir=tmp))
    write_private(folder / DB_RECORD, str(db))
    os.mkdir(db / "none", 0o500)  # --secure-file-priv: root's, empty; MariaDB may neither read nor write there
    os.mkdir(db / "data", 0o700)
    account = pwd.getpwnam(DB_ACCOUNT)
    for mine in (db, db / "data"):
        os.chown(mine, account.pw_uid, account.pw_gid)
    return db


def remove_db_folder(folder: Path) -> None:
    """Remove the database folder the cluster in ``folder`` recorded (only a ``distlab-db-*`` of ``mysql``'s)."""
    record = Path(folder) / DB_RECORD
    if not record.exists():
        return
    db = Path(record.read_text())
    try:
        owner = os.lstat(db).st_uid
    except OSError:
        return
    if db.name.startswith("distlab-db-") and owner == pwd.getpwnam(DB_ACCOUNT).pw_uid:
        shutil.rmtree(db, ignore_errors=True)


def socket_answers(db: Path) -> bool:
    """MariaDB accepts a connection on its socket (it greets every client at once)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2)
        try:
            s.connect(str(db / "mysqld.sock"))
            return bool(s.recv(1))
        except OSError:
            return False
