"""The one-machine cluster's configuration, worked out before anything starts (pure, but for
:func:`node_resources`, which looks at this machine).

What the ``slurm.conf`` tunes for a small cluster, against Slurm's defaults: the scheduler runs every
second (``sched_interval=1,bf_interval=1``; defaults 60 s and 30 s), ``KillWait=5`` (30 s), and
``cred_expire=5`` (120 s; smaller values are refused and fall back to 120), and a requeued job waits
``cred_expire`` + 1 s before it may start again.
Process tracking is ``proctrack/linuxproc`` and there is no task plugin: no cgroups needed, so it runs
in a container.

Every daemon listens on 127.0.0.1 only: the controller's address is given as ``SlurmctldHost=host(127.0.0.1)``,
the node's as ``NodeAddr=127.0.0.1``, and ``CommunicationParameters=NoCtldInAddrAny,NoInAddrAny`` make slurmctld, slurmd
and srun bind those addresses instead of every interface. Nobody off this machine can reach them.
"""
from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

#: program -> the Debian package that has it
PROGRAMS = {"munged": "munge", "mungekey": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd",
            "sbatch": "slurm-client", "squeue": "slurm-client", "scontrol": "slurm-client",
            "scancel": "slurm-client", "sinfo": "slurm-client", "srun": "slurm-client"}
PARTITION = "debug"

CONF = """# slurm.conf written by distlab.slurm.local_cluster(): {what}.
ClusterName=distlab
SlurmctldHost={ctld_host}({ctld_addr})
# every daemon binds {bind}, not every interface
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser={user}
# jobs never run as root: the cluster's job user runs them
DisableRootJobs=YES
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job waits this long + 1 s (default 120 s; 5 is the least Slurm 22.05 accepts)
AuthInfo=socket={socket},cred_expire=5
# no cgroups: plain Linux process tracking, no CPU binding (works in containers)
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
{accounting}JobCompType=jobcomp/none
# a request no node can satisfy (more CPUs or memory than a node has) is refused at submit, not left pending
EnforcePartLimits=ALL
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
# a small cluster: schedule every second (defaults: 60 s / 30 s), KillWait 5 s (default 30 s)
SchedulerParameters=sched_interval=1,bf_interval=1
KillWait=5
MinJobAge=600
SlurmctldPidFile={folder}/run/slurmctld.pid
# %n: the node's name (one slurmd per node, each its own pid file, log and spool)
SlurmdPidFile={folder}/run/slurmd{per_node}.pid
# the job's batch script is kept here and run as the job user: in the door (see cluster.py)
SlurmdSpoolDir={spool}{spool_node}
StateSaveLocation={folder}/state
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd{per_node}.log
{task_prolog}{node_lines}
PartitionName={partition} Nodes={node_names} Default=YES MaxTime=INFINITE State=UP
"""


NO_ACCOUNTING = """# no job accounting: sacct answers "Slurm accounting storage is disabled"
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
"""
ACCOUNTING = """# job accounting: slurmctld sends every job's record to slurmdbd (queued while slurmdbd is not up),
# which keeps them in this cluster's own MariaDB; each task's memory and CPU time read from /proc (no cgroups)
JobAcctGatherType=jobacct_gather/linux
# every second (default 30 s): a step of a few seconds still gets its MaxRSS
JobAcctGatherFrequency=task=1
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost={host}
AccountingStoragePort={port}
# for slurmdbd, Slurm takes munge's socket from here, not from AuthInfo
AccountingStoragePass={socket}
"""


def missing_programs(which=shutil.which) -> dict[str, str]:
    """program -> package, for every program the cluster needs that is not on PATH (or in /usr/sbin)."""
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
    return {p: pkg for p, pkg in PROGRAMS.items() if which(p, path=path) is None}


def install_hint(missing: dict[str, str]) -> str:
    packages = sorted({"slurm-wlm" if pkg.startswith("slurm") else pkg for pkg in missing.values()})
    return (f"Install them: apt-get install {' '.join(packages)} (Debian/Ubuntu; slurm-wlm brings slurmctld, "
            "slurmd and slurm-client), or use a real cluster.")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_resources() -> tuple[int, int]:
    """(CPUs, MB of memory to declare): all cores, 90% of the memory (slurmd drains a node that
    declares more than it has)."""
    import psutil

    return os.cpu_count() or 1, int(psutil.virtual_memory().total / 2**20 * 0.9)


def config_text(folder: Path, host: str, ctld_port: int, slurmd_port: int, user: str,
                cpus: int, memory_mb: int, socket_path: Path, partition: str = PARTITION,
                spool: Path | None = None, nodes: list[tuple[str, str]] | None = None,
                task_prolog: Path | None = None, dbd: tuple[str, int] | None = None) -> str:
    """The cluster's slurm.conf (pure: tests read it).

    ``nodes``: (name, address) of each node when the cluster runs on :class:`distlab.Nodes` (the
    controller on the first, one slurmd on each, every daemon bound to its node's private address);
    None: one node, this host, everything on 127.0.0.1. ``task_prolog``: the script every task's environment
    comes from (:mod:`distlab.slurm.jobenv`: the notebook's Python and torchrun on PATH, a private TMPDIR).
    ``dbd``: (address, port) of the cluster's slurmdbd (:mod:`distlab.slurm.accounting`); None: no accounting."""
    hosts = nodes or [(host, "127.0.0.1")]
    node_lines = "\n".join(f"NodeName={name} NodeAddr={addr} CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN"
                           for name, addr in hosts)
    what = f"{len(hosts)} nodes, each a network namespace of distlab.Nodes" if nodes else "one node, this host"
    prolog = (f"# every task (a batch script's too) gets the notebook's python and torchrun on PATH, its own TMPDIR\n"
              f"TaskProlog={task_prolog}\n") if task_prolog else ""
    accounting = ACCOUNTING.format(host=dbd[0], port=dbd[1], socket=socket_path) if dbd else NO_ACCOUNTING
    return CONF.format(task_prolog=prolog, folder=folder, accounting=accounting,
                       spool=spool or folder / "spool", ctld_host=hosts[0][0], ctld_addr=hosts[0][1],
                       bind="its node's private address" if nodes else "127.0.0.1", what=what,
                       per_node="-%n" if nodes else "", spool_node="/%n" if nodes else "", node_lines=node_lines,
                       node_names=",".join(name for name, _ in hosts), ctld_port=ctld_port,
                       slurmd_port=slurmd_port, user=user,
                       socket=socket_path, partition=partition)
