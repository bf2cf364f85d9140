"""Several machines on one (issues #35, #46): how fast nodes come up and launch, how faithful their links are.

    python bench/nodes.py [--repeats 5] [--rate 1gbit] [--mb 64] [--no-links]

Launch rows, side by side in one run (median of --repeats warm launches; start="forkserver", the default):
    spawn 1 machine x 2          a trivial 2-rank distlab.spawn on this machine (the baseline)
    spawn 2 nodes x 1            the same job, one rank on each of 2 nodes: one torchelastic agent per node,
                                 c10d rendezvous at node0 (goal: <= 3 x the baseline)
    spawn 2 nodes x 2, 4 nodes x 1
    spawn 2 nodes x 1, fresh     start="spawn": fresh interpreters (agents and ranks import torch), once
    Ranks(2) ready / exec        warm ranks on this machine: ready, and an exec round trip
    Ranks(1, nodes=2) ready      warm ranks on 2 nodes (goal: <= 0.3 s), and an exec on them (goal: <= 5 ms)
Link rows (unless --no-links):
    up 2 nodes / up 4 nodes      wall time of distlab.Nodes(n) until every node is linked (goal: <= 1 s for 2)
    tcp at RATE                  one TCP connection node0 -> node1, / the set rate (goal >= 0.9)
    gloo all-reduce MB at RATE   the link's bound (2 (n-1)/n x MB over RATE) / the time it took (goal >= 0.9)
    tcp unshaped                 the same TCP transfer with no limit (what the machine itself gives)

Last line: ``ratio: X`` = 2-node spawn / one-machine spawn, both warm, in this run (goal <= 3).
The figures depend on the load: say what ran beside it.
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


def spawn_s(nprocs: int, nodes=None, start: str = "auto") -> float:
    import distlab

    start_t = time.perf_counter()
    res = distlab.spawn(trivial, nprocs=nprocs, nodes=nodes, start=start, view=None, timeout=600)
    took = time.perf_counter() - start_t
    assert set(res.returns.values()) == {float(nprocs * (1 if nodes is None else nodes.n))}
    return took


def warm_spawn_s(repeats: int, nprocs: int, nodes=None) -> float:
    """Median of ``repeats`` launches after a first one (which may start the forkserver)."""
    spawn_s(nprocs, nodes)
    times = []
    for _ in range(repeats):
        time.sleep(0.2)  # as between a learner's cells: the server forks its spares meanwhile
        times.append(spawn_s(nprocs, nodes))
    return statistics.median(times)


def ranks_s(repeats: int, nodes=None) -> tuple[float, float]:
    """(median seconds until Ranks is ready, median seconds of an exec round trip on them)."""
    import distlab

    ready, execs = [], []
    for _ in range(repeats):
        time.sleep(0.2)
        start = time.perf_counter()
        ranks = distlab.Ranks(1 if nodes is not None else 2, nodes=nodes)
        ready.append(time.perf_counter() - start)
        ranks.exec("t = torch.ones(1); dist.all_reduce(t)")
        for _ in range(20):
            start = time.perf_counter()
            ranks.exec("dist.all_reduce(t)")
            execs.append(time.perf_counter() - start)
        ranks.close()
    return statistics.median(ready), statistics.median(execs)


def launch_rows(repeats: int) -> dict[str, tuple[str, float, str]]:
    """name -> (kind, value, goal) for every launch row, measured in one run."""
    rows = {}
    one = warm_spawn_s(repeats, 2)
    rows["spawn 1 machine x 2 ranks (s)"] = ("baseline", one, "")
    ready, exec_s = ranks_s(repeats)
    rows["Ranks(2) ready (s)"] = ("1 machine", ready, "<= 0.5")
    rows["Ranks(2) exec all_reduce (ms)"] = ("1 machine", exec_s * 1000, "<= 2")
    with Nodes(2) as nodes:
        two = warm_spawn_s(repeats, 1, nodes)
        rows["spawn 2 nodes x 1 rank (s)"] = ("nodes", two, "")
        rows["spawn 2 nodes x 1 / 1 machine x 2"] = ("ratio", two / one, "<= 3")
        rows["spawn 2 nodes x 2 ranks (s)"] = ("nodes", warm_spawn_s(repeats, 2, nodes), "")
        ready, exec_s = ranks_s(repeats, nodes)
        rows["Ranks(1, nodes=Nodes(2)) ready (s)"] = ("nodes", ready, "<= 0.3")
        rows["Ranks(1, nodes=Nodes(2)) exec all_reduce (ms)"] = ("nodes", exec_s * 1000, "<= 5")
        spawn_s(1, nodes, start="spawn")  # its standbys start: the next one is as warm as that path gets
        time.sleep(5)
        rows["spawn 2 nodes x 1, start='spawn' (s), once"] = ("fresh", spawn_s(1, nodes, start="spawn"), "")
    with Nodes(4) as four:
        rows["spawn 4 nodes x 1 rank (s)"] = ("nodes", warm_spawn_s(repeats, 1, four), "")
    return rows


def link_rows(args) -> dict[str, tuple[str, float, str]]:
    bits = rate_bits(args.rate)
    rows = {}
    for n in (2, 4):
        rows[f"up {n} nodes (s)"] = ("nodes", statistics.median(up_time(n) for _ in range(args.repeats)),
                                     "<= 1" if n == 2 else "")
    with Nodes(2, link=args.rate) as nodes:
        nbytes = int(bits / 8 * 2)  # two seconds at the set rate
        rows[f"tcp at {args.rate} / rate"] = ("ratio", statistics.median(
            tcp_rate(nodes, nbytes) / bits for _ in range(args.repeats)), ">= 0.9")
        bound = 2 * (2 - 1) / 2 * args.mb * 2**20 * 8 / bits
        gloo = statistics.median(bound / allreduce_s(nodes, args.mb) for _ in range(args.repeats))
        rows[f"gloo all-reduce {args.mb} MB at {args.rate}: bound / time"] = ("ratio", gloo, ">= 0.9")
        nodes.link(1, None)
        nodes.link(0, None)
        rows["tcp unshaped (Gbit/s)"] = ("nodes", tcp_rate(nodes, 2 * 10**9 // 8) / 1e9, "")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--no-links", action="store_true", help="launch rows only")
    args = parser.parse_args()
    rows = launch_rows(args.repeats)
    if not args.no_links:
        rows.update(link_rows(args))
    print(f"{'':50s} {'where':>10s} {'value':>9s}  goal")
    for name, (kind, value, goal) in rows.items():
        print(f"{name:50s} {kind:>10s} {value:9.3f}  {goal}")
    print(f"ratio: {rows['spawn 2 nodes x 1 / 1 machine x 2'][1]:.3f}")


if __name__ == "__main__":
    main()
