"""Chapter 2: setting up and tearing down the process group.

Helpers the chapter's cells and workers call: a free port, who listens on a port (to see that
``TCPStore`` listens on every interface while distlab's own store listens on loopback only), the
backends this PyTorch build has, and the exercises' self-checks.
"""
from __future__ import annotations

import ipaddress
import socket
import time

LOOPBACK = frozenset({"127.0.0.1", "::1"})
ANY = frozenset({"0.0.0.0", "::"})


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now: bind port 0, let the OS choose, close.

    Between closing and the rank-0 store binding it someone else could take it (a small race);
    distlab avoids even that by keeping its store's socket open for the whole run.
    """
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Whether a store could bind ``port`` on every interface now (as ``TCPStore`` does, with SO_REUSEADDR)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def wait_for_free_port(port: int, timeout: float = 60.0, poll: float = 0.5) -> float:
    """Wait until ``port`` is free (another run of a hard-coded port may hold it); return seconds waited.

    Raises ``TimeoutError`` naming the port, so a chapter fails with the reason rather than with
    ``EADDRINUSE`` in a worker.
    """
    start = time.monotonic()
    while not port_is_free(port):
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"port {port} stayed in use for {timeout:.0f}s: another program listens on it "
                               f"(see who with listening_addresses / psutil.net_connections)")
        time.sleep(poll)
    return time.monotonic() - start


PORT_TAKEN = ("Port {port} is in use on this machine right now ({holder}). The article's setup runs on port "
              "{other} instead in this chapter; pitfall 1 below shows what a taken port does to code that insists.")


def port_for_article(port: int = 12355, wait_s: float = 5.0) -> int:
    """The article's fixed ``port`` when it is free (waiting a few seconds, for an earlier run of the
    same cells to let go of it); otherwise a free port, after saying who holds the fixed one.

    A chapter must not fail because another program on the machine holds 12355 (another notebook
    running the official tutorials, another user): it teaches that collision, it does not suffer it.
    """
    try:
        wait_for_free_port(port, timeout=wait_s, poll=0.25)
        return port
    except TimeoutError:
        pass
    from distlab.rendezvous.loopback import port_holder

    other = free_port()
    print(PORT_TAKEN.format(port=port, holder=port_holder(port), other=other))
    return other


def listening_addresses(port: int) -> set[str]:
    """Local addresses on which some process on this machine listens for TCP on ``port``."""
    import psutil

    found = set()
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            found.add(conn.laddr.ip)
    return found


def listening_pids(port: int) -> set[int]:
    """Process ids (of this user's processes) listening for TCP on ``port``: who hosts a store."""
    import psutil

    return {conn.pid for conn in psutil.net_connections(kind="tcp")
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid}


def tcp_links() -> set[tuple]:
    """This process's established TCP connections as ``(local ip, local port, remote ip, remote port)``."""
    import psutil

    from distlab.worker import own_connections

    return {(_plain(c.laddr.ip), c.laddr.port, _plain(c.raddr.ip), c.raddr.port)
            for c in own_connections(psutil.Process(), "tcp")
            if c.status == psutil.CONN_ESTABLISHED and c.raddr}


def connected(links_a: set, links_b: set, ignore_ports=()) -> bool:
    """Whether a TCP connection joins two processes, given each one's :func:`tcp_links`: one end's
    local address is the other end's remote address. Connections to or from ``ignore_ports`` (a store
    one of them hosts, say) do not count."""
    return any((rip, rport, lip, lport) in links_b for lip, lport, rip, rport in links_a
               if lport not in ignore_ports and rport not in ignore_ports)


def reach(addresses) -> str:
    """``"all interfaces"`` when any address is a wildcard, ``"loopback only"`` when all are
    loopback, else ``"specific interfaces"`` (and ``"nobody"`` for an empty set)."""
    addresses = {_plain(a) for a in addresses}
    if not addresses:
        return "nobody"
    if addresses & ANY:
        return "all interfaces"
    if addresses <= LOOPBACK:
        return "loopback only"
    return "specific interfaces"


def _plain(address: str) -> str:
    """``::ffff:127.0.0.1`` (an IPv4 address on an IPv6 socket) -> ``127.0.0.1``; drops ``%scope``."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def backends_available() -> dict[str, bool]:
    """Which communication backends this PyTorch build can use."""
    import torch.distributed as dist

    return {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(), "mpi": dist.is_mpi_available()}


# --- exercise self-checks ----------------------------------------------------------------------

NO_PORT_INIT_METHODS = frozenset({"file://", "filestore"})
INIT_CHOICES = ("env://", "tcp://", "file://", "tcpstore", "filestore")


def check_no_port_needed(answer) -> None:
    """Exercise 1: which of ``INIT_CHOICES`` need no TCP port at all (so cannot clash on one)?"""
    chosen = {str(a).strip().lower() for a in answer}
    if unknown := chosen - set(INIT_CHOICES):
        raise AssertionError(f"{sorted(unknown)} is not one of the choices {INIT_CHOICES}.")
    if chosen == NO_PORT_INIT_METHODS:
        print("correct: file:// and a FileStore rendezvous through a file every rank can open "
              "(a shared file system across machines); the others need a TCP port on the master.")
        return
    if chosen - NO_PORT_INIT_METHODS:
        raise AssertionError(f"{sorted(chosen - NO_PORT_INIT_METHODS)} open a TCP port on the master (rank 0).")
    raise AssertionError(f"Also {sorted(NO_PORT_INIT_METHODS - chosen)}: look at what the rendezvous is stored in.")


def check_store_counter(value, world_size: int, adds_per_rank: int) -> None:
    """Exercise 2: after every rank called ``store.add("count", adds_per_rank)``, what does
    ``store.add("count", 0)`` return?"""
    expected = world_size * adds_per_rank
    if value == expected:
        print(f"correct: add is atomic on the store's server, so {world_size} ranks x {adds_per_rank} = {expected}.")
        return
    raise AssertionError(f"{value!r} is not it: every rank's add goes to the same key on the one store "
                         "server, which adds atomically; nothing is lost and nothing is per-rank.")


def check_rank_sum(answer, world_size: int) -> None:
    """Exercise 3: what does ``all_reduce`` of ``rank + 1`` give on ``world_size`` ranks?"""
    expected = world_size * (world_size + 1) / 2
    if answer == expected:
        print(f"correct: 1 + 2 + ... + {world_size} = {expected}, on every rank.")
        return
    raise AssertionError(f"{answer!r} is not it: every rank contributes its RANK + 1, and all_reduce sums "
                         "them over all ranks (WORLD_SIZE of them), leaving the sum on every rank.")
