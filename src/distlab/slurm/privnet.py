"""The one-host cluster's private network: a network namespace with loopback alone, held like a node's.

On this host (no :class:`distlab.Nodes`), slurmctld, slurmd and slurmdbd listen on loopback. In the
host's own network any local user may bind a port before a daemon does and receive what is sent there
(root's readiness probes carry a munge credential), or reach the daemons' ports. So wherever a network
namespace can be made, these daemons run in one of the cluster's own, whose loopback nobody else is on:
their ports are Slurm's defaults there, and no port of theirs exists in the host's network. munged and
MariaDB stay on the host (they listen on sockets in folders only the cluster reaches, no port).

The namespace is held as a node's is (:mod:`distlab.nodes.namespaces`): a holder process keeps it while its
input, a pipe from the kernel, stays open, and then kills whatever still runs in it; this process holds the
namespace's file open and every command enters through that file, never a pid. Slurm's commands typed in
the notebook reach the daemons as they reach a cluster on nodes, through the login shims
(:mod:`distlab.slurm.login`). Where namespaces are refused (a container), :func:`start` returns None and
the daemons listen on the host's loopback, each checked to be the listener on its port before anything is
sent there (:func:`distlab.slurm.daemons.who_listens`).

Runs in the kernel.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from distlab.errors import NodesError
from distlab.nodes import held, namespaces

#: the holder: loopback up, then hold (and at the end kill what still runs in the namespace). A second address
#: on loopback, 127.0.0.2: Slurm resolves host names with ``AI_ADDRCONFIG``, which glibc answers for IPv4 only
#: where some address other than 127.0.0.1 is configured (with 127.0.0.1 alone, "Unable to resolve" the host)
NET_SH = '"$1" link set lo up && "$1" addr add 127.0.0.2/8 dev lo && ' + namespaces.HOLD


@dataclass
class PrivateNet:
    """The cluster's network namespace, held open by this process until :meth:`close`."""

    proc: subprocess.Popen
    held: held.Held

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` prefixed so that it runs in this network (``nsenter`` execs it: the pid is the program's)."""
        self.held.check()
        return [namespaces.tool("nsenter"), f"--net={self.held.path('net')}", "--", *argv]

    def close(self) -> None:
        """End the holder (it kills what still runs in the network), then let go of the namespace."""
        namespaces.stop([self.proc])
        self.held.close()


def start() -> PrivateNet | None:
    """A new private network for the cluster; None where this process may not make one (not root, a
    container's seccomp filter, no ``unshare``/``nsenter``/``ip``)."""
    return finish(begin())


def begin() -> subprocess.Popen | None:
    """Start the holder (it comes up while the cluster starts its other parts: :func:`finish`); None where
    this process may not make the network."""
    tools = [namespaces.tool(name) for name in ("unshare", "nsenter", "ip")]
    if os.geteuid() != 0 or None in tools:
        return None
    argv = [tools[0], "--net", "--kill-child", "--fork", "/bin/sh", "-c", NET_SH, "cluster-net", tools[2]]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def abandon(proc: subprocess.Popen | None) -> None:
    """End a holder :func:`begin` started that :func:`finish` never took (the start failed in between)."""
    if proc is not None:
        namespaces.stop([proc])


def finish(proc: subprocess.Popen | None) -> PrivateNet | None:
    """The network :func:`begin` started, held open once its holder is ready; None where it failed (the
    holder's first line is not its pid: namespaces refused)."""
    if proc is None:
        return None
    line = proc.stdout.readline()
    proc.stdout.close()
    if not line.strip().isdigit():
        namespaces.stop([proc])
        return None
    try:
        return PrivateNet(proc, held.hold("the cluster's network", int(line), proc.pid, ("net",)))
    except NodesError:
        namespaces.stop([proc])
        return None
    except BaseException:
        namespaces.stop([proc])
        raise
