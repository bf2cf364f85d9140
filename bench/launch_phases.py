"""Where a warm distlab launch spends its time (start="forkserver"): the trivial 2-rank job of
launch_latency.py, with timestamps taken around distlab's and torchelastic's steps in this process
and inside the job on each rank. Prints the median time from the call of ``distlab.spawn`` to
each step, then ``ratio: X`` = median launch / median time until the last rank entered the job
(how much of a launch is not starting ranks).

Usage: python bench/launch_phases.py [--repeats 9]
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist

import distlab
from distlab import engine, forkserver, watch

STEPS = {}  # step -> [seconds after the call, one per launch]
_marks: dict[str, float] = {}


def job(rank, world_size):
    entered = time.time()
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    joined = time.time()
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return entered, joined, time.time()


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

    _around(engine, "_launch_agent", "a. script written, agent starts", "h. agent returned")
    _around(agent_api.SimpleElasticAgent, "_rendezvous", "b. rendezvous")
    _around(forkserver._RankPopen, "_launch", "c. first rank requested", "d. last rank requested")
    _around(mp_api.MultiprocessContext, "_close", "g. ranks exited")
    _around(watch, "stop_workers", "i. leftovers checked")
    _around(engine, "collect", "j. results read")


def one_launch() -> float:
    _marks.clear()
    start = time.time()
    res = distlab.spawn(job, args=(2,), nprocs=2, view=None)
    end = time.time()
    ranks = res.returns.values()
    _marks["e. last rank entered the job"] = max(r[0] for r in ranks)
    _marks["f. group formed, last rank done"] = max(r[2] for r in ranks)
    _marks["k. spawn returned"] = end
    for name, when in _marks.items():
        STEPS.setdefault(name, []).append(when - start)
    return end - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    instrument()
    distlab.spawn(job, args=(2,), nprocs=2, view=None)  # starts the forkserver
    totals = [one_launch() for _ in range(args.repeats)]
    print(f"{'step':<36}{'median s':>10}")
    for name in sorted(STEPS):
        print(f"{name:<36}{statistics.median(STEPS[name]):>10.3f}")
    entered = statistics.median(STEPS["e. last rank entered the job"])
    print(f"ratio: {statistics.median(totals) / entered:.3f}")


if __name__ == "__main__":
    main()
