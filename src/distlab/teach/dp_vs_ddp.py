"""Chapter 1: DataParallel vs DistributedDataParallel, measured rather than told.

* :func:`gil_experiment` times pure-Python work on threads and on processes: threads share one
  interpreter lock (the GIL), so they cannot run Python bytecode at the same time; processes can.
  ``nn.DataParallel`` drives its devices from threads of one process; DDP uses one process per device.
* :func:`dp_step_ms` and :func:`time_steps` time a training step (the chapter's GPU comparison).
* :func:`full_batch_grads` and :func:`shard` (with :func:`distlab.teach.toy.max_abs_diff`) check DDP's central promise:
  N ranks on batch/N each, gradients averaged, equal one process on the whole batch with a mean loss.

torch is imported inside the functions: process-pool children import this module, and should
start in a blink rather than spend two seconds importing torch for a loop of integer additions.
"""
from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

KINDS = ("serial", "threads", "processes")


def spin(iterations: int) -> int:
    """Pure-Python CPU work: every iteration holds the GIL, none waits on I/O or native code."""
    total = 0
    for i in range(iterations):
        total += i * i
    return total


def spin_cpu_seconds(iterations: int) -> float:
    """Run :func:`spin` and return the CPU seconds *this thread* spent on it.

    Summed over workers and divided by wall time this gives "cores busy": a lock that lets one
    thread run at a time keeps it at or below 1, whatever else the machine is doing.
    """
    start = time.thread_time()
    spin(iterations)
    return time.thread_time() - start


def time_pool(kind: str, workers: int, iterations: int, pool=None) -> tuple[float, float]:
    """(wall seconds, cores busy) for ``workers`` chunks of :func:`spin`: one after another
    (``serial``), or on the threads or processes of ``pool``."""
    start = time.perf_counter()
    if kind == "serial":
        cpu = sum(spin_cpu_seconds(iterations) for _ in range(workers))
    else:
        cpu = sum(pool.map(spin_cpu_seconds, [iterations] * workers))
    wall = time.perf_counter() - start
    return wall, cpu / wall


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


SERIAL_MIN_CORES = 0.9  # the serial run had a core to itself
PROCESSES_MIN_CORES = 1.5  # the two processes got (most of) two cores
PROCESSES_MAX_CPU = 1.15  # ...at full speed: CPU time for the same work at most 15% over the serial run's


def unfair(results: dict[str, dict]) -> list[str]:
    """Why these measurements cannot test the speed-up claims (empty when they can).

    Threads being no faster than serial is only news when the serial run had a core to itself;
    processes being faster needs a machine that gave them two cores' worth of CPU, at full speed
    (on a host whose other work shares those cores, each process computes more slowly).
    """
    problems = []
    if results["serial"]["cores"] < SERIAL_MIN_CORES:
        problems.append(f"the serial run got {results['serial']['cores']:.2f} cores (needs {SERIAL_MIN_CORES})")
    if results["processes"]["cores"] < PROCESSES_MIN_CORES:
        problems.append(f"the two processes got {results['processes']['cores']:.2f} cores "
                        f"(need {PROCESSES_MIN_CORES})")
    cpu = {kind: results[kind]["wall"] * results[kind]["cores"] for kind in ("serial", "processes")}
    if cpu["processes"] > PROCESSES_MAX_CPU * cpu["serial"]:  # a core shared with other work runs slower
        problems.append(f"the two processes needed {cpu['processes'] / cpu['serial']:.2f}x the serial run's "
                        f"CPU time for the same work (need at most {PROCESSES_MAX_CPU})")
    return problems


def gil_experiment(iterations: int = 2_000_000, workers: int = 2, rounds: int = 3, max_rounds: int = 15,
                   max_seconds: float = 30.0) -> tuple[dict[str, dict], int]:
    """The same work (``workers`` chunks) per kind: ``({kind: {"wall": s, "cores": cores busy}}, rounds run)``.

    Kinds are interleaved round by round and each keeps its fastest round, so a burst of load
    from other programs on a shared machine hits every kind alike and is mostly filtered out.
    After ``rounds`` rounds it goes on while :func:`unfair` finds the best rounds unfit to test the
    speed-ups, up to ``max_rounds`` rounds or ``max_seconds``: a busy moment is waited out, not hidden.
    """
    pools = {kind: make_pool(kind, workers) for kind in ("threads", "processes")}
    best = {kind: (float("inf"), 0.0) for kind in KINDS}
    start, done = time.monotonic(), 0
    try:
        while done < rounds or (done < max_rounds and unfair(_as_results(best))
                                and time.monotonic() - start < max_seconds):
            for kind in KINDS:
                best[kind] = min(best[kind], time_pool(kind, workers, iterations, pools.get(kind)))
            done += 1
    finally:
        for pool in pools.values():
            pool.shutdown()
    return _as_results(best), done


def _as_results(best: dict) -> dict[str, dict]:
    return {kind: {"wall": wall, "cores": cores} for kind, (wall, cores) in best.items()}


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
