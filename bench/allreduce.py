"""The book's hand-written ring all-reduce against gloo's all_reduce, nccl-tests style.

For 2 and 4 ranks (one launch each) and tensors of 4 KB to 64 MB, both implementations run in the
same processes: each result is checked, warm-ups come first, and the slowest rank's time per
iteration counts. algbw = bytes / time; busbw = algbw x 2(n-1)/n (nccl-tests' definitions).
A one-thread memcpy of the same sizes is measured too, as a yardstick for this machine.

    python bench/allreduce.py            # full sweep (about 2 minutes on 2 busy cores)
    python bench/allreduce.py --quick    # fewer sizes

The last line is the headline: ``ratio: X`` = ring busbw / gloo busbw at 16 MB on 2 ranks.
"""
from __future__ import annotations

import argparse

import distlab

KB, MB = 1 << 10, 1 << 20
FULL_SIZES = [4 * KB * 4**i for i in range(8)]  # 4 KB .. 64 MB
QUICK_SIZES = [64 * KB, 1 * MB, 16 * MB]
HEADLINE_BYTES = 16 * MB


def sweep(rank, world_size, sizes, target_s, reps):
    """One rank: gloo's all_reduce and the book's ring over every size (see measure_all_reduce)."""
    import torch.distributed as dist

    from distlab.teach.collectives import measure_all_reduce
    from distlab.teach.ring import ring_all_reduce  # the reference copy of chapter 5's ring (a test keeps them equal)

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    impls = {"gloo": lambda t: dist.all_reduce(t), "ring": ring_all_reduce}
    rows = measure_all_reduce(impls, sizes, target_s=target_s, reps=reps)
    dist.destroy_process_group()
    return rows


def human(nbytes: int) -> str:
    return f"{nbytes // MB} MB" if nbytes >= MB else f"{nbytes // KB} KB"


def print_table(rows: list) -> None:
    print(f"{'ranks':>5} {'size':>7} {'impl':>5} {'time (us)':>11} {'algbw GB/s':>11} {'busbw GB/s':>11} "
          f"{'checked':>8}")
    for r in rows:
        print(f"{r['ranks']:>5} {human(r['bytes']):>7} {r['impl']:>5} {r['seconds'] * 1e6:>11.1f} "
              f"{r['algbw'] / 1e9:>11.3f} {r['busbw'] / 1e9:>11.3f} {str(r['checked']):>8}")


def ratio_at(rows: list, nbytes: int, ranks: int) -> float:
    pick = {r["impl"]: r["busbw"] for r in rows if r["bytes"] == nbytes and r["ranks"] == ranks}
    return pick["ring"] / pick["gloo"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 sizes instead of 8")
    parser.add_argument("--target-s", type=float, default=0.08, help="seconds per timed block")
    parser.add_argument("--reps", type=int, default=5, help="interleaved timed blocks per size; the best counts")
    opts = parser.parse_args()
    sizes = QUICK_SIZES if opts.quick else FULL_SIZES
    rows = []
    for world in (2, 4):
        res = distlab.spawn(sweep, args=(world, sizes, opts.target_s, opts.reps), nprocs=world, view=None, timeout=600)
        rows += res.returns[0]
    print_table(rows)
    print_yardstick(rows, sizes)
    print(f"ratio at {human(HEADLINE_BYTES)}, 4 ranks: {ratio_at(rows, HEADLINE_BYTES, 4):.3f}")
    print(f"ratio: {ratio_at(rows, HEADLINE_BYTES, 2):.3f}")


def print_yardstick(rows: list, sizes: list) -> None:
    """Peak busbw of each implementation next to a one-thread memcpy of the same size."""
    from distlab.teach.collectives import memcpy_bandwidth

    for world in (2, 4):
        for impl in ("gloo", "ring"):
            top = max((r for r in rows if r["ranks"] == world and r["impl"] == impl), key=lambda r: r["busbw"])
            copy = memcpy_bandwidth(top["bytes"])
            print(f"peak busbw {impl} {world} ranks: {top['busbw'] / 1e9:.3f} GB/s at {human(top['bytes'])}; "
                  f"one-thread memcpy of {human(top['bytes'])}: {copy / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
