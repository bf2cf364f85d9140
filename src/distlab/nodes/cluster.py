"""``distlab.Nodes``: several machines on one, each a network namespace with a rate-limited link.

    nodes = distlab.Nodes(2, link="1gbit")
    nodes.run(1, "hostname; getent hosts node0")   # node1 / 10.77.0.1 node0
    nodes.link(1, rate="100mbit")                  # change node 1's link while it runs
    nodes.traffic()                                # bytes each node sent and received
    nodes.close()                                  # nothing is left: namespaces, links, processes

See :mod:`distlab.nodes.namespaces` for how they are held and why nothing outlives them.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import weakref

from distlab.errors import NODE_COMMAND, DistlabError, NodesError
from distlab.folders import private, privtmp
from distlab.nodes import held, namespaces, plan

_OPEN: weakref.WeakSet = weakref.WeakSet()  # every Nodes not closed yet


def open_nodes() -> list[Nodes]:
    return list(_OPEN)


class Nodes:
    """Several machines on this one: ``n`` nodes named ``node0``, ``node1``, ..., each with its own
    host name, address and ``/etc/hosts``; each resolves the others' names and reaches them over its
    own link, limited to ``link`` (``"1gbit"``, ``"100mbit"``, ...; ``None``: as fast as the machine goes).

    Each node is a network namespace on a private network that the host and other users cannot reach.
    Pass the nodes to :func:`distlab.spawn`, :func:`distlab.launch` or :class:`distlab.Ranks`
    (``nodes=``) to run ranks on them, or to ``slurm.local_cluster(nodes=...)``. ``close()`` (or the
    end of a ``with`` block, the kernel's exit or its SIGKILL) leaves nothing behind. Where the
    platform refuses namespaces (an unprivileged container), it raises :class:`NodesError` saying
    which setting refuses them; it never falls back to loopback. Example::

        with distlab.Nodes(2, link="1gbit") as nodes:
            res = distlab.spawn(fn, nprocs=1, nodes=nodes)
            nodes.run(1, "hostname; getent hosts node0")
            nodes.link(1, "100mbit")
    """

    def __init__(self, n: int = 2, link: str | None = None):
        self.n = plan.count(n)
        bits = plan.rate_bits(link)
        namespaces.check_possible()
        self._holders: list[subprocess.Popen] = []
        self._held: list[held.Held] = []  # [switch, node0, node1, ...]: the namespaces, open until close()
        self._on_close: list = []
        # the nodes' TMPDIRs (made on first use): torchrun typed on a node makes torchelastic_* folders there
        self._tmp: list[str] = []
        self._finalizer = weakref.finalize(self, _end, self._holders, self._held, self._on_close, self._tmp)
        privtmp.finish_exit_handlers_despite_sigterm()  # at the kernel's exit, the nodes close to the end
        try:
            self._start(bits)
        except BaseException:
            self.close()
            raise
        self.rates = {k: bits for k in range(self.n)}
        _OPEN.add(self)

    def _start(self, bits: int | None) -> None:
        switch, self._switch = namespaces.start_switch()
        self._holders.append(switch)
        self._held.append(self._switch)
        with tempfile.TemporaryDirectory(dir=private.private_root()) as folder:
            hosts = os.path.join(folder, "hosts")  # bound into each node, then deleted with its folder:
            with open(hosts, "w") as f:             # a bind mount keeps the file's contents alive
                f.write(plan.hosts_file(self.n))
            os.chmod(hosts, 0o644)  # (the folder stays 0700: inside the user namespace we are still its owner)
            self._nodes: list[held.Held] = []
            for k in range(self.n):
                proc, node = namespaces.start_node(self._switch, k, hosts)
                self._holders.append(proc)
                self._held.append(node)
                self._nodes.append(node)
        namespaces.link_nodes(self._switch, self._nodes)
        if bits is not None:
            for k in range(self.n):
                namespaces.shape(self._switch, self._nodes[k], k, bits)

    @property
    def pids(self) -> list[int]:
        """The holders' pids, for display only: distlab never reaches a node through a pid (a dead
        node's pid may belong to anyone); :meth:`netns` names a node's network for ``ip ... netns``."""
        return [h.pid for h in self._nodes]

    def netns(self, node) -> str:
        """A path naming node ``node``'s network namespace in commands started by :meth:`run` and
        :meth:`popen` (``ip link add ... netns PATH``): they inherit the file these nodes hold open, so
        the path reaches that node or nothing, never whatever holds a pid now."""
        k = plan.node_index(node, self.n)
        self._check_open()
        self._nodes[k].check()
        return self._nodes[k].inherited("net")

    def namespaces_of(self, node) -> held.Held:
        """Node ``node``'s namespaces as these nodes hold them open (for a door such as Slurm's login shims)."""
        k = plan.node_index(node, self.n)
        self._check_open()
        self._nodes[k].check()
        return self._nodes[k]

    def entry(self, node) -> dict:
        """What a process forked from distlab's forkserver needs to run on node ``node``
        (:mod:`distlab.forkserver.enter`): the namespace files these nodes hold open (their
        descriptors, which travel with the fork request) and the PATH a program there gets."""
        h = self.namespaces_of(node)
        return {"fds": dict(h.fds), "env": {"PATH": namespaces.with_system_dirs(os.environ.get("PATH", ""))}}

    def _net_fds(self) -> tuple[int, ...]:
        return tuple(h.fds["net"] for h in self._nodes if "net" in h.fds)

    @property
    def hosts(self) -> list[str]:
        return [plan.host(k) for k in range(self.n)]

    @property
    def addresses(self) -> list[str]:
        return [plan.address(k) for k in range(self.n)]

    def link(self, node, rate: str | None) -> None:
        """Set node ``node``'s link to ``rate`` (both directions) now; None removes the limit."""
        k = plan.node_index(node, self.n)
        bits = plan.rate_bits(rate)
        self._check_open()
        namespaces.shape(self._switch, self._nodes[k], k, bits)
        self.rates[k] = bits

    def traffic(self) -> dict[int, dict[str, int]]:
        """node -> bytes and packets it sent and received on its link so far (the kernel's counters)."""
        self._check_open()
        return plan.traffic(namespaces.link_stats(self._switch), self.n)

    def command(self, node, argv: list[str]) -> list[str]:
        """``argv`` prefixed so that it runs on node ``node`` (its network, host name and hosts file)."""
        k = plan.node_index(node, self.n)
        self._check_open()
        return [*namespaces.enter(self._nodes[k], uts_and_mounts=True), *argv]

    def _typed(self, node, argv: list[str]) -> list[str]:
        """:meth:`command` for what a learner runs on a node (:meth:`run`, :meth:`popen`): with the node's
        own ``TMPDIR``."""
        return self.command(node, [namespaces.tool("env"), f"TMPDIR={self.tmpdir(node)}", *argv])

    def tmpdir(self, node) -> str:
        """Node ``node``'s temporary folder, the ``TMPDIR`` of :meth:`run` and :meth:`popen`: private (0700, in
        this process's own folder in your runs root), so what programs leave in their temp dir (torchrun's
        ``torchelastic_*`` folders) never lands in the machine's shared one; it goes when the nodes close (or
        with this process's folder: after a SIGKILL, the next kernel's start removes it)."""
        k = plan.node_index(node, self.n)
        if not self._tmp:
            self._tmp.append(str(privtmp.work_folder("nodes-tmp-")))
        path = os.path.join(self._tmp[0], plan.host(k))
        os.makedirs(path, mode=0o700, exist_ok=True)
        return path

    def run(self, node, command: str, *, check: bool = True, timeout: float | None = None,
            capture: bool = True) -> subprocess.CompletedProcess:
        """Run shell ``command`` on node ``node``, as a learner would type it on that machine (its ``TMPDIR``
        the node's own, :meth:`tmpdir`);
        raise :class:`~distlab.errors.NodesError` naming the node when it fails (``check``)."""
        argv = self._typed(node, ["sh", "-c", command])
        done = subprocess.run(argv, capture_output=capture, text=True, timeout=timeout, pass_fds=self._net_fds())
        if check and done.returncode != 0:
            k = plan.node_index(node, self.n)
            raise NodesError(NODE_COMMAND.format(node=k, host=plan.host(k), command=command, code=done.returncode,
                                                 output=((done.stdout or "") + (done.stderr or "")).strip()[-2000:],
                                                 hint="Fix the command (run it with check=False to read its output)."))
        return done

    def popen(self, node, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` on node ``node`` and return without waiting for it to end (a server, a long run),
        with the node's ``TMPDIR`` (:meth:`tmpdir`). It returns once the program runs on the node, so that
        :meth:`kill_processes` and :meth:`close`, which find a node's processes by its namespace, find it
        even when called at once (:func:`~distlab.nodes.namespaces.wait_entered`)."""
        k = plan.node_index(node, self.n)
        argv = self._typed(k, argv)
        kwargs["pass_fds"] = (*kwargs.get("pass_fds", ()), *self._net_fds())
        proc = subprocess.Popen(argv, **kwargs)
        namespaces.wait_entered(proc, self._nodes[k].inode("net"))
        return proc

    def kill_processes(self, node, mark: str | None = None) -> list[int]:
        """Kill every process running on node ``node`` now, as when that machine's processes die
        (a crash, the OOM killer); the node, its address and its link stay. With ``mark``
        (``NAME=VALUE``) only the processes started with it in their environment: one run's, not
        what other cells started there. Their pids."""
        k = plan.node_index(node, self.n)
        self._check_open()
        self._nodes[k].check()
        return namespaces.kill_inside(self._nodes[k], mark=mark)

    def alive(self, node) -> bool:
        """Whether node ``node`` still stands (its holder runs)."""
        return not self.closed and self._nodes[plan.node_index(node, self.n)].alive()

    def on_close(self, callback) -> None:
        """Call ``callback()`` when these nodes close (a cluster on them stops with them)."""
        self._on_close.append(callback)

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise NodesError("distlab: these nodes are closed; make new ones with distlab.Nodes(...).")

    def close(self) -> None:
        """End every node: their processes, namespaces, links and mounts go with their holders."""
        _OPEN.discard(self)
        self._finalizer()

    def holder_pids(self) -> set[int]:
        """The processes that hold the namespaces (``unshare``, ``sh``, ``cat``; kept on purpose
        until :meth:`close`), not what runs on the nodes."""
        import psutil

        pids = set()
        for proc in self._holders:
            try:
                root = psutil.Process(proc.pid)
                pids |= {root.pid, *(p.pid for p in root.children(recursive=True))}
            except psutil.Error:
                continue
        return pids

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self) -> Nodes:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ", ".join(
            f"{plan.host(k)} {plan.address(k)} {self._rate_text(k)}" for k in range(self.n))
        return f"Nodes({self.n}: {state})"

    def _rate_text(self, k: int) -> str:
        bits = self.rates.get(k)
        return "unlimited" if bits is None else f"{bits / 1e6:g} Mbit/s"


def _end(holders: list[subprocess.Popen], helds: list[held.Held], on_close: list, tmp: list[str]) -> None:
    """Close nodes: what depends on them first, then every process still on a node (found by the
    namespace it holds, also when its holder died), then the holders, then the namespace files and the
    nodes' temporary folders."""
    for callback in list(on_close):
        try:
            callback()
        except Exception:  # (a cluster that fails to stop must not keep the nodes open)
            pass
    for h in helds[1:]:
        try:
            namespaces.kill_inside(h)
        except (OSError, NodesError):
            pass
    namespaces.stop(holders)
    for h in helds:
        h.close()
    for folder in tmp:
        shutil.rmtree(folder, ignore_errors=True)
    _remove_folders_of_the_killed()


def _remove_folders_of_the_killed() -> None:
    """The private temporary folders of the processes just killed on the nodes: killed, they could not
    remove their own, and by their names (``proc-node0-...``) they are another machine's; their stamps
    say they were this machine's (:func:`distlab.folders.private.stale_dirs`)."""
    try:
        for folder in private.stale_dirs(private.private_root()):
            shutil.rmtree(folder, ignore_errors=True)
    except (OSError, DistlabError):  # closing must not fail over a folder: the next prune takes it
        pass
