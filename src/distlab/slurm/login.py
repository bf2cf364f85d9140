"""The login node of a cluster on :class:`distlab.Nodes`: Slurm's commands typed in the notebook reach it.

A cluster on nodes lives on their private network: the controller listens on ``node0``'s address,
which the host (where the notebook runs) cannot reach, and which nobody else on this machine can
reach either (that is the point). So ``sinfo``, ``squeue``, ``sbatch``... typed in the notebook
(``!squeue``, ``subprocess.run(["squeue"])``, distlab's own calls) must run *on* a node, as a
terminal on a cluster's login node would. The cluster puts a folder of small scripts first on
``PATH`` (its ``bin/``, private to the notebook's user), one per Slurm command, that run the real
command inside node0's network namespace with ``nsenter``. Everything else stays as it was: the
working directory, the environment, ``SLURM_CONF``.

A shim never names node0 by a pid (a dead node's pid may be anyone's by now): it opens the network
namespace through the descriptor the notebook holds open on it (:mod:`distlab.nodes.held`), checks the
notebook's start time and the namespace's inode, and otherwise refuses, having sent nothing.

Only root may enter a namespace, and the cluster's jobs never run as root: a command the notebook
runs *as the job user* (``sbatch`` typed by hand) names that user in :data:`AS_USER`, and the script
enters the namespace as root, then becomes that user (``nsenter --setuid --setgid``, which also drops
supplementary groups). Run by anyone but root (a job's own ``srun``, already on a node) the script
runs the real command directly. Pure but for :func:`write_shims`.
"""
from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

#: the Slurm commands a learner or distlab runs from the login node
COMMANDS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun", "salloc", "sacct", "sacctmgr", "sstat",
            "sattach", "sprio", "sshare", "strigger")
#: environment variable naming the user a shim runs its command as (set by ``as_job_user``)
AS_USER = "DISTLAB_SLURM_AS"

#: the programs a shim runs, by absolute path (a folder early on PATH cannot stand in for them)
SHIM_TOOLS = ("id", "nsenter", "readlink", "sed", "cut")

SHIM = """#!/bin/sh
# distlab: `{name}` on the cluster's login node ({host}): its controller listens on the nodes' private network.
real={real}
if [ "$({id} -u)" != 0 ]; then exec "$real" "$@"; fi   # not root: already on a node (a job's srun)
gone() {{
    echo "distlab: this Slurm cluster's nodes are gone ({host}'s network is no longer held by the notebook \
that made it, pid {kernel_pid}): nothing was sent. Start a new cluster with distlab.slurm.local_cluster(nodes=...)." >&2
    exit 1
}}
# {host}'s network, through the file the notebook holds open (never through a pid): open it, then check that
# the notebook is still the one that made the cluster (its start time) and that the file is that network
[ -e /proc/{kernel_pid}/fd/{fd} ] && command exec 9</proc/{kernel_pid}/fd/{fd} || gone
[ "$({sed} 's/.*) //' /proc/{kernel_pid}/stat 2>/dev/null | {cut} -d' ' -f20)" = {kernel_start} ] || gone
[ "$({readlink} /proc/self/fd/9)" = "net:[{inode}]" ] || gone
user=${as_user}
unset {as_user}                                     # (not passed on to the job)
if [ -n "$user" ]; then                             # as the job user: enter as root, then become it
    exec {nsenter} --net=/proc/self/fd/9 -S "$({id} -u "$user")" -G "$({id} -g "$user")" -- "$real" "$@"
fi
exec {nsenter} --net=/proc/self/fd/9 -- "$real" "$@"
"""


@dataclass(frozen=True)
class Door:
    """How a shim reaches node0's network: a descriptor the notebook (``kernel_pid``, started at
    ``kernel_start`` clock ticks after boot) holds open on it, and that namespace's inode."""

    kernel_pid: int
    kernel_start: int
    fd: int
    inode: int


def door(held_ns) -> Door:
    """The door to the network that ``held_ns`` (:class:`distlab.nodes.held.Held`) holds open in this process."""
    stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return Door(os.getpid(), int(stat[19]), held_ns.fds["net"], held_ns.inode("net")[1])


def shim_text(name: str, real: str, door: Door, host: str, which=shutil.which) -> str:
    """The script that runs Slurm command ``name`` (found at ``real``) in the network behind ``door``."""
    tools = {t: shlex.quote(which(t, path="/usr/bin:/bin:/usr/sbin:/sbin") or f"/usr/bin/{t}") for t in SHIM_TOOLS}
    return SHIM.format(name=name, real=shlex.quote(real), host=host, as_user=AS_USER, kernel_pid=int(door.kernel_pid),
                       kernel_start=int(door.kernel_start), fd=int(door.fd), inode=int(door.inode), **tools)


def is_shim(path: str) -> bool:
    """A script of this module's (another cluster's login node: a subprocess of a notebook whose cluster
    runs on nodes inherits its PATH)."""
    try:
        with open(path, "rb") as f:
            return b"# distlab: `" in f.read(200)
    except OSError:
        return False


def real_command(name: str, path: str, which=shutil.which) -> str | None:
    """``name`` on ``path``, skipping every folder of login shims: a shim that pointed at another cluster's
    shim would send this cluster's commands to that cluster's controller."""
    dirs = [d for d in path.split(os.pathsep) if d]
    while True:
        found = which(name, path=os.pathsep.join(dirs))
        if found is None or not is_shim(found):
            return found
        dirs = [d for d in dirs if os.path.realpath(d) != os.path.realpath(os.path.dirname(found))]


def write_shims(folder: Path, door: Door, host: str, which=shutil.which, path: str | None = None) -> Path:
    """Write ``folder/bin`` (0700) with one script per Slurm command found on PATH; returns it."""
    bin_dir = Path(folder) / "bin"
    bin_dir.mkdir(mode=0o700, exist_ok=True)
    search = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/usr/bin" if path is None else path
    for name in COMMANDS:
        real = real_command(name, search, which)
        if real is None:
            continue
        shim = bin_dir / name
        shim.write_text(shim_text(name, real, door, host))
        shim.chmod(0o700)
    return bin_dir


def with_bin_first(environ: dict, bin_dir: Path) -> str:
    """PATH with ``bin_dir`` first (once)."""
    parts = [p for p in environ.get("PATH", "").split(os.pathsep) if p and p != str(bin_dir)]
    return os.pathsep.join([str(bin_dir), *parts])


def without_bin(path: str, bin_dir: Path) -> str:
    return os.pathsep.join(p for p in path.split(os.pathsep) if p != str(bin_dir))
