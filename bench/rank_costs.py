"""What a forked rank pays for three steps of a short run, before and after distlab's fast path (#28).

Two ranks are forked from this process (which has imported torch, as distlab's forkserver has),
rank 1 arriving 2 ms after rank 0, as a forked rank does. Medians of ``--repeats`` runs, the two
variants of each row alternated:

    group forms, FileStore      torch's FileStore looks for a missing key every 10 ms
    group forms, PromptStore    distlab.rendezvous.prompt_store: the same file, checked from 0.2 ms on
    destroy, torn down          dist.destroy_process_group() releasing the gloo group at once
    destroy, kept               the same with distlab.rendezvous.retired_groups (the group closes at exit)
    reseed numpy, not loaded    numpy.random.seed() where the parent never touched numpy.random
    reseed numpy, preloaded     the same after the parent imported numpy.random (the server does)

"group forms" is timed from the later rank's arrival until both have done one all_reduce.
Last line: ``ratio: X`` = PromptStore / FileStore group formation.
Usage: python bench/rank_costs.py [--repeats 15]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from distlab.rendezvous import retired_groups
from distlab.rendezvous.prompt_store import prompt_store


def _store(path: str, prompt: bool):
    store = dist.FileStore(path, 2)
    return prompt_store(store) if prompt else store


def _group_rank(rank: int, path: str, prompt: bool, keep: bool) -> tuple[float, float, float]:
    """In a forked child: (arrived, group formed and used, destroyed), as wall-clock times."""
    torch.set_num_threads(1)
    if rank == 1:
        time.sleep(0.002)
    arrived = time.time()
    dist.init_process_group("gloo", store=_store(path, prompt), rank=rank, world_size=2)
    t = torch.ones(4)
    dist.all_reduce(t)
    formed = time.time()
    groups = retired_groups._gloo_groups(None) if keep else []
    began = time.perf_counter()
    dist.destroy_process_group()
    retired_groups.keep(groups)
    return arrived, formed, time.perf_counter() - began


def _fork(fn, *args) -> list:
    """Run ``fn(rank, *args)`` in two forked children; their return values, by rank."""
    readers, pids = [], []
    for rank in range(2):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.write(w, repr(fn(rank, *args)).encode())
            os._exit(0)
        os.close(w)
        readers.append(r)
        pids.append(pid)
    out = []
    for r, pid in zip(readers, pids, strict=True):
        with os.fdopen(r, "rb") as f:
            out.append(eval(f.read().decode()))  # noqa: S307  (our own children's repr of floats)
        os.waitpid(pid, 0)
    return out


def _reseed_row(preloaded: bool) -> float:
    """numpy.random.seed() in a fork of a fresh interpreter that did (not) import numpy.random."""
    import subprocess

    code = ("import sys, time, os, torch, numpy\n"
            + ("import numpy.random\n" if preloaded else "")
            + "pid = os.fork()\n"
              "if pid == 0:\n"
              "    t = time.perf_counter(); numpy.random.seed(); print(time.perf_counter() - t); os._exit(0)\n"
              "os.waitpid(pid, 0)\n")
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for i in range(args.repeats):
            variants = [(False, False), (True, True)]
            for prompt, keep in variants if i % 2 == 0 else variants[::-1]:
                ranks = _fork(_group_rank, f"{folder}/store-{i}-{prompt}", prompt, keep)
                formed = max(r[1] for r in ranks) - max(r[0] for r in ranks)
                rows.setdefault(f"group forms, {'PromptStore' if prompt else 'FileStore'}", []).append(formed)
                rows.setdefault(f"destroy, {'kept' if keep else 'torn down'}", []).append(max(r[2] for r in ranks))
    few = max(3, args.repeats // 3)
    for i in range(few):
        for preloaded in (False, True) if i % 2 == 0 else (True, False):
            rows.setdefault(f"reseed numpy, {'preloaded' if preloaded else 'not loaded'}", []).append(
                _reseed_row(preloaded))
    print(f"{'step':<30}{'median ms':>10}{'min ms':>9}{'runs':>6}")
    for name in sorted(rows):
        values = rows[name]
        print(f"{name:<30}{statistics.median(values) * 1000:>10.1f}{min(values) * 1000:>9.1f}{len(values):>6}")
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"ratio: {med['group forms, PromptStore'] / med['group forms, FileStore']:.3f}")


if __name__ == "__main__":
    main()
