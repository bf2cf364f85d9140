"""Start-up of the book's Slurm cluster, with job accounting (slurmdbd + its MariaDB) and without it.

    with        slurm.local_cluster(nodes=N): the default, sacct answers
    without     slurm.local_cluster(nodes=N, accounting=False): the cluster as it was before issue #48 item 5

The two alternate in one run (order swapped each round), each timed from the call to the cluster being ready
(every node idle; with accounting, slurmdbd answering and the cluster registered), then stopped (timed apart).
Medians are reported; last line: `ratio: X` = with / without.

Usage: python bench/cluster_startup.py [--rounds 3] [--nodes 2]   (root; run it under the heavy lock: it starts
clusters; --nodes 0: one node, this host)
"""
import argparse
import statistics
import time

from distlab import slurm


def once(nodes: int | None, accounting: bool) -> tuple[float, float]:
    t0 = time.perf_counter()
    cluster = slurm.local_cluster(nodes=nodes, use_existing=False, accounting=accounting)
    up = time.perf_counter() - t0
    assert (cluster.no_accounting is None) == accounting, cluster.no_accounting
    t1 = time.perf_counter()
    cluster.stop()
    return up, time.perf_counter() - t1


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--nodes", type=int, default=2)
    a = p.parse_args()
    nodes = a.nodes or None
    times = {True: [], False: []}
    stops = {True: [], False: []}
    for k in range(a.rounds):
        for accounting in ((True, False) if k % 2 == 0 else (False, True)):
            up, down = once(nodes, accounting)
            times[accounting].append(up)
            stops[accounting].append(down)
        print(f"round {k}: with accounting {times[True][-1]:.2f} s, without {times[False][-1]:.2f} s", flush=True)
    for accounting, label in ((True, "with accounting"), (False, "without")):
        print(f"median {label}: start {statistics.median(times[accounting]):.2f} s, "
              f"stop {statistics.median(stops[accounting]):.2f} s ({a.nodes or 1} node(s), {a.rounds} rounds)")
    print(f"ratio: {statistics.median(times[True]) / statistics.median(times[False]):.2f}")


if __name__ == "__main__":
    main()
