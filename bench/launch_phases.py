"""Where a warm distlab launch spends its time (start="forkserver"): the trivial 2-rank job of
launch_latency.py, with timestamps taken around distlab's and torchelastic's steps in this process
and inside the job on each rank. Prints the median time from the call of ``distlab.spawn`` to
each step, then ``ratio: X`` = median launch / median time until the last rank entered the job
(how much of a launch is not starting ranks).

It also prints the median CPU time this process (the kernel) spent per launch. Step "d2" is when
the last rank's process got its run: a spare rank the server forked ahead (``distlab.forkserver.spare``)
records it; a rank forked on request has none. ``--busy`` keeps both cores busy with two spinning
processes meanwhile; ``--gap S`` waits S seconds between launches (the server forks its spares in
such gaps, as between a learner's cells).

Usage: python bench/launch_phases.py [--repeats 9] [--busy] [--gap 0.1]
"""
import argparse
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

import distlab
from distlab.forkserver import client as forkserver
from distlab.launch import engine, watch

STEPS = {}  # step -> [seconds after the call, one per launch]
_marks: dict[str, float] = {}


def job(rank, world_size):
    entered = time.time()
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    joined = time.time()
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.destroy_process_group()
    try:
        from distlab.forkserver import spare as _spare_rank
    except ImportError:  # a distlab from before spare ranks (for before/after comparisons)
        _spare_rank = None
    received = _spare_rank.RECEIVED[0] if _spare_rank is not None and _spare_rank.RECEIVED else None
    return entered, joined, time.time(), received


def _mark(name: str) -> None:
    _marks.setdefault(name, time.time())


def _around(owner, attr: str, before: str, after: str | None = None) -> None:
    original = getattr(owner, attr)

    def wrapped(*args, **kwargs):
        _mark(before)
        try:
            return original(*args, **kwargs)
        finally:
            if after:
                _marks[after] = time.time()

    setattr(owner, attr, wrapped)


def instrument() -> None:
    from torch.distributed.elastic.agent.server import api as agent_api
    from torch.distributed.elastic.multiprocessing import api as mp_api

    _around(engine, "launch_agent", "a. script written, agent starts", "h. agent returned")
    _around(agent_api.SimpleElasticAgent, "_rendezvous", "b. rendezvous")
    _around(forkserver._RankPopen, "_launch", "c. first rank requested", "d. last rank requested")
    _around(mp_api.MultiprocessContext, "_close", "g. ranks exited")
    _around(watch, "stop_workers", "i. leftovers checked")
    _around(engine, "collect", "j. results read")


KERNEL_CPU: list[float] = []  # this process's CPU time per launch (every thread), in seconds


def one_launch() -> float:
    _marks.clear()
    cpu = time.process_time()
    start = time.time()
    res = distlab.spawn(job, args=(2,), nprocs=2, view=None)
    end = time.time()
    KERNEL_CPU.append(time.process_time() - cpu)
    ranks = res.returns.values()
    _marks["e. last rank entered the job"] = max(r[0] for r in ranks)
    _marks["f. group formed, last rank done"] = max(r[2] for r in ranks)
    if all(r[3] is not None for r in ranks):
        _marks["d2. last rank received its run"] = max(r[3] for r in ranks)
    _marks["k. spawn returned"] = end
    for name, when in _marks.items():
        STEPS.setdefault(name, []).append(when - start)
    return end - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--busy", action="store_true", help="two processes keep both cores busy")
    parser.add_argument("--gap", type=float, default=0.1, help="seconds between launches")
    args = parser.parse_args()
    instrument()
    distlab.spawn(job, args=(2,), nprocs=2, view=None)  # starts the forkserver
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 if args.busy else 0)]
    totals = []
    try:
        for _ in range(args.repeats):
            time.sleep(args.gap)
            totals.append(one_launch())
    finally:
        for p in busy:
            p.kill()
    print(f"{'step':<36}{'median s':>10}")
    for name in sorted(STEPS):
        print(f"{name:<36}{statistics.median(STEPS[name]):>10.3f}")
    print(f"kernel CPU per launch: median {statistics.median(KERNEL_CPU) * 1000:.1f} ms (every thread of this process)")
    entered = statistics.median(STEPS["e. last rank entered the job"])
    print(f"ratio: {statistics.median(totals) / entered:.3f}")


if __name__ == "__main__":
    main()
