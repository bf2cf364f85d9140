"""Several machines on one (issue #35): how fast nodes come up, and how faithful their links are.

    python bench/nodes.py [--repeats 5] [--rate 1gbit] [--mb 64]

Rows (each median of --repeats):
    up 2 nodes / up 4 nodes      wall time of distlab.Nodes(n) until every node is linked (goal: <= 1 s for 2)
    tcp at RATE                  bytes node0 sends node1 over one TCP connection per second, / the set rate
                                 (goal >= 0.9)
    gloo all-reduce MB at RATE   gloo's all-reduce of MB between a rank on each node: the link's bound
                                 (2 (n-1)/n x MB over RATE) / the time it took (goal >= 0.9)
    tcp unshaped                 the same TCP transfer with no limit (what the machine itself gives)
    spawn 2 nodes x 1 / 1 x 2    a trivial distlab.spawn on 2 nodes with 1 rank each, against 2 ranks on one
                                 node started the same way (fresh interpreters, start="spawn") (goal <= 2)
    spawn 8 nodes x 1 (s)        the same trivial spawn on 8 nodes of this machine: that it runs, and how long

Last line: ``ratio: X`` = gloo all-reduce fidelity (1.0: the link's bound exactly).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import textwrap
import time

from distlab.nodes.cluster import Nodes
from distlab.nodes.plan import rate_bits

RECEIVER = textwrap.dedent("""
    import socket, sys, time
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 29555)); s.listen(1); print("ready", flush=True)
    c, _ = s.accept(); got = 0; first = None
    while True:
        b = c.recv(1 << 20)
        if not b: break
        if first is None: first = time.perf_counter()
        got += len(b)
    print(got, time.perf_counter() - first, flush=True)
""")
SENDER = textwrap.dedent("""
    import socket, sys
    total = int(sys.argv[1]); chunk = b"x" * (1 << 20)
    c = socket.create_connection(("node1", 29555))
    while total > 0:
        c.sendall(chunk[:min(total, len(chunk))]); total -= len(chunk)
    c.close()
""")
ALLREDUCE = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist
    rank = int(sys.argv[1]); mb = int(sys.argv[2])
    dist.init_process_group("gloo", init_method="tcp://node0:29556", rank=rank, world_size=2)
    t = torch.ones(mb * 2**20 // 4)
    dist.all_reduce(torch.ones(16)); dist.barrier()
    start = time.perf_counter(); dist.all_reduce(t); took = time.perf_counter() - start
    assert t[0].item() == 2
    if rank == 0: print(took, flush=True)
    dist.destroy_process_group()
""")


def up_time(n: int) -> float:
    start = time.perf_counter()
    nodes = Nodes(n)
    took = time.perf_counter() - start
    nodes.close()
    return took


def tcp_rate(nodes: Nodes, nbytes: int) -> float:
    """Bits per second one TCP connection carried from node0 to node1."""
    receiver = nodes.popen(1, [sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout.readline().strip() == "ready"
        nodes.run(0, f"{sys.executable} -c '{SENDER}' {nbytes}")
        got, seconds = receiver.stdout.readline().split()
    finally:
        receiver.kill()
        receiver.wait()
    return int(got) * 8 / float(seconds)


def allreduce_s(nodes: Nodes, mb: int) -> float:
    ranks = [nodes.popen(k, [sys.executable, "-c", ALLREDUCE, str(k), str(mb)], stdout=subprocess.PIPE, text=True)
             for k in (0, 1)]
    out = ranks[0].communicate(timeout=300)[0]
    ranks[1].wait(timeout=60)
    assert all(r.returncode == 0 for r in ranks), "a rank failed"
    return float(out.strip().splitlines()[-1])


def trivial(rank):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()


def spawn_s(nprocs: int, nodes=None) -> float:
    import distlab

    start = time.perf_counter()
    res = distlab.spawn(trivial, nprocs=nprocs, nodes=nodes, start="spawn", view=None, timeout=600)
    took = time.perf_counter() - start
    assert set(res.returns.values()) == {float(nprocs * (1 if nodes is None else nodes.n))}
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--mb", type=int, default=64)
    args = parser.parse_args()
    bits = rate_bits(args.rate)
    rows = {}
    for n in (2, 4):
        rows[f"up {n} nodes (s)"] = statistics.median(up_time(n) for _ in range(args.repeats))
    with Nodes(2, link=args.rate) as nodes:
        nbytes = int(bits / 8 * 2)  # two seconds at the set rate
        rows[f"tcp at {args.rate} / rate"] = statistics.median(tcp_rate(nodes, nbytes) / bits
                                                               for _ in range(args.repeats))
        bound = 2 * (2 - 1) / 2 * args.mb * 2**20 * 8 / bits
        gloo = statistics.median(bound / allreduce_s(nodes, args.mb) for _ in range(args.repeats))
        rows[f"gloo all-reduce {args.mb} MB at {args.rate}: bound / time"] = gloo
        nodes.link(1, None)
        nodes.link(0, None)
        rows["tcp unshaped (Gbit/s)"] = tcp_rate(nodes, 2 * 10**9 // 8) / 1e9
        pairs = [(spawn_s(1, nodes), spawn_s(2)) for _ in range(args.repeats)]
        rows["spawn 2 nodes x 1 rank / 1 node x 2 ranks"] = statistics.median(a / b for a, b in pairs)
    with Nodes(8) as eight:
        rows["spawn 8 nodes x 1 rank (s)"] = spawn_s(1, eight)
    for name, value in rows.items():
        print(f"{name:55s} {value:8.3f}")
    print(f"ratio: {gloo:.3f}")


if __name__ == "__main__":
    main()
