"""What a set of nodes looks like, decided before any process starts (no processes here).

A node is a network namespace with its own host name (``node0``, ``node1``...), one interface
``eth0`` with an address on a private /24, and a link to a bridge in a separate "switch"
namespace. A link's rate is a ``tc`` token bucket (``tbf``) on both of its ends, so it limits
what a node sends and what it receives.
"""
from __future__ import annotations

import json
import re

from distlab.errors import LaunchArgumentError

MAX_NODES = 10  # torch's c10d rendezvous numbers nodes in the order of their host names: up to node9
#                that is node order (node10 would come before node2); and 10 is plenty on a few cores
SUBNET = "10.77.0"  # private, and only ever inside the user's own namespaces (never the host's network)
NODE_IF = "eth0"
SWITCH_BRIDGE = "br0"
RDZV_PORT = 29400  # torchrun's default; free on node 0 whatever the host runs (its own network)
TICK_S = 0.008  # a token bucket's burst must cover about two timer ticks at its rate, or it delivers
#                 a fraction of the rate (measured: 256 kbit at 1 gbit gave 0.28-0.36 of it)
MIN_BURST = 16 * 1024
LATENCY = "20ms"  # how long a packet may queue in the bucket before it is dropped
_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_RATE = re.compile(r"^\s*(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[kmgt]?bit)\s*$", re.IGNORECASE)
RATE_HINT = "Give a rate as tc writes it: a positive number and bit, kbit, mbit, gbit or tbit, e.g. '1gbit', '100mbit'"


def count(n) -> int:
    """The number of nodes, checked: a whole number from 1 to :data:`MAX_NODES`."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise LaunchArgumentError(name="n", value=n, problem="the number of nodes must be an int",
                                                  hint="For example distlab.Nodes(2).")
    if not 1 <= n <= MAX_NODES:
        raise LaunchArgumentError(
            name="n", value=n, problem=f"the number of nodes must be between 1 and {MAX_NODES}",
            hint="torch numbers nodes by sorted host name, which is node order only up to node9; "
                 "a lesson needs 2 to 8.")
    return n


def rate_bits(rate) -> int | None:
    """``rate`` ("1gbit", "100mbit", ...) in bits per second; None (no limit) for None."""
    if rate is None:
        return None
    match = _RATE.match(rate) if isinstance(rate, str) else None
    if match is None or float(match["number"]) <= 0:
        raise LaunchArgumentError(name="rate", value=rate, problem="not a link rate",
                                                  hint=RATE_HINT + ", or None for no limit.")
    bits = float(match["number"]) * _UNITS[match["unit"].lower()]
    if bits < 8000:
        raise LaunchArgumentError(name="rate", value=rate, problem="below 8 kbit, too slow to carry a packet a second",
                                                  hint=RATE_HINT + ".")
    return int(bits)


def burst_bytes(bits: int) -> int:
    """The bucket's size for ``bits`` per second: enough for :data:`TICK_S` of traffic."""
    return max(MIN_BURST, int(bits / 8 * TICK_S))


def shape_command(dev: str, bits: int | None) -> list[str]:
    """The ``tc`` arguments that set ``dev``'s rate (``replace``), or remove any limit (None)."""
    if bits is None:
        return ["qdisc", "del", "dev", dev, "root"]
    return ["qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{bits}bit",
            "burst", str(burst_bytes(bits)), "latency", LATENCY]


def host(node: int) -> str:
    return f"node{node}"


def address(node: int) -> str:
    return f"{SUBNET}.{node + 1}"


def switch_port(node: int) -> str:
    """The switch's end of node ``node``'s link."""
    return f"n{node}"


def mapped_alias(node: int) -> str:
    """The name of node ``node``'s IPv4-mapped IPv6 address (``::ffff:10.77.0.1``): its own alias, so that
    the node's name resolves to one address, as a real host's does."""
    return f"{host(node)}-v4mapped"


def hosts_file(n: int) -> str:
    """``/etc/hosts`` as every node sees it: localhost, and each node's name at its one (IPv4) address.

    torch's TCP store listens on IPv6 and sees its IPv4 peers as ``::ffff:a.b.c.d``; asking the name of
    such a peer without a line for it goes to DNS, which no node reaches (c10d warned "hostname of the
    client socket cannot be retrieved"). So each mapped address has a line too, under its own alias
    (:func:`mapped_alias`), never under the node's name: ``hostname --ip-address`` on a node, which batch
    scripts paste into ``--rdzv_endpoint``, must print one address."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{address(k)}\t{host(k)}" for k in range(n)]
    lines += [f"::ffff:{address(k)}\t{mapped_alias(k)}" for k in range(n)]
    return "\n".join(lines) + "\n"


def node_index(node, n: int) -> int:
    """``node`` checked against ``n`` nodes; a host name ``"node1"`` is accepted too."""
    if isinstance(node, str) and re.fullmatch(r"node\d+", node):
        node = int(node[4:])
    if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < n:
        raise LaunchArgumentError(name="node", value=node, problem=f"there are nodes 0 to {n - 1}",
                                                  hint="Give a node's index or its host name, e.g. 1 or 'node1'.")
    return node


def traffic(ip_json: str, n: int) -> dict[int, dict[str, int]]:
    """Bytes and packets each node sent and received, from ``ip -j -s link show`` in the switch.

    The switch's port of a node receives what the node sends, and the other way round."""
    ports = {item["ifname"]: item["stats64"] for item in json.loads(ip_json) if "stats64" in item}
    out = {}
    for k in range(n):
        stats = ports.get(switch_port(k))
        if stats is None:
            continue
        out[k] = {"sent_bytes": stats["rx"]["bytes"], "received_bytes": stats["tx"]["bytes"],
                  "sent_packets": stats["rx"]["packets"], "received_packets": stats["tx"]["packets"]}
    return out
