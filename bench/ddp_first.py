"""A rank's first DistributedDataParallel(...): what it costs in a rank forked from distlab's server.

DDP's constructor reads ``torch._dynamo``, which torch imports lazily (about 800 modules); a rank
whose server did not import it pays that on its first ``DDP(...)``. Each launch is a 2-rank gloo job
(``distlab.spawn(job, nprocs=2)``) whose ranks, after a barrier, time ``DDP(nn.Linear(4, 4))`` twice
and count the modules the first one imported; a row takes the slower rank of each launch, median of
``--repeats`` launches, the two kinds of launch alternated:

    first DDP, forked        a rank's first DDP(...), ranks forked from distlab's forkserver
    second DDP, forked       the second DDP(...) in that rank: the constructor with nothing to import
    first DDP, fresh         the first DDP(...) with start="spawn": a fresh interpreter that has imported
                             torch and torch.distributed but nothing for DDP (what every forked rank
                             paid while the server did not preload it)
    launch, forked           the whole distlab.spawn call of the forked job, as the kernel waits for it
    server preload           `import distlab.forkserver.preload` in a fresh interpreter: the server's
                             start (in the background, see distlab.forkserver.prestart), with the modules
                             it holds and its peak RSS

Before/after: ``python bench/before_after.py REV bench/ddp_first.py`` (REV: a commit that has this
script), or this script run with ``PYTHONPATH=<other tree>/src``.
Last line: ``ratio: X`` = first DDP forked / first DDP fresh (1.0: the fork saves nothing).
Usage: python bench/ddp_first.py [--repeats 5]
"""
import argparse
import statistics
import subprocess
import sys
import time

import torch  # noqa: F401  (imported first, like a kernel that has used torch already)

import distlab

PRELOAD = ("import resource, sys, time; t = time.perf_counter(); import distlab.forkserver.preload; "
           "print(time.perf_counter() - t, len(sys.modules), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")


def job(rank, world_size):
    import sys
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    dist.barrier()
    before = len(sys.modules)
    start = time.perf_counter()
    DDP(torch.nn.Linear(4, 4))
    first = time.perf_counter() - start
    imported = len(sys.modules) - before
    dist.barrier()
    start = time.perf_counter()
    DDP(torch.nn.Linear(4, 4))
    second = time.perf_counter() - start
    dist.destroy_process_group()
    return {"first": first, "second": second, "imported": imported}


def launch(start: str) -> dict:
    began = time.perf_counter()
    res = distlab.spawn(job, args=(2,), nprocs=2, view=None, start=start)
    wall = time.perf_counter() - began
    ranks = res.returns.values()
    return {"first": max(r["first"] for r in ranks), "second": max(r["second"] for r in ranks),
            "imported": max(r["imported"] for r in ranks), "launch": wall}


def preload() -> dict:
    out = subprocess.run([sys.executable, "-c", PRELOAD], check=True, capture_output=True, text=True).stdout.split()
    return {"seconds": float(out[0]), "modules": int(out[1]), "rss_mb": int(out[2]) / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    opts = parser.parse_args()
    distlab.spawn(job, args=(2,), nprocs=2, view=None)  # starts the forkserver; not measured
    forked, fresh, server = [], [], []
    for i in range(opts.repeats):
        for start in (("forkserver", "spawn") if i % 2 == 0 else ("spawn", "forkserver")):
            (forked if start == "forkserver" else fresh).append(launch(start))
        server.append(preload())

    def med(runs, key):
        return statistics.median(r[key] for r in runs)

    rows = [("first DDP, forked", med(forked, "first"), f"{med(forked, 'imported'):.0f} modules imported"),
            ("second DDP, forked", med(forked, "second"), "nothing left to import"),
            ("first DDP, fresh", med(fresh, "first"), f"{med(fresh, 'imported'):.0f} modules imported"),
            ("launch, forked", med(forked, "launch"), "whole distlab.spawn call"),
            ("server preload", med(server, "seconds"),
             f"{med(server, 'modules'):.0f} modules, peak RSS {med(server, 'rss_mb'):.0f} MB")]
    print(f"{opts.repeats} launches of each kind, 2 gloo ranks, torch {torch.__version__}")
    print(f"{'':22}{'median s':>10}  note")
    for name, seconds, note in rows:
        print(f"{name:22}{seconds:10.4f}  {note}")
    print(f"ratio: {med(forked, 'first') / med(fresh, 'first'):.4f}")


if __name__ == "__main__":
    main()
