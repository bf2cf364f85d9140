"""A node's identity: its namespaces, held open by this process from the moment the node is ready.

A pid is not an identity. When a holder dies, its pid is free, and another user's process that gets
it may sit in namespaces of its own: ``nsenter -t PID`` would then run root's next command in them
(issue #45). So each namespace set is addressed only through files this process holds open, which
point at the namespaces themselves, whoever holds which pid:

* :func:`hold` opens ``/proc/PID/ns/*`` of a holder it has proved is the right process: a pidfd pins
  the process, its parent is the ``unshare`` that is this process's own child (a child's pid cannot
  be reused until it is reaped), and the pidfd still reports it alive after the files are open.
* Commands enter through ``/proc/<this pid>/fd/<n>`` (``nsenter --net=...``): started by this
  process, they open this process's own, live descriptors, so they reach the node or nothing.
* A held file keeps its namespace alive even if the holder dies; :meth:`Held.check` refuses to run
  anything on a node whose holder died ("node 1 is gone"), and closing the files frees it.

Runs in the kernel. Only ``/proc``, ``os`` and ``select``: no processes.
"""
from __future__ import annotations

import os
import select
from dataclasses import dataclass, field
from pathlib import Path

from distlab.errors import NODE_GONE, NodesError

#: the namespaces each holder has (a switch: only its network; a node: network, host name, mounts)
KINDS = {"switch": ("net",), "node": ("net", "uts", "mnt")}
#: nsenter's option for each kind of namespace file
OPTION = {"net": "--net", "uts": "--uts", "mnt": "--mount", "user": "--user"}


@dataclass
class Held:
    """One holder's namespaces, open in this process. ``name``: how errors name it ("node 1", "switch")."""

    name: str
    pid: int                       # the holder (shell) inside the namespaces: for display and tests only
    starter_pid: int               # the ``unshare`` that made it: this process's child
    pidfd: int
    fds: dict[str, int] = field(default_factory=dict)

    def alive(self) -> bool:
        """Whether the holder still runs (its pidfd turns readable when it exits)."""
        if self.pidfd < 0:
            return False
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        return not poller.poll(0)

    def check(self) -> None:
        """Raise :class:`NodesError` unless the holder still runs: nothing may run on a dead node."""
        if not self.alive():
            raise NodesError(NODE_GONE.format(node=self.name))

    def inode(self, kind: str = "net") -> tuple[int, int]:
        """(device, inode) of the held namespace: what identifies it, unlike a pid or a link's text."""
        st = os.fstat(self.fds[kind])
        return st.st_dev, st.st_ino

    def path(self, kind: str) -> str:
        """A path that opens the held namespace ``kind``, for a process this process starts."""
        return f"/proc/{os.getpid()}/fd/{self.fds[kind]}"

    def inherited(self, kind: str = "net") -> str:
        """The path for a process that inherited the descriptor (``pass_fds``): ``/proc/self/fd/N``. A
        process inside a user namespace may not open this process's ``/proc/PID/fd`` (ptrace rules), only
        its own."""
        return f"/proc/self/fd/{self.fds[kind]}"

    def nsenter_options(self, kinds) -> list[str]:
        return [f"{OPTION[k]}={self.path(k)}" for k in kinds]

    def close(self) -> None:
        """Let go of the namespaces (they end once nothing else holds them)."""
        for fd in [*self.fds.values(), self.pidfd]:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.fds, self.pidfd = {}, -1


def parent_pid(pid: int) -> int:
    """The parent of ``pid`` from ``/proc/PID/stat`` (after the command name, which may hold spaces)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def hold(name: str, pid: int, starter_pid: int, kinds: tuple[str, ...]) -> Held:
    """Open holder ``pid``'s namespace files, proving first that ``pid`` is the child of ``starter_pid``
    (our own unreaped child) and afterwards that it never stopped being that process."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as e:
        raise NodesError(NODE_GONE.format(node=name) + f" ({e})") from None
    held = Held(name, pid, starter_pid, pidfd)
    try:
        if parent_pid(pid) != starter_pid:
            raise NodesError(NODE_GONE.format(node=name) + f" (pid {pid} is not the holder distlab started)")
        for kind in kinds:
            held.fds[kind] = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
        held.check()  # alive now: so it was this process all along, and the files are its namespaces
    except OSError as e:
        held.close()
        raise NodesError(NODE_GONE.format(node=name) + f" ({e})") from None
    except BaseException:
        held.close()
        raise
    return held


def own_inode(kind: str = "net") -> tuple[int, int]:
    st = os.stat(f"/proc/self/ns/{kind}")
    return st.st_dev, st.st_ino


def members(net: tuple[int, int], keep: set[int], mark: str | None = None) -> list[int]:
    """Pids of processes whose network namespace is ``net`` (device, inode), except ``keep``; with
    ``mark`` (``NAME=VALUE``) only those started with it in their environment (one run's processes,
    found even when they left its process group or session, as torchrun's ranks do)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in keep:
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:  # gone, or not ours to look at
            continue
        if (st.st_dev, st.st_ino) == net and (mark is None or carries(int(entry), mark)):
            found.append(int(entry))
    return found


def carries(pid: int, mark: str) -> bool:
    """Whether process ``pid`` was started with ``mark`` (``NAME=VALUE``) in its environment. The
    environment it was started with, which its children inherit, not what it set later."""
    try:
        return mark.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or not ours to read
        return False
