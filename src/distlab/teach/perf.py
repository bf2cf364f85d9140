"""The measurement harness of the performance lab (chapter 10) and ``bench/ddp_overhead.py``.

The DDP code a learner reads and writes (``DDP(..., bucket_cap_mb=...)``, gradient accumulation with
``no_sync()``, communication hooks) is in the chapter's cells. What lives here is not the lesson:

* **timing** that survives a shared machine: every variant is timed once per round, in rotating
  order, and we keep medians; every number is then a ratio against a baseline of the same run;
* **references**: :func:`bucket_plan` predicts DDP's buckets, :func:`large_batch_grads` is the
  gradient accumulation must reproduce;
* small **parsers and fits** for the benchmark scripts' tables (:func:`parse_table`,
  :func:`fit_alpha_beta`) and the exercise self-checks.

Some helpers read DDP's **private** logging API (``_get_ddp_logging_data``,
``_set_ddp_runtime_logging_sample_rate``): the only place DDP reports its own bucket count and
communication time. Private means it may change without notice in any torch release.

Workers call these functions inside an initialised process group; nothing here starts processes.
"""
from __future__ import annotations

import contextlib
import copy
import math
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

PHASES = ("forward", "backward", "optimizer")


# ---------------------------------------------------------------- workloads


def make_mlp(width: int = 1024, depth: int = 10) -> nn.Sequential:
    """``depth`` equal Linear layers with ReLUs: 10 x 1024 is 10.5M parameters, 40 MB of gradients (MB = 2**20 B).

    Equal layers make the bucket arithmetic easy to follow: each layer's gradient is 4 MB.
    """
    layers: list[nn.Module] = []
    for i in range(depth):
        layers.append(nn.Linear(width, width))
        if i < depth - 1:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def grad_bytes(model: nn.Module) -> int:
    """Bytes one full gradient all-reduce moves per rank (what DDP synchronises every step)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


@dataclass(frozen=True)
class Workload:
    """A model plus the batches and loss it trains on, addressable by name across processes."""

    name: str
    in_features: int
    out_features: int
    classify: bool

    def model(self) -> nn.Module:
        if self.name == "SimpleModel":
            from .models import SimpleModel

            return SimpleModel()
        return make_mlp(self.in_features, depth=10)

    def batch(self, n: int, seed: int = 0, device="cpu"):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, self.in_features, generator=g)
        if self.classify:
            y = torch.randint(0, self.out_features, (n,), generator=g)
        else:
            y = torch.randn(n, self.out_features, generator=g)
        return x.to(device), y.to(device)

    def loss(self, out, y):
        return F.cross_entropy(out, y) if self.classify else F.mse_loss(out, y)


WORKLOADS = {
    "SimpleModel": Workload("SimpleModel", 10, 2, classify=True),  # the article's model and loss
    "MLP-10M": Workload("MLP-10M", 1024, 1024, classify=False),
}


# ---------------------------------------------------------------- timing


def cuda_sync(device) -> Callable[[], None] | None:
    """GPU kernels run asynchronously: a timer must wait for them, a CPU timer need not."""
    device = torch.device(device)
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None


def alternate(fns: dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 1,
              before: Callable[[], None] | None = None) -> dict[str, list]:
    """Call every variant once per round, rotating which goes first; return each call's result.

    Why: on a shared machine the load drifts. Measuring A, B, A, B ... exposes both variants to
    the same drift, rotating the order removes a first-in-round bias, and the caller takes medians
    so one stalled round does not decide anything. ``before`` (e.g. a barrier) runs untimed.
    """
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    results: dict[str, list] = {name: [] for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            if before is not None:
                before()
            results[name].append(fns[name]())
    return results


def timed(fn: Callable[[], object], sync: Callable[[], None] | None = None) -> float:
    """Seconds one call takes (after ``sync``, so queued GPU work is counted)."""
    start = time.perf_counter()
    fn()
    if sync is not None:
        sync()
    return time.perf_counter() - start


def step_phases(model, opt, x, y, loss_fn, sync=None) -> dict[str, float]:
    """One training step, timed in three parts: forward (with the loss), backward, optimizer.

    For a DDP model the backward part includes waiting for the last all-reduce: whatever
    communication the backward pass did not hide shows up here.
    """
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    t1 = _tick(sync)
    loss.backward()
    t2 = _tick(sync)
    opt.step()
    t3 = _tick(sync)
    return {"forward": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2, "step": t3 - t0}


def _tick(sync) -> float:
    if sync is not None:
        sync()
    return time.perf_counter()


def median_phases(samples: list[dict[str, float]]) -> dict[str, float]:
    """Median of every phase, and of the whole step (the median of sums, not the sum of medians)."""
    return {key: statistics.median(s[key] for s in samples) for key in samples[0]}


def ratios(medians: dict[str, float], baseline: str) -> dict[str, float]:
    return {name: value / medians[baseline] for name, value in medians.items()}


# ---------------------------------------------------------------- DDP overhead and buckets


def ddp_kwargs(device) -> dict:
    """``device_ids`` for a GPU module, nothing for a CPU one (what DDP expects in each case)."""
    device = torch.device(device)
    return {"device_ids": [device.index or 0]} if device.type == "cuda" else {}


def plain_vs_ddp(workload: Workload, batch: int, repeats: int = 5, device="cpu", **ddp_options) -> dict:
    """Step phases of the plain module and of DDP around an identical copy, alternated.

    Needs an initialised process group (any world size). Returns ``{"plain": {...}, "ddp": {...},
    "ratio": ddp step / plain step, "ddp_stats": DDP's own comm/overlap timings}``.
    """
    torch.manual_seed(0)
    base = workload.model().to(device)
    plain = copy.deepcopy(base)
    ddp = DDP(copy.deepcopy(base), **ddp_kwargs(device), **ddp_options)
    ddp._set_ddp_runtime_logging_sample_rate(1)  # private API: let DDP time its comm on every step
    x, y = workload.batch(batch, seed=1 + _rank(), device=device)
    sync = cuda_sync(device)
    opts = {m: torch.optim.SGD(m.parameters(), lr=1e-4) for m in (plain, ddp)}
    stats: list[dict] = []

    def ddp_step():
        out = step_phases(ddp, opts[ddp], x, y, workload.loss, sync)
        stats.append(ddp_comm_stats(ddp))
        return out

    runs = alternate({"plain": lambda: step_phases(plain, opts[plain], x, y, workload.loss, sync),
                      "ddp": ddp_step}, repeats=repeats, warmup=2, before=_barrier)
    result = {name: median_phases(samples) for name, samples in runs.items()}
    result["ratio"] = result["ddp"]["step"] / result["plain"]["step"]
    result["param_diff"] = max((a - b).abs().max().item()  # same data, same steps: equal at world size 1
                               for a, b in zip(plain.parameters(), ddp.module.parameters(), strict=True))
    result["checksums"] = {"plain": checksum(plain), "ddp": checksum(ddp.module)}
    result["ddp_stats"] = median_phases(stats[2:])  # the warm-up steps ran on the initial single bucket
    return result


def checksum(model: nn.Module) -> float:
    """One float64 number per model state, to compare replicas across ranks without shipping weights."""
    return sum(p.detach().double().sum().item() for p in model.parameters())


def ddp_comm_stats(ddp: DDP) -> dict[str, float]:
    """DDP's own measurement of its last step (seconds): communication time, and how much of it
    overlapped the backward computation; plus how many buckets it all-reduced.

    Reads ``DDP._get_ddp_logging_data()``, a private API (there is no public one for these numbers).
    """
    data = ddp._get_ddp_logging_data()
    return {"comm": data.get("backward_comm_time", 0) / 1e9,
            "overlap": data.get("backward_compute_comm_overlap_time", 0) / 1e9,
            "buckets": float(data.get("num_buckets_reduced", 0))}


def ready_order_bytes(model: nn.Module) -> list[int]:
    """Gradient sizes in the order backward produces them: for a feed-forward stack, last layer first."""
    return [p.numel() * p.element_size() for p in reversed(list(model.parameters())) if p.requires_grad]


def bucket_plan(sizes: list[int], cap_bytes: int, first_cap_bytes: int | None = None) -> list[list[int]]:
    """Group gradients into buckets the way DDP's Reducer does: fill the current bucket until it
    holds at least the cap, then start a new one. ``sizes`` are in gradient-ready order.

    Why buckets: one all-reduce per parameter pays the per-message latency hundreds of times; one
    all-reduce for everything cannot start before backward ends. A bucket can be sent as soon as
    its gradients are ready, while backward continues on earlier layers.
    """
    buckets, current, filled = [], [], 0
    limit = first_cap_bytes or cap_bytes
    for index, size in enumerate(sizes):
        current.append(index)
        filled += size
        if filled >= limit:
            buckets.append(current)
            current, filled, limit = [], 0, cap_bytes
    if current:
        buckets.append(current)
    return buckets


# ---------------------------------------------------------------- no_sync gradient accumulation


def global_batch(workload: Workload, world: int, k: int, micro: int, seed: int = 0, device="cpu"):
    """The same data on every rank: ``world * k`` micro-batches of ``micro`` samples."""
    x, y = workload.batch(world * k * micro, seed=seed, device=device)
    return x, y


def my_micro_batches(x, y, rank: int, world: int, k: int):
    """Rank ``rank``'s share of the global batch, cut into ``k`` micro-batches."""
    xs, ys = x.chunk(world)[rank].chunk(k), y.chunk(world)[rank].chunk(k)
    return list(zip(xs, ys, strict=True))


def large_batch_grads(model: nn.Module, x, y, loss_fn) -> list[torch.Tensor]:
    """The reference: the gradient of the mean loss over the whole global batch, in one pass."""
    model.zero_grad(set_to_none=True)
    loss_fn(model(x), y).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def max_grad_diff(model: nn.Module, reference: list[torch.Tensor]) -> float:
    return max((p.grad - r).abs().max().item() for p, r in zip(model.parameters(), reference, strict=True))


def no_sync_timing(workload: Workload, ks: list[int], micro: int, accumulate: Callable, repeats: int = 3,
                   device="cpu") -> dict:
    """Seconds per sample of a whole optimizer step (k micro-batches, one all-reduce, one update),
    for each k, alternated in one run. ``accumulate(ddp, micro_batches, loss_fn)`` is the chapter's
    gradient accumulation (the lesson); this function only times it."""
    world, rank = dist.get_world_size(), _rank()
    torch.manual_seed(0)
    ddp = DDP(workload.model().to(device), **ddp_kwargs(device))
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    sync = cuda_sync(device)
    data = {k: my_micro_batches(*global_batch(workload, world, k, micro, device=device), rank, world, k) for k in ks}

    def optimizer_step(k):
        opt.zero_grad(set_to_none=True)
        accumulate(ddp, data[k], workload.loss)
        opt.step()

    runs = alternate({k: (lambda k=k: timed(lambda: optimizer_step(k), sync) / (k * micro)) for k in ks},
                     repeats=repeats, warmup=1, before=_barrier)
    return {k: statistics.median(v) for k, v in runs.items()}


# ---------------------------------------------------------------- profiler


def profile_ddp_step(workload: Workload, batch: int, device="cpu", **ddp_options) -> dict:
    """Profile the third DDP step of a fresh model (after DDP has rebuilt its buckets), on every rank."""
    torch.manual_seed(0)
    ddp = DDP(workload.model().to(device), **ddp_kwargs(device), **ddp_options)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    x, y = workload.batch(batch, seed=1 + _rank(), device=device)
    for _ in range(2):
        step_phases(ddp, opt, x, y, workload.loss)
    result = profile_step(ddp, opt, x, y, workload.loss)
    result["buckets"] = int(ddp_comm_stats(ddp)["buckets"])
    return result


def profile_step(model, opt, x, y, loss_fn) -> dict:
    """One step under ``torch.profiler``: the top operators by CPU time and the all-reduce count."""
    from torch.profiler import ProfilerActivity, profile

    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
        step_phases(model, opt, x, y, loss_fn)
    events = prof.key_averages()
    allreduces = sum(e.count for e in events if e.key == "c10d::allreduce_")  # the op every backend dispatches
    return {"table": events.table(sort_by="cpu_time_total", row_limit=8, max_name_column_width=48),
            "allreduce_calls": allreduces}


@contextlib.contextmanager
def quiet_stderr():
    """The profiler's C++ side prints start/stop lines on file descriptor 2; silence just those."""
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


# ---------------------------------------------------------------- process group helpers


@contextlib.contextmanager
def single_rank_group(backend: str = "gloo"):
    """A world-size-1 process group in *this* process, over a FileStore in a temporary folder.

    Lets DDP's cost be measured with no second process and no socket; destroyed on exit.
    """
    with tempfile.TemporaryDirectory() as folder:
        store = dist.FileStore(os.path.join(folder, "store"), 1)
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


@contextlib.contextmanager
def threads(n: int):
    """Run the block with ``n`` intra-op threads. Giving a one-rank measurement the share of cores each rank
    of a two-rank job gets makes the two comparable, and an oversubscribed machine hurts it less."""
    saved = torch.get_num_threads()
    torch.set_num_threads(max(1, n))
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


# ---------------------------------------------------------------- benchmark scripts, tables and fits


#: benchmarks the package ships, so that a chapter opened alone (no bench/ beside it) runs them; each
#: bench/<name> of the repository runs the same module
SHIPPED_BENCHES = {"launch_latency.py": "distlab.teach.launch_latency"}


def bench_script(name: str) -> Path:
    """Where ``bench/<name>`` is: next to the book (a chapter's cwd is ``book/``), or in the checkout
    this distlab was installed from (editable install)."""
    candidates = [Path.cwd().parent / "bench" / name, Path(__file__).resolve().parents[3] / "bench" / name]
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(f"bench/{name} not found (looked in {', '.join(str(c.parent) for c in candidates)}); "
                            "run the chapter from a checkout of the distlab repository.")


def bench_command(name: str) -> list[str]:
    """The command that runs benchmark ``bench/<name>``: ``python -m <module>`` for one the package ships
    (an installed distlab has it, wherever the chapter is), else ``python bench/<name>`` of a checkout."""
    import sys

    if name in SHIPPED_BENCHES:
        return [sys.executable, "-m", SHIPPED_BENCHES[name]]
    return [sys.executable, str(bench_script(name))]


def run_bench(name: str, *args: str, timeout: float = 300) -> str:
    """Run benchmark ``bench/<name>`` with ARGS as a terminal user would (:func:`bench_command`); return
    what it printed."""
    import subprocess

    done = subprocess.run([*bench_command(name), *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"bench/{name} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?[a-zA-Z%x]*$")


def parse_table(text: str) -> list[dict]:
    """Rows of the first whitespace/pipe-separated table in a benchmark's output.

    A header is a line of words followed by lines with as many cells; numbers (optionally with a
    unit suffix such as ``ms`` or ``x``) become floats.
    """
    lines = [[c for c in re.split(r"\s*\|\s*|\s{2,}|\t", line.strip()) if c] for line in text.splitlines()]
    for i, header in enumerate(lines[:-1]):
        rows = []
        for cells in lines[i + 1:]:
            if set("".join(cells)) <= set("-=+:"):
                continue  # a rule under the header
            if len(cells) != len(header):
                break
            rows.append(dict(zip(header, (_cell(c) for c in cells), strict=True)))
        if rows and not any(isinstance(_cell(h), float) for h in header):
            return rows
    raise ValueError("no table found in the benchmark's output")


def _cell(text: str):
    if not _NUMBER.match(text):
        return text
    return float(re.sub(r"[a-zA-Z%]+$", "", text))


def last_ratio(text: str) -> float:
    """The headline every benchmark prints as its last line: ``ratio: X``."""
    last = text.strip().splitlines()[-1]
    match = re.fullmatch(r"ratio:\s*([-+0-9.eE]+)\s*", last)
    if not match:
        raise ValueError(f"the last line is not 'ratio: X': {last!r}")
    return float(match.group(1))


def fit_alpha_beta(sizes: list[float], seconds: list[float]) -> tuple[float, float]:
    """Fit the latency-bandwidth model ``t(n) = alpha + n / beta`` (seconds, bytes/second).

    Least squares on *relative* error, so the microsecond points weigh as much as the
    millisecond ones (plain least squares would let the largest message decide alpha).
    """
    w = [1.0 / t for t in seconds]
    a11 = sum(wi * wi for wi in w)
    a12 = sum(wi * wi * n for wi, n in zip(w, sizes, strict=True))
    a22 = sum(wi * wi * n * n for wi, n in zip(w, sizes, strict=True))
    b1 = sum(wi * wi * t for wi, t in zip(w, seconds, strict=True))
    b2 = sum(wi * wi * n * t for wi, n, t in zip(w, sizes, seconds, strict=True))
    det = a11 * a22 - a12 * a12
    alpha = (b1 * a22 - b2 * a12) / det
    inverse_beta = (a11 * b2 - a12 * b1) / det
    return max(alpha, 0.0), (1.0 / inverse_beta if inverse_beta > 0 else math.inf)


def crossover_bytes(alpha: float, beta: float) -> float:
    """The message size where sending takes as long as starting: below it latency dominates."""
    return alpha * beta


def regime(n_bytes: float, alpha: float, beta: float) -> str:
    return "latency" if n_bytes < crossover_bytes(alpha, beta) else "bandwidth"


# ---------------------------------------------------------------- exercise self-checks


def check_bucket_count(answer, model: nn.Module, cap_mb: float) -> bool:
    """Exercise: how many buckets does DDP make for ``model`` with ``bucket_cap_mb=cap_mb``?"""
    if answer is None:
        print("No answer yet: replace None with a number of buckets.")
        return False
    expected = len(bucket_plan(ready_order_bytes(model), int(cap_mb * 2**20)))
    assert int(answer) == expected, (
        f"{answer} is not it. Hint: gradients arrive last layer first, and a bucket closes as soon as it "
        f"holds at least {cap_mb} MB (so it may hold a little more). The model has "
        f"{grad_bytes(model) / 2**20:.2f} MB of gradients; list the size of each parameter in ready order.")
    print("correct")
    return True


def check_allreduce_bytes(answer, model: nn.Module, world: int, k: int, micro: int) -> bool:
    """Exercise: gradient bytes each rank all-reduces per training sample, with k-step accumulation."""
    if answer is None:
        print("No answer yet: replace None with a number of bytes.")
        return False
    expected = grad_bytes(model) / (world * k * micro)
    assert math.isclose(float(answer), expected, rel_tol=0.01), (
        f"{answer:.0f} is not it. Hint: each optimizer step all-reduces every gradient once "
        f"({grad_bytes(model)} bytes), and one optimizer step consumes world * k * micro samples.")
    print("correct")
    return True


def check_fp16_hook(hook) -> bool:
    """Exercise 3: a communication hook that all-reduces the bucket in float16, like torch's
    ``fp16_compress_hook``. Runs in this process, in a one-rank group: the gradients it leaves must equal
    torch's hook's bit for bit, and differ from DDP's default (float32) ones."""
    if hook is None:
        print("No answer yet: replace None with your hook function hook(state, bucket).")
        return False
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    workload = Workload("check", 64, 64, classify=False)
    x, y = workload.batch(8, seed=3)

    def gradients(register) -> list[torch.Tensor]:
        torch.manual_seed(0)
        ddp = DDP(workload.model())
        register(ddp)
        workload.loss(ddp(x), y).backward()
        return [p.grad.clone() for p in ddp.module.parameters()]

    with single_rank_group():
        default = gradients(lambda ddp: None)
        torchs = gradients(lambda ddp: ddp.register_comm_hook(None, default_hooks.fp16_compress_hook))
        yours = gradients(lambda ddp: ddp.register_comm_hook(None, hook))
    assert all(a.dtype == torch.float32 for a in yours), "the gradients must come back as float32: cast back"
    assert any(not torch.equal(a, b) for a, b in zip(yours, default, strict=True)), (
        "your gradients are DDP's float32 ones: the bucket was not all-reduced in float16")
    assert all(torch.equal(a, b) for a, b in zip(yours, torchs, strict=True)), (
        "not the same as torch's fp16_compress_hook: cast the bucket to float16, divide by the world size, "
        "all-reduce, then copy the result back into bucket.buffer() and return it")
    print("correct: float16 on the wire, half the bytes of every all-reduce, gradients rounded to float16")
    return True
