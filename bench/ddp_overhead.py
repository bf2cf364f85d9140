"""What wrapping a model in DistributedDataParallel costs: DDP step time over the plain module's.

World size 1 runs in this process (gloo over a FileStore: no second process, no socket); world
size 2 runs as a distlab job (both ranks step together; the plain module does no communication).
For each model, plain and DDP steps alternate (same data, same optimizer, a warm-up first) and
the medians are compared. Models: the article's SimpleModel (6K parameters) and a 10-layer
1024-wide MLP (10.5M parameters, 40 MB of gradients). At world size 1 DDP's
``gradient_as_bucket_view=True`` (gradients live in the buckets: no copy in or out) is measured too.

    python bench/ddp_overhead.py             # about 1-2 minutes on 2 busy cores
    python bench/ddp_overhead.py --quick     # fewer repeats, world size 1 only

Last line: ``ratio: X`` = DDP / plain step time at world size 1 for the 10.5M-parameter MLP.
"""
from __future__ import annotations

import argparse

import torch

import distlab
from distlab.teach import perf

HEADLINE = ("1", "MLP-10M", "DDP")
VIEW = ("1", "MLP-10M", "DDP, grad as bucket view")


def world_one(batch: dict[str, int], repeats: int) -> list[dict]:
    """Both models at world size 1, in this process; the MLP also with gradient_as_bucket_view."""
    rows = []
    with perf.single_rank_group(distlab.backend(1)):
        for name, workload in perf.WORKLOADS.items():
            variants = {"DDP": {}}
            if name == "MLP-10M":
                variants["DDP, grad as bucket view"] = {"gradient_as_bucket_view": True}
            for variant, options in variants.items():
                result = perf.plain_vs_ddp(workload, batch[name], repeats, distlab.device(0), **options)
                rows.append(_row(1, name, batch[name], variant, result))
    return rows


def world_two_job(rank, world_size, batch, repeats):
    """One rank of the world-size-2 measurement (run by distlab.spawn)."""
    import os

    import torch
    import torch.distributed as dist

    import distlab
    from distlab.teach import perf

    dist.init_process_group(distlab.backend(world_size), rank=rank, world_size=world_size)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    results = {name: perf.plain_vs_ddp(w, batch[name], repeats, distlab.device(rank))
               for name, w in perf.WORKLOADS.items()}
    dist.destroy_process_group()
    return results


def world_two(batch: dict[str, int], repeats: int) -> list[dict]:
    res = distlab.spawn(world_two_job, args=(2, batch, repeats), nprocs=2, view=None, timeout=600)
    return [_row(2, name, batch[name], "DDP", result) for name, result in res.returns[0].items()]


def _row(world: int, name: str, batch: int, variant: str, result: dict) -> dict:
    return {"world": str(world), "model": name, "params": perf.n_params(perf.WORKLOADS[name].model()),
            "batch": batch, "variant": variant, "plain": result["plain"]["step"], "ddp": result["ddp"]["step"],
            "ratio": result["ratio"]}


def print_table(rows: list[dict]) -> None:
    print(f"{'world':>5}  {'model':<12}{'params':>10}{'batch':>7}  {'variant':<26}{'plain ms':>10}{'DDP ms':>10}"
          f"{'DDP/plain':>11}")
    for r in rows:
        print(f"{r['world']:>5}  {r['model']:<12}{r['params']:>10}{r['batch']:>7}  {r['variant']:<26}"
              f"{r['plain'] * 1e3:>10.2f}{r['ddp'] * 1e3:>10.2f}{r['ratio']:>11.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats, world size 1 only")
    parser.add_argument("--repeats", type=int, default=9, help="timed steps per variant (after 2 warm-up steps)")
    parser.add_argument("--batch", type=int, default=64, help="MLP batch size (SimpleModel: 32, the article's)")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads at world size 1 (0: torch's default)")
    opts = parser.parse_args()
    repeats = 3 if opts.quick else opts.repeats
    batch = {"SimpleModel": 32, "MLP-10M": opts.batch}
    if opts.threads:
        torch.set_num_threads(opts.threads)
    rows = world_one(batch, repeats)
    if not opts.quick:
        rows += world_two(batch, repeats)
    print_table(rows)
    view = next(r for r in rows if (r["world"], r["model"], r["variant"]) == VIEW)
    print(f"ratio with gradient_as_bucket_view=True: {view['ratio']:.3f}")
    headline = next(r for r in rows if (r["world"], r["model"], r["variant"]) == HEADLINE)
    print(f"ratio: {headline['ratio']:.3f}")


if __name__ == "__main__":
    main()
