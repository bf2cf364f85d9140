"""distlab's warm 2-rank `spawn` against accelerate's fork-based `notebook_launcher`, alternated.

Both launch the same trivial gloo job (init, one all_reduce, destroy) on 2 ranks from this
process, one after the other, `--repeats` times each, in alternating order; medians are compared.
`--busy` also keeps both cores busy with two spinning processes for the whole measurement (a
loaded machine). accelerate is not a dependency of distlab: `pip install accelerate` for this
bench only.

Last line: `ratio: X` = distlab median / accelerate median (goal <= 0.5, quiet and busy).
Usage: python bench/vs_accelerate.py [--repeats 15] [--busy]
"""
import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import time

import distlab
from distlab.teach.launch_latency import (  # the trivial job and accelerate timing of bench/launch_latency.py
    job,
    time_accelerate,
)


def time_distlab() -> float:
    began = time.perf_counter()
    distlab.spawn(job, args=(2,), nprocs=2, view=None)
    return time.perf_counter() - began


def spinners(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--busy", action="store_true", help="two processes keep both cores busy")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    time_distlab(), time_accelerate()  # the forkserver, imports, first-run costs
    busy = spinners(2) if args.busy else []
    times = {"distlab": [], "accelerate": []}
    try:
        for i in range(args.repeats):
            order = [("distlab", time_distlab), ("accelerate", time_accelerate)]
            for name, fn in order if i % 2 == 0 else order[::-1]:
                times[name].append(fn())
    finally:
        for p in busy:
            p.kill()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{'busy' if args.busy else 'quiet'} machine, {args.repeats} launches each, alternated")
    for name, value in med.items():
        print(f"{name:12s} median {value * 1000:7.1f} ms  (min {min(times[name]) * 1000:.1f} ms)")
    print(f"ratio: {med['distlab'] / med['accelerate']:.3f}")


if __name__ == "__main__":
    multiprocessing.set_start_method("fork", force=True)  # what notebook_launcher uses from a notebook
    main()
