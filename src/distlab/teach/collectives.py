"""Collective communication, written out: code that runs on ranks, and everything chapter 5 imports.

Chapter 5 runs every collective on real ranks and checks each result against a *reference*: those,
with the other pure helpers (ring segments, bandwidth math, tables, exercise checks), are in
:mod:`distlab.teach.collective_results` and are re-exported here, so ``from distlab.teach import
collectives as C`` gives the chapter all of them.

The chapter's hand-written ring all-reduce is defined in the chapter's own cells; its reference copy,
used by ``bench/allreduce.py`` and the tests, is :mod:`distlab.teach.ring` (re-exported here).
Here itself: a byte counter for ``isend``, the nccl-tests bandwidth harness that runs on every rank,
and a one-thread copy's bandwidth as a local yardstick.
"""
from __future__ import annotations

import functools

import torch

from .collective_results import (  # noqa: F401  (chapter 5 reads them as C.<name>)
    BITWISE,
    DOCS_BACKENDS_URL,
    DOCS_GLOO_CPU,
    DOCS_NCCL_GPU,
    DOCS_OPS_GLOO,
    DOCS_OPS_NCCL,
    EXERCISE_RS_INPUT,
    OPS,
    REFERENCES,
    SCENARIOS,
    TABLE_ROWS,
    algbw,
    bench_expected,
    bench_input,
    busbw,
    check_against_reference,
    check_bandwidth,
    check_group_all_reduce,
    check_reduce_scatter,
    check_ring_bytes,
    check_which_collective,
    combine,
    defined_only,
    html_table,
    op_name,
    ops_table,
    per_rank,
    ref_all_gather,
    ref_all_reduce,
    ref_all_to_all,
    ref_barrier,
    ref_broadcast,
    ref_gather,
    ref_group_all_reduce,
    ref_reduce,
    ref_reduce_scatter,
    ref_scatter,
    ring_segments,
    same,
    support_table,
)
from .ring import CHUNK_BYTES, SERIAL_NUMEL, add_on_this_thread, ring_all_reduce, ring_reduce_scatter  # noqa: F401

# --- what the ring sends ------------------------------------------------------------------------------

def count_sent_bytes(fn, *args, **kwargs) -> int:
    """Call ``fn(*args, **kwargs)`` and return how many bytes this rank handed to ``dist.isend`` meanwhile.

    It wraps ``torch.distributed.isend`` for the duration of the call, so it counts code that looks
    ``isend`` up on the module when it calls it (as the ring does), and nothing else.
    """
    import torch.distributed as dist

    sent = 0
    real = dist.isend

    def counting(tensor, *a, **k):
        nonlocal sent
        sent += tensor.numel() * tensor.element_size()
        return real(tensor, *a, **k)

    dist.isend = counting
    try:
        fn(*args, **kwargs)
    finally:
        dist.isend = real
    return sent


# --- measuring all-reduce the way nccl-tests does, on every rank ---------------------------------------

def slowest_rank_seconds(fn, iters: int, group=None) -> float:
    """Mean seconds per call of ``fn`` on the slowest rank (every rank must call this together)."""
    import time

    import torch.distributed as dist

    dist.barrier(group)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    mine = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=group)
    return mine.item()


def measure_all_reduce(impls: dict, sizes: list, group=None, target_s: float = 0.2, reps: int = 3) -> list:
    """Time each all-reduce in ``impls`` ({name: fn(tensor)}) at each size in bytes; check every result.

    Per size: every implementation's result is checked against :func:`bench_expected`, warmed up,
    and timed in ``reps`` interleaved blocks of the same iteration count on every rank (chosen so a
    block takes about ``target_s``). A block's time is its slowest rank's; the best block counts,
    which damps noise from other work on a shared machine. Returns one dict per (impl, size).
    """
    import torch.distributed as dist

    n, rank = dist.get_world_size(group), dist.get_rank(group)
    rows = []
    for nbytes in sizes:
        x = bench_input(nbytes // 4, rank)
        iters = {name: _check_and_warm_up(name, fn, x, n, group, target_s) for name, fn in impls.items()}
        best = dict.fromkeys(impls, float("inf"))
        for _ in range(reps):
            for name, fn in impls.items():
                x.copy_(bench_input(x.numel(), rank))  # every block starts from small values
                sec = slowest_rank_seconds(functools.partial(fn, x), iters[name], group)
                best[name] = min(best[name], sec)
        rows += [{"impl": name, "bytes": nbytes, "ranks": n, "seconds": sec, "checked": True,
                  "algbw": algbw(nbytes, sec), "busbw": busbw(nbytes, sec, n)} for name, sec in best.items()]
    return rows


def _check_and_warm_up(name: str, fn, x: torch.Tensor, n: int, group, target_s: float = 0.2) -> int:
    """Check ``fn``'s result on every rank, warm it up, and pick an iteration count all ranks share."""
    import torch.distributed as dist

    y = bench_input(x.numel(), dist.get_rank(group))
    fn(y)
    ok = torch.tensor([float(torch.equal(y, bench_expected(x.numel(), n)))])
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
    assert ok.item() == 1.0, f"{name} gave a wrong all-reduce of {x.numel() * 4} bytes on {n} ranks"
    once = slowest_rank_seconds(functools.partial(fn, x), 1, group)  # a warm-up, and a first estimate
    return max(2, min(500, int(target_s / once)))


def memcpy_bandwidth(nbytes: int, repeats: int = 5) -> float:
    """Bytes/s of one thread copying a buffer of ``nbytes`` (best of ``repeats``): a local yardstick."""
    import time

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.ones(nbytes // 4)
        dst = torch.empty_like(src)
        dst.copy_(src)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return nbytes / best
