"""Jobs on several nodes: the rendezvous store listens on the address the nodes reach it by, not on every
interface.

torch's ``TCPStore`` server binds every interface (``*:port``) whatever host it is given: torchrun's c10d
rendezvous store, and rank 0's store for ``init_process_group``'s ``env://``. A job on several nodes has
to listen for the other nodes, so it trusts the cluster's network (torch's stores have no
authentication, and torchrun's agent unpickles what it reads from its store). What it need not do is
listen on the node's *other* networks too (a login-facing or public interface): here the server's
socket is bound to the endpoint's own address (the first node's name, resolved as the other nodes
resolve it) and handed to ``TCPStore`` as ``master_listen_fd``. Clients are unchanged.

* ``python -m distlab.slurm.bound torchrun ARGS``: ``torchrun ARGS`` with the c10d backend's store bound
  to the endpoint's address, and the store the agent shares with its workers to the node's address;
* ``python -m distlab.slurm.bound port HOST``: a free port on HOST's address for the rendezvous (:func:`free_port`);
* ``python -m distlab.slurm.bound start RUN_JSON TARGET ARGS``: ``python -m distlab.launch.rank ...`` (a rank of a
  ``mode="tasks"`` job) with rank 0's ``env://`` store bound to MASTER_ADDR.

One-node jobs need none of this: they open no rendezvous port at all (:mod:`distlab.slurm.spec`).
"""
from __future__ import annotations

import socket
import sys


def resolve(host: str) -> tuple[int, str]:
    """(address family, address) of ``host``, as the other nodes would reach it (its first address)."""
    family, _, _, _, addr = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0]
    return family, addr[0]


def bind_to(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``'s address only (port 0: a free one)."""
    from distlab.rendezvous.loopback import listening_socket

    family, address = resolve(host)
    return listening_socket(address, port, family)


def bound_tcpstore(original):
    """``TCPStore`` whose server (``is_master``: a keyword, or the 4th positional argument) listens on its
    host's address only; clients and stores given their own ``master_listen_fd`` are passed through."""

    def make(*args, **kwargs):
        args = list(args)
        master = kwargs.get("is_master", args[3] if len(args) > 3 else False)
        if not master or "master_listen_fd" in kwargs:
            return original(*args, **kwargs)
        host = kwargs["host_name"] if "host_name" in kwargs else args[0]
        port = kwargs["port"] if "port" in kwargs else args[1]
        sock = bind_to(host, int(port))
        if "port" in kwargs:
            kwargs["port"] = sock.getsockname()[1]
        else:
            args[1] = sock.getsockname()[1]
        try:
            store = original(*args, master_listen_fd=sock.fileno(), **kwargs)
        except BaseException:
            try:
                sock.close()
            except OSError:
                sock.detach()
            raise
        sock.detach()  # the store owns the listening fd now
        return store

    make.__wrapped__ = original
    return make


def patch(module) -> None:
    """Make ``module.TCPStore`` (looked up when a store is made) the bound one. Idempotent."""
    if not hasattr(module.TCPStore, "__wrapped__"):
        module.TCPStore = bound_tcpstore(module.TCPStore)


def patch_torchrun() -> None:
    """Both servers torchrun's agent may host: the c10d rendezvous store (on the endpoint's address) and
    the store it shares with its workers (on this node's address, which the workers are given)."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, dynamic_rendezvous

    patch(c10d_rendezvous_backend)
    handler = dynamic_rendezvous.DynamicRendezvousHandler
    if not hasattr(handler._create_tcp_store_server, "__wrapped__"):
        store = bound_tcpstore(dist.TCPStore)

        def server(self, master_addr, master_port):
            return store(host_name=master_addr, port=master_port, is_master=True, multi_tenant=True)

        server.__wrapped__ = handler._create_tcp_store_server
        handler._create_tcp_store_server = server


#: where a rendezvous port is looked for: below Linux's ephemeral range (32768-60999 by default), from which
#: srun and slurmstepd take the ports they listen on. A port found free in that range and released
#: until torchrun binds it can be handed to srun in between (seen here: "Address already in use").
PORTS = range(20000, 32000)


def free_port(host: str, tries: int = 100, rng=None) -> int:
    """A port free on ``host``'s address, outside the ephemeral range (see :data:`PORTS`)."""
    import random

    rng = rng or random.Random()
    for port in rng.sample(PORTS, tries):
        try:
            bind_to(host, port).close()
        except OSError:
            continue
        return port
    raise SystemExit(f"distlab: no free port in {PORTS.start}-{PORTS.stop - 1} on {host} after {tries} tries")


def keep_warning_signals() -> None:
    """torchrun's agent has no handler for SIGUSR1/SIGUSR2 and would die of them (and its ranks with it)
    when Slurm sends the job's warning (``--signal=USR1@90``) to every process of the step. The ranks get
    the signal from Slurm themselves; the agent only has to live through it."""
    import signal

    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda s, f: None)  # not SIG_IGN, which the ranks would inherit
    # (blocked since main() began, and left so: the ranks inherit the mask and start with the warning held
    # until their own handler exists, see distlab.worker.release_on_handler; the agent only has to live,
    # and pass on a warning that came before its ranks existed: pass_early_warnings_on)


def pass_early_warnings_on(agent_class=None) -> None:
    """torchrun's agent starts its ranks in ``_start_workers`` (and again at each restart): right after, the
    warnings that came since, pending in the agent, go to the new ranks that do not hold them
    (:mod:`distlab.slurm.early_warning`). Idempotent."""
    if agent_class is None:
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent as agent_class
    original = agent_class._start_workers
    if getattr(original, "passes_early_warnings_on", False):  # (not __wrapped__: torch's @prof sets that)
        return

    def start_workers(self, worker_group):
        from distlab.slurm import early_warning

        pids = original(self, worker_group)
        early_warning.pass_on(list((pids or {}).values()))
        return pids

    start_workers.__wrapped__ = original
    start_workers.passes_early_warnings_on = True
    agent_class._start_workers = start_workers


def main(argv: list[str]) -> None:
    what, rest = argv[0], argv[1:]
    if what == "port":
        print(free_port(rest[0]))
    elif what == "torchrun":
        import signal

        signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGUSR1, signal.SIGUSR2))  # before importing torch
        from torch.distributed.run import main as torchrun

        patch_torchrun()
        keep_warning_signals()
        pass_early_warnings_on()
        sys.argv = ["torchrun", *rest]
        torchrun(rest)
    elif what == "start":
        import torch.distributed  # noqa: F401  (the attribute `rendezvous` is a function; use the module)

        patch(sys.modules["torch.distributed.rendezvous"])
        from distlab.worker import bootstrap

        bootstrap(rest)
    else:
        raise SystemExit(f"usage: python -m distlab.slurm.bound port HOST|torchrun ARGS|start ARGS (not {what!r})")


if __name__ == "__main__":
    main(sys.argv[1:])
