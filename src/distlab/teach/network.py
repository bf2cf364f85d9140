"""Chapter 14: the network between machines. Pure helpers, no processes.

The chapter measures collectives and DDP steps on :class:`distlab.Nodes`; what it measures them
against lives here, so that unit tests can check it without starting anything:

* the bandwidth law of a ring all-reduce (:func:`ring_bytes`, :func:`bound_s`) and the table that
  sets measurements beside it (:func:`law_rows`);
* the kernel's byte counters of an interface (:func:`net_dev`, :func:`sent_bytes`), which a rank
  reads on its own node to count what crossed the link;
* what crosses the slow link between nodes for a flat and a hierarchical all-reduce;
* small statistics for step times measured on a busy machine, and the exercises' self-checks.
"""
from __future__ import annotations

import math
import statistics

from distlab.teach import answers

MB = 2**20


def ring_bytes(nbytes: float, n: int) -> float:
    """Bytes each of ``n`` ranks sends (and receives) in a ring all-reduce of ``nbytes``:
    ``2 (n - 1) / n x nbytes`` (n - 1 steps of reduce-scatter, n - 1 of all-gather, 1/n each)."""
    if n < 1:
        raise ValueError(f"a ring needs at least one rank, not {n}")
    return 2 * (n - 1) / n * nbytes


def bound_s(nbytes: float, n: int, bits_per_s: float) -> float:
    """The least time a ring all-reduce of ``nbytes`` on ``n`` ranks can take when each rank's
    link carries ``bits_per_s``: its bytes over the link's rate (latency left out)."""
    return ring_bytes(nbytes, n) * 8 / bits_per_s


def message_sizes(smallest: int = 4096, largest: int = 64 * MB, factor: int = 4) -> list[int]:
    """Message sizes from ``smallest`` to ``largest`` bytes, each ``factor`` times the last."""
    sizes, size = [], smallest
    while size <= largest:
        sizes.append(size)
        size *= factor
    return sizes


def repeats(nbytes: int, bits_per_s: float, burst_s: float = 0.008, most: int = 40, least: int = 3,
            alone: int = 32 * MB) -> int:
    """How many all-reduces of ``nbytes`` to time back to back, so that a link's token bucket,
    which lets ``burst_s`` worth of bytes through at full speed after a pause, is a small part
    of what is timed: at least 16 bursts' worth, at most ``most``.

    At least ``least``, so that a moment when another program held a core is outvoted by the
    median, except for messages of ``alone`` bytes or more: timed once, they take long enough
    that such a moment is a small part. Small messages get the most repeats: they take well
    under a millisecond, and on a shared machine a stretch of them waits for a core together
    (see :func:`law_rows`), so their fastest repeats need a sample spread over time."""
    if nbytes >= alone:
        return 1
    burst = bits_per_s / 8 * burst_s
    return max(least, min(most, math.ceil(16 * burst / nbytes)))


def size_text(nbytes: float) -> str:
    """``4096`` -> ``"4 KB"``, ``64 * 2**20`` -> ``"64 MB"`` (binary units, as the sizes are)."""
    for unit, scale in (("GB", 2**30), ("MB", MB), ("KB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def law_rows(seconds: dict[int, float], n: int, bits_per_s: float,
             fastest: dict[int, float] | None = None) -> list[dict]:
    """One row per message size: measured seconds, the law's bound, and ``bound / measured``
    (1.0: the link's rate exactly; far below 1: latency, not bandwidth, sets the time).

    ``fastest`` (optional): a low quantile of the repeats per size. For a latency-bound message
    the median also holds the moments a rank, woken by its neighbour's bytes, waited for a core
    that other programs held; the fastest repeats show the path's own latency."""
    rows = []
    for nbytes in sorted(seconds):
        bound = bound_s(nbytes, n, bits_per_s)
        row = {"bytes": nbytes, "size": size_text(nbytes), "seconds": seconds[nbytes], "bound_s": bound,
               "fraction": bound / seconds[nbytes]}
        if fastest is not None:
            row["fastest"] = fastest[nbytes]
        rows.append(row)
    return rows


def print_rows(rows: list[dict], title: str) -> None:
    """The law's table, as the chapter prints it."""
    fastest = all("fastest" in row for row in rows)
    print(title)
    header = f"  {'size':>7} {'measured':>12} {'bound':>12} {'bound/measured':>15}"
    print(header + (f" {'fastest':>12}" if fastest else ""))
    for row in rows:
        print(f"  {row['size']:>7} {row['seconds'] * 1e3:9.3f} ms {row['bound_s'] * 1e3:9.3f} ms "
              f"{row['fraction']:15.2f}" + (f" {row['fastest'] * 1e3:9.3f} ms" if fastest else ""))


# ---------------------------------------------------------------------------------------------
# The kernel's counters
# ---------------------------------------------------------------------------------------------

NET_DEV_FIELDS = ("rx_bytes", "rx_packets", "rx_errs", "rx_drop", "rx_fifo", "rx_frame", "rx_compressed",
                  "rx_multicast", "tx_bytes", "tx_packets", "tx_errs", "tx_drop", "tx_fifo", "tx_colls",
                  "tx_carrier", "tx_compressed")


def net_dev(text: str) -> dict[str, dict[str, int]]:
    """``/proc/net/dev`` read: interface -> its counters (``rx_bytes``, ``tx_bytes``, ...).

    The file is per network namespace, so on a node it lists that node's interfaces only."""
    out = {}
    for line in text.splitlines()[2:]:  # two header lines
        name, sep, numbers = line.partition(":")
        if sep:
            out[name.strip()] = dict(zip(NET_DEV_FIELDS, (int(v) for v in numbers.split()), strict=False))
    return out


def sent_bytes(interface: str = "eth0", path: str = "/proc/net/dev") -> int:
    """Bytes this machine (this node) has sent on ``interface`` so far, headers included."""
    with open(path) as f:
        return net_dev(f.read())[interface]["tx_bytes"]


# ---------------------------------------------------------------------------------------------
# Two levels: fast inside a node, slow between nodes
# ---------------------------------------------------------------------------------------------

def flat_link_bytes(nbytes: float, nodes: int, per_node: int) -> float:
    """Bytes each node sends over its link in a ring all-reduce over all ``nodes x per_node``
    ranks, ranks numbered node by node: the ring leaves each node once, and what crosses there
    is what one rank sends, ``2 (n - 1) / n x nbytes`` with ``n`` all the ranks."""
    return ring_bytes(nbytes, nodes * per_node) if nodes > 1 else 0.0


def hierarchical_link_bytes(nbytes: float, nodes: int) -> float:
    """The same for a hierarchical all-reduce (reduce inside each node, all-reduce among one
    leader per node, broadcast inside): only the leaders' ring crosses the links."""
    return ring_bytes(nbytes, nodes)


# ---------------------------------------------------------------------------------------------
# Step times on a busy machine
# ---------------------------------------------------------------------------------------------

def quantile(values, q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank). Other programs on a shared machine only
    ever make a step slower, so a low quantile is the most repeatable measure of a step's cost."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def cycle_times(times: list[float], k: int = 1) -> list[float]:
    """Seconds per micro-step of each full cycle of ``k`` micro-steps (``no_sync`` accumulation:
    ``k - 1`` steps without communication, then one with it); ``times`` itself when ``k`` is 1."""
    return [sum(times[i:i + k]) / k for i in range(0, len(times) - k + 1, k)]


def step_of(run: dict, skip: int = 0, q: float = 0.25) -> float:
    """A run's step: the ``q`` quantile over its cycles (:func:`cycle_times`), its first ``skip``
    steps left out (warm-up). ``run``: ``times`` (seconds per step) and ``k`` (micro-steps per cycle)."""
    return quantile(cycle_times(run["times"][skip:], run.get("k", 1)), q)


def paired_summary(by_rank: dict[int, dict[str, dict]], compute: str, rank: int = 0,
                   skip: int = 0) -> dict[str, dict]:
    """Per configuration, as node ``rank`` saw it: its step against the compute-only step, paired.

    The configurations took their steps in turn, so step ``i`` of each ran moments apart. A
    synchronous step cannot be shorter than the slower node's computation, so the floor of round
    ``i`` is the slowest rank's compute-only step ``i``. Each configuration's cycles (see
    :func:`cycle_times`) are divided by the floor of the same rounds, and ``vs_compute`` is the
    median of those ratios: a burst of other work on the machine slows a round's configurations
    alike, and the median ignores the rounds it slowed unevenly. ``step_s`` is that ratio times the
    median floor; ``waiting_s`` the part above the floor.

    ``by_rank[r][name]``: ``times`` and ``sent`` (seconds and bytes per step), ``losses``, ``k``."""
    floors = [max(t) for t in zip(*(runs[compute]["times"] for runs in by_rank.values()), strict=True)]
    floor_s = statistics.median(floors[skip:])
    out = {}
    for name, run in by_rank[rank].items():
        k = run.get("k", 1)
        mine, base = cycle_times(run["times"][skip:], k), cycle_times(floors[skip:len(run["times"])], k)
        ratio = statistics.median(m / b for m, b in zip(mine, base, strict=False))
        step = ratio * floor_s
        sent = run["sent"][skip:]
        out[name] = {"step_s": step, "compute_s": min(floor_s, step), "waiting_s": max(0.0, step - floor_s),
                     "vs_compute": ratio, "mb_per_step": sum(sent) / len(sent) / 1e6, "loss": run["losses"][-1]}
    return out


def print_summary(summary: dict[str, dict]) -> None:
    print(f"{'configuration':28s} {'step':>9} {'x compute':>10} {'waiting':>9} {'MB/step':>9} {'loss':>8}")
    for name, row in summary.items():
        print(f"{name:28s} {row['step_s'] * 1e3:6.0f} ms {row['vs_compute']:10.2f} {row['waiting_s'] * 1e3:6.0f} ms "
              f"{row['mb_per_step']:9.2f} {row['loss']:8.4f}")


# ---------------------------------------------------------------------------------------------
# Exercise self-checks
# ---------------------------------------------------------------------------------------------


def _close(answer, expected: float) -> bool:
    """Whether ``answer`` is right: chapter 14's numbers follow from a law: within 1 %."""
    return answers.close(answer, expected, rel=0.01, floor=0.0)


def check_cluster_step(answer, params: float = 25e6, nodes: int = 8, gbit: float = 1.0) -> bool:
    """Exercise 1: seconds a ring all-reduce of ``params`` fp32 gradients needs on ``nodes``
    nodes with ``gbit`` Gbit/s links (the law's bound)."""
    if answers.unanswered(answer, "a number of seconds"):
        return False
    expected = bound_s(params * 4, nodes, gbit * 1e9)
    once = params * 4 * 8 / (gbit * 1e9)
    if _close(answer, once) and not _close(expected, once):  # on 2 nodes the ring sends exactly that
        raise AssertionError(f"{answer!r} sends the gradients once. How many times S does each rank send in a ring "
                             f"all-reduce on {nodes} ranks?")
    assert _close(answer, expected), (
        f"Not quite: {answer!r}. fp32 is 4 bytes per parameter; each rank sends 2 (n - 1) / n of them; "
        "a link of B Gbit/s carries B/8 GB per second.")
    print(f"correct: {expected:.2f} s per step, whatever the GPUs compute in the meantime")
    return True


def check_link_bytes(answer, nbytes: float = 100e6, nodes: int = 4, per_node: int = 8) -> bool:
    """Exercise 2: ``(flat, hierarchical)``, bytes each node sends over its link for an
    all-reduce of ``nbytes`` on ``nodes`` nodes of ``per_node`` ranks."""
    if answers.unanswered(answer, "a pair (flat, hierarchical) of byte counts"):
        return False
    flat, hier = flat_link_bytes(nbytes, nodes, per_node), hierarchical_link_bytes(nbytes, nodes)
    try:
        given_flat, given_hier = answer
    except (TypeError, ValueError):
        raise AssertionError(f"give a pair (flat, hierarchical), not {answer!r}") from None
    assert _close(given_flat, flat), (
        f"flat: {given_flat!r} is not it. The ring over all {nodes * per_node} ranks leaves each node once; "
        "what crosses there is what one rank of that ring sends.")
    assert _close(given_hier, hier), (
        f"hierarchical: {given_hier!r} is not it. Only one rank per node takes part in the ring between nodes.")
    print(f"correct: {flat / 1e6:.1f} MB against {hier / 1e6:.1f} MB per node over the slow links "
          f"({flat / hier:.2f}x as much for the flat ring)")
    return True
