"""Chapter 1: DataParallel vs DistributedDataParallel, measured rather than told.

* :func:`gil_experiment` times pure-Python work on threads and on processes, and records *when* each
  worker ran: threads share one interpreter lock (the GIL), so they never run Python bytecode at the
  same moment (:func:`together` is 0); processes can, whatever else the machine is doing.
  ``nn.DataParallel`` drives its devices from threads of one process; DDP uses one process per device.
* :func:`dp_step_ms` and :func:`time_steps` time a training step (the chapter's GPU comparison).
* :func:`full_batch_grads` and :func:`shard` (with :func:`distlab.teach.toy.max_abs_diff`) check DDP's central promise:
  N ranks on batch/N each, gradients averaged, equal one process on the whole batch with a mean loss.

torch is imported inside the functions: process-pool children import this module, and should
start in a blink rather than spend two seconds importing torch for a loop of integer additions.
"""
from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from itertools import pairwise

KINDS = ("serial", "threads", "processes")
CHUNK = 2_000  # iterations between two timestamps: a fraction of a millisecond, far below the GIL's 5 ms turn


def spin(iterations: int) -> int:
    """Pure-Python CPU work: every iteration holds the GIL, none waits on I/O or native code."""
    total = 0
    for i in range(iterations):
        total += i * i
    return total


def spin_timeline(iterations: int, core: int | None = None) -> tuple[float, list[float]]:
    """Run :func:`spin` in chunks of :data:`CHUNK`: (CPU seconds of *this thread*, a timestamp after each chunk).

    The CPU seconds, summed over workers and divided by wall time, give "cores busy". The
    timestamps say *when* this worker was running Python: ``time.perf_counter`` is one clock for
    every process of the machine, so two workers' timelines can be laid side by side. With
    ``core``, the calling thread first binds itself to that core (Linux), as DDP gives every rank a
    device of its own: two workers then never queue for the same core while another is free.
    """
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    start, now = time.thread_time(), time.perf_counter
    stamps = [now()]
    for _ in range(max(1, iterations // CHUNK)):
        spin(CHUNK)
        stamps.append(now())
    return time.thread_time() - start, stamps


def worker_cores(workers: int) -> list[int | None]:
    """A core for each worker, in turn from those this process may use (``None`` where the system
    cannot bind a thread to a core)."""
    if not hasattr(os, "sched_getaffinity"):
        return [None] * workers
    cores = sorted(os.sched_getaffinity(0))
    return [cores[i % len(cores)] for i in range(workers)]


def running_intervals(stamps: list[float], max_gap: float) -> list[tuple[float, float]]:
    """The spans between two consecutive timestamps that took at most ``max_gap``: the worker ran
    all through them. A longer gap means it waited (for the GIL, or for a core) somewhere inside."""
    return [(a, b) for a, b in pairwise(stamps) if b - a <= max_gap]


def _total(intervals) -> float:
    """Length of the union of sorted-or-not intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        total += max(0.0, b - max(a, end))
        end = max(end, b)
    return total


def together(timelines: list[list[float]]) -> float:
    """Share of the time two workers were running at the same moment (0: never, 1: always).

    A span counts as running when it took at most 1.5 times the median span, so a chunk
    interrupted by a wait (the GIL's turn is 5 ms, a scheduler's slice a few ms) drops out.
    """
    first, second = timelines
    spans = sorted(b - a for t in timelines for a, b in pairwise(t))
    max_gap = 1.5 * spans[len(spans) // 2]
    one, two = running_intervals(first, max_gap), running_intervals(second, max_gap)
    either = _total(one + two)
    both = _total(one) + _total(two) - either
    return both / either if either else 0.0


def time_pool(kind: str, workers: int, iterations: int, pool=None) -> dict[str, float]:
    """One measurement of ``workers`` chunks of :func:`spin`, one after another (``serial``, in this
    thread) or on the threads or processes of ``pool``, each worker on a core of its own: wall
    seconds, cores busy, and the share of the time two workers ran Python at the same moment."""
    start = time.perf_counter()
    if kind == "serial":
        runs = [spin_timeline(iterations) for _ in range(workers)]
    else:
        runs = list(pool.map(spin_timeline, [iterations] * workers, worker_cores(workers)))
    wall = time.perf_counter() - start
    return {"wall": wall, "cores": sum(cpu for cpu, _ in runs) / wall,
            "together": together([stamps for _, stamps in runs[:2]])}


def make_pool(kind: str, workers: int):
    """A warm pool: started and used once, so the timing excludes starting it.

    Processes use the ``spawn`` start method: the children are fresh interpreters that import
    :func:`spin` from this module (a notebook's own functions would not be importable there).
    """
    if kind == "threads":
        pool = ThreadPoolExecutor(workers)
    else:
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    list(pool.map(spin, [1] * workers))
    return pool


THREADS_MAX_TOGETHER = 0.01  # two threads of one interpreter: never (the GIL), up to rounding
PROCESSES_MIN_TOGETHER = 0.05  # two processes: at least a twentieth of the time, even on a busy machine


def gil_experiment(iterations: int = 2_000_000, workers: int = 2, rounds: int = 3, max_rounds: int = 15,
                   max_seconds: float = 30.0) -> tuple[dict[str, dict], int]:
    """The same work (``workers`` chunks) per kind: ``({kind: {"wall", "cores", "together"}}, rounds run)``.

    Kinds are interleaved round by round. Each keeps its fastest round's wall time and cores busy
    (a burst of load from other programs hits every kind alike and is mostly filtered out) and the
    *largest* ``together`` of any round: for threads the worst case for the claim that they never
    run Python at once, for processes the evidence that they can. After ``rounds`` rounds it goes
    on, up to ``max_rounds`` rounds or ``max_seconds``, while the processes have not yet been seen
    running together for :data:`PROCESSES_MIN_TOGETHER` of the time: on a machine whose cores are
    busy with other work that moment comes, it is waited for.
    """
    pools = {kind: make_pool(kind, workers) for kind in ("threads", "processes")}
    best = {kind: {"wall": float("inf"), "cores": 0.0, "together": 0.0} for kind in KINDS}
    start, done = time.monotonic(), 0
    try:
        while done < rounds or (done < max_rounds and best["processes"]["together"] < PROCESSES_MIN_TOGETHER
                                and time.monotonic() - start < max_seconds):
            for kind in KINDS:
                _keep_best(best[kind], time_pool(kind, workers, iterations, pools.get(kind)))
            done += 1
    finally:
        for pool in pools.values():
            pool.shutdown()
    return best, done


def _keep_best(best: dict, run: dict) -> None:
    """Fold one round into ``best``: the fastest wall (with its cores busy), the largest ``together``."""
    if run["wall"] < best["wall"]:
        best["wall"], best["cores"] = run["wall"], run["cores"]
    best["together"] = max(best["together"], run["together"])


def speedups(results: dict[str, dict]) -> dict[str, float]:
    """Speed-up of each kind over running the chunks one after another."""
    return {kind: results["serial"]["wall"] / r["wall"] for kind, r in results.items()}


def shard(tensor, rank: int, world_size: int):
    """Rank ``rank``'s contiguous slice of a batch; the batch must divide evenly (DDP's promise needs it)."""
    if len(tensor) % world_size:
        raise ValueError(f"batch of {len(tensor)} does not split evenly over {world_size} ranks")
    per = len(tensor) // world_size
    return tensor[rank * per:(rank + 1) * per]


def full_batch_grads(model, x, y) -> dict:
    """Gradients of one process on the whole batch with a mean-reduced MSE loss (the reference)."""
    import torch.nn.functional as F

    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def time_steps(step, steps: int = 20, warmup: int = 3) -> float:
    """Milliseconds per call of ``step()`` after ``warmup`` calls (synchronising CUDA when present)."""
    import torch

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    for _ in range(warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - start) * 1000 / steps


def dp_step_ms(model, x, y, steps: int = 20) -> float:
    """Training-step time of ``nn.DataParallel`` over every visible GPU (forward, backward, SGD)."""
    import torch
    import torch.nn.functional as F

    dp = torch.nn.DataParallel(model.cuda())
    opt = torch.optim.SGD(dp.parameters(), lr=0.01)
    x, y = x.cuda(), y.cuda()

    def step():
        opt.zero_grad()
        F.mse_loss(dp(x), y).backward()
        opt.step()

    return time_steps(step, steps)


# --- exercise self-checks ----------------------------------------------------------------------

def simulated_ddp_grads(model, x, y, world_size: int, reduction: str = "mean") -> dict:
    """DDP's averaged gradient computed in one process: each shard's local gradient, then the mean.

    The same arithmetic as ``all_reduce(SUM) / world_size``, without starting processes.
    """
    import torch.nn.functional as F

    total = None
    for rank in range(world_size):
        model.zero_grad()
        F.mse_loss(model(shard(x, rank, world_size)), shard(y, rank, world_size), reduction=reduction).backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        total = grads if total is None else {n: total[n] + grads[n] for n in grads}
    return {n: g / world_size for n, g in total.items()}


def check_sum_loss_factor(answer, batch: int = 8, world_size: int = 2, out_features: int = 5) -> None:
    """Exercise 1: with ``MSELoss(reduction="sum")`` on every rank, DDP's averaged gradient is how many
    times the full-batch mean-loss gradient (the model has ``out_features`` outputs)?"""
    expected = batch * out_features // world_size
    if answer == expected:
        print(f"correct: a rank's sum adds {batch // world_size} samples x {out_features} outputs = {expected} "
              f"squared errors, while the mean divides by all {batch * out_features}; averaging over "
              f"{world_size} ranks leaves a factor {batch * out_features}/{world_size} = {expected}.")
        return
    hint = "Write each rank's loss as a sum of squared errors, average over the ranks, compare with the mean."
    if answer == batch // world_size:
        hint = ("Close: MSELoss's mean divides by every element (samples x outputs), not by the number of "
                "samples.")
    elif answer == batch * out_features:
        hint = "Close: DDP averages over ranks (divides by world_size); it does not sum them."
    raise AssertionError(f"{answer!r} is not it. {hint}")


DP_EVERY_STEP = frozenset({"scatter", "replicate", "gather"})
DP_CHOICES = ("scatter", "replicate", "gather", "all_reduce")


def check_dp_every_step(answer) -> None:
    """Exercise 2: which of ``DP_CHOICES`` does ``nn.DataParallel`` do on every step and DDP never?"""
    chosen = {str(a).strip().lower() for a in answer}
    unknown = chosen - set(DP_CHOICES)
    if unknown:
        raise AssertionError(f"{sorted(unknown)} is not one of the choices {DP_CHOICES}.")
    if chosen == DP_EVERY_STEP:
        print("correct: DP scatters the batch, replicates the module and gathers the outputs on every step; "
              "DDP copies the parameters once (a broadcast at construction), each rank loads its own data and "
              "computes its own loss, and the ranks all-reduce gradients during backward (and, by default, "
              "receive rank 0's buffers before each forward: a broadcast of buffers, not a replicate).")
        return
    hint = []
    if DP_EVERY_STEP - chosen:
        hint.append(f"DP also does {sorted(DP_EVERY_STEP - chosen)} every step (see DataParallel.forward above)")
    if "all_reduce" in chosen:
        hint.append("all_reduce is DDP's step: DP's replicas live in one process and their gradients are "
                    "summed onto the first device by autograd, with no collective between processes")
    raise AssertionError("; ".join(hint) + ".")
