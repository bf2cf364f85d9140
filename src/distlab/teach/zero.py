"""ZeRO's memory model, and tools that check it against a running DeepSpeed (or PyTorch) engine.

The ZeRO paper (Rajbhandari et al., 2020) counts the *model states* one data-parallel rank holds
for a model of ``psi`` parameters: parameters, gradients and optimizer state. Plain data
parallelism replicates all three on every rank; ZeRO stage 1 partitions the optimizer state over
the ``N`` ranks, stage 2 also the gradients, stage 3 also the parameters.

Bytes per parameter depend on precision. The paper's mixed-precision Adam keeps fp16 parameters
(2) and gradients (2) plus an fp32 master copy, momentum and variance (4 + 4 + 4 = 12): 16 bytes.
This book trains in fp32 on CPU, where no master copy is needed: fp32 parameters (4), gradients (4)
and Adam's two moments (4 + 4 = 8) -- again 16 bytes per parameter, split 4 + 4 + 8.

The measuring helpers run inside a worker; they only read tensors, so they never change training.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from distlab.teach import answers

STAGES = (0, 1, 2, 3)
#: bytes per parameter of (parameters, gradients, optimizer state)
PRECISIONS = {"fp32": (4, 4, 8), "mixed": (2, 2, 12)}
#: DeepSpeed's attributes that hold a rank's gradient partition (stages 1-2 and stage 3)
GRAD_PARTITION_ATTRS = ("grads_in_partition", "grad_partitions_flat_buffer")


@dataclass(frozen=True)
class ModelStates:
    """Bytes one rank holds, by kind; ``master`` is an extra fp32 copy some implementations keep."""

    params: float
    grads: float
    optimizer: float
    master: float = 0.0

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.master

    def as_dict(self) -> dict:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer,
                "master": self.master, "total": self.total}


def zero_bytes(psi: int, world_size: int, stage: int, precision: str = "fp32") -> ModelStates:
    """The paper's model: per-rank bytes of model states for ``psi`` parameters at a ZeRO stage.

    Each kind of state is either replicated (``k * psi``) or partitioned (``k * psi / N``);
    stage s partitions the first s kinds in the order optimizer state, gradients, parameters.
    """
    if stage not in STAGES:
        raise ValueError(f"ZeRO stage must be one of {STAGES}, not {stage!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, not {world_size!r}")
    p, g, o = PRECISIONS[precision]
    n = world_size
    return ModelStates(params=p * psi / (n if stage >= 3 else 1),
                       grads=g * psi / (n if stage >= 2 else 1),
                       optimizer=o * psi / (n if stage >= 1 else 1))


def deepspeed_fp32_bytes(psi: int, world_size: int, stage: int) -> ModelStates:
    """What DeepSpeed 0.19 actually keeps in fp32: the paper's model plus, at stages 1 and 2, an
    fp32 clone of the rank's parameter partition for the optimizer to update (``master``). In
    fp32 that clone is redundant; stage 3 shares the partition instead of cloning it."""
    base = zero_bytes(psi, world_size, stage, "fp32")
    master = 4 * psi / world_size if stage in (1, 2) else 0.0
    return ModelStates(base.params, base.grads, base.optimizer, master)


def skip_shm_comm_build() -> None:
    """Tell DeepSpeed not to JIT-compile its shared-memory CPU all-reduce kernel.

    On the CPU accelerator ``deepspeed.initialize`` compiles that C++ op on first use (146 s on
    2 shared cores when measured); without it DeepSpeed falls back to torch.distributed (gloo
    here), which is what we want to watch anyway. ``deepspeed.ops.__compatible_ops__`` is a
    PRIVATE DeepSpeed table of the ops it may build (no public switch exists): marking the op
    incompatible skips the build. A DeepSpeed upgrade may rename it; the tests check it is there.
    """
    import deepspeed.ops

    if "deepspeed_shm_comm" not in deepspeed.ops.__compatible_ops__:
        raise RuntimeError("DeepSpeed's private op table has no 'deepspeed_shm_comm' entry any more: this "
                           "workaround no longer applies; find the new switch or let DeepSpeed build the op.")
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def deep_mlp(width: int = 256, depth: int = 16, d_in: int = 10, d_out: int = 2) -> nn.Sequential:
    """SimpleModel grown deeper: many equal layers, so no single parameter dominates and ZeRO's
    partitions (which DeepSpeed cuts at parameter granularity for gradients) come out even."""
    layers = [nn.Linear(d_in, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, d_out))
    return nn.Sequential(*layers)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _local(t):
    """A DTensor's local shard (FSDP2), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors``: views of one buffer count once."""
    seen = {}
    for t in tensors:
        if t is None:
            continue
        t = _local(t)
        if t.numel() == 0:
            continue
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _storage_ptrs(tensors) -> set:
    return {_local(t).untyped_storage().data_ptr() for t in tensors if t is not None and _local(t).numel()}


def param_tensors(engine) -> list:
    """The tensors that hold a rank's parameters: ``p.data`` (stages 0-2, and gathered stage-3
    params) and ``p.ds_tensor``, the rank's stage-3 partition."""
    module = getattr(engine, "module", engine)
    out = []
    for p in module.parameters():
        out.append(p.data)
        out.append(getattr(p, "ds_tensor", None))
    return out


def base_optimizer(optimizer):
    """The torch optimizer inside DeepSpeed's ZeRO wrapper (or ``ZeroRedundancyOptimizer``)."""
    while hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return getattr(optimizer, "optim", optimizer)


def optimizer_state_bytes(optimizer) -> int:
    """Bytes of the optimizer's per-parameter state tensors (Adam: ``exp_avg``, ``exp_avg_sq``);
    scalar step counters are left out."""
    base = base_optimizer(optimizer)
    tensors = [v for state in base.state.values() for v in state.values()
               if torch.is_tensor(v) and v.dim() > 0]
    return storage_bytes(tensors)


def master_bytes(engine, optimizer) -> int:
    """Bytes of the tensors the optimizer updates that are *not* the model's parameters: a
    master copy. Zero when the optimizer updates the parameters in place."""
    params = _storage_ptrs(param_tensors(engine))
    updated = [p for g in base_optimizer(optimizer).param_groups for p in g["params"]]
    return storage_bytes([t for t in updated if _local(t).untyped_storage().data_ptr() not in params])


def grad_bytes(engine, optimizer=None) -> int:
    """Bytes of gradient values a rank holds right now.

    DeepSpeed keeps the rank's reduced gradients in a partition buffer (counted whole); every
    other ``p.grad`` counts by its own size, so a gradient that is a view into a communication
    bucket counts its values, not the bucket (the paper leaves such buffers out of model states).
    """
    buffers = [getattr(optimizer, a, None) for a in GRAD_PARTITION_ATTRS] if optimizer is not None else []
    buffers = [b for b in buffers if torch.is_tensor(b)]
    inside = _storage_ptrs(buffers)
    loose = 0
    for p in getattr(engine, "module", engine).parameters():
        g = None if p.grad is None else _local(p.grad)
        if g is not None and g.numel() and g.untyped_storage().data_ptr() not in inside:
            loose += g.numel() * g.element_size()
    return storage_bytes(buffers) + loose


class GradPeak:
    """Largest :func:`grad_bytes` seen during a backward pass, sampled each time a parameter's
    gradient is accumulated (after DeepSpeed's own hook for that parameter, which registered
    first): the moment gradients are most numerous, before a stage-2/3 reduction frees them."""

    def __init__(self, engine, optimizer=None):
        self.engine, self.optimizer, self.peak = engine, optimizer, 0
        module = getattr(engine, "module", engine)
        self._handles = [p.register_post_accumulate_grad_hook(self._hook)
                         for p in module.parameters() if p.requires_grad]

    def _hook(self, _param) -> None:
        self.sample()

    def sample(self) -> int:
        self.peak = max(self.peak, grad_bytes(self.engine, self.optimizer))
        return self.peak

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def measure_ds_step(engine, x, y) -> ModelStates:
    """One DeepSpeed training step that measures the rank's model states: the peak gradient bytes
    during backward, then parameters, optimizer state and any master copy after ``step()``
    (Adam creates its state lazily, on the first step)."""
    peak = GradPeak(engine, engine.optimizer)
    loss = nn.functional.cross_entropy(engine(x), y)
    engine.backward(loss)
    peak.sample()
    peak.remove()
    engine.step()
    return ModelStates(params=storage_bytes(param_tensors(engine)), grads=peak.peak,
                       optimizer=optimizer_state_bytes(engine.optimizer),
                       master=master_bytes(engine, engine.optimizer))


def measure_torch_step(model, optimizer, x, y) -> ModelStates:
    """:func:`measure_ds_step` for a PyTorch-native model (DDP or FSDP2) and its optimizer."""
    optimizer.zero_grad()
    peak = GradPeak(model)
    nn.functional.cross_entropy(model(x), y).backward()
    peak.sample()
    peak.remove()
    optimizer.step()
    return ModelStates(params=storage_bytes(param_tensors(model)), grads=peak.peak,
                       optimizer=optimizer_state_bytes(optimizer), master=master_bytes(model, optimizer))


# --- how close is close enough -------------------------------------------------------------

#: DeepSpeed pads each flat buffer so every rank's partition starts aligned: a few elements.
PAD_BYTES = 4 * 256


def allowed_bytes(model: nn.Module, reduce_bucket_size: int = 0, whole_params: bool = False) -> dict:
    """How far each measured kind may sit from the model, by construction (fp32 bytes).

    Parameters, master copy: alignment padding only. Gradients at stage 2/3: DeepSpeed reduces
    at parameter granularity, bucket by bucket, so a parameter straddling the partition boundary
    is kept whole by both ranks, one more can be freshly computed and not yet bucketed, and a
    bucket's worth waits for its reduction. ``whole_params``: an optimizer that shards by whole
    parameters (``ZeroRedundancyOptimizer``) can be one parameter's state out of balance.
    """
    largest = max(p.numel() for p in model.parameters())
    return {"params": PAD_BYTES, "master": PAD_BYTES,
            "grads": 4 * (2 * largest + int(reduce_bucket_size)) + PAD_BYTES,
            "optimizer": PAD_BYTES + (8 * largest if whole_params else 0)}


def assert_states_match(label: str, measured: dict, predicted: ModelStates, allowed: dict) -> None:
    """Raise AssertionError naming the first kind of state whose bytes are off by more than allowed."""
    pred = predicted.as_dict()
    for kind in ("params", "grads", "optimizer", "master"):
        m, p = measured[kind], pred[kind]
        assert abs(m - p) <= allowed[kind], (
            f"{label} {kind}: measured {m:,.0f} B, predicted {p:,.0f} B (allowed ±{allowed[kind]:,})")


def states_table(rows, unit: float = 1e6) -> str:
    """Text table of measured/predicted MB by kind; ``rows``: ``[(label, measured, predicted)]``."""
    kinds = ("params", "grads", "optimizer", "master", "total")
    title = "MB: measured/predicted"
    width = max(len(title), *(len(label) for label, _, _ in rows)) + 2
    lines = [f"{title:<{width}}" + "".join(f"{k:>11}{'':7}" for k in kinds)]
    for label, measured, predicted in rows:
        pred = predicted.as_dict()
        got = {**measured, "total": sum(measured[k] for k in kinds[:-1])}
        lines.append(f"{label:<{width}}" + "".join(f"{got[k] / unit:>10.3f}/{pred[k] / unit:<7.3f}" for k in kinds))
    return "\n".join(line.rstrip() for line in lines)


# --- the math ZeRO must not change ---------------------------------------------------------

def reference_losses(model_fn, dataset, world_size: int, batch_size: int, epochs: int, lr: float,
                     average: bool = True, seed: int = 0) -> dict:
    """Data-parallel SGD simulated in one process: the per-rank losses a correct run must log.

    Each step, "rank" r takes its next batch from ``DistributedSampler(rank=r)``; with ``average``
    the one model steps along the mean of the ranks' gradients (what DDP and every ZeRO stage
    compute). With ``average=False`` every rank trains its own copy on its own shard: the
    counterfactual of ranks that never communicate, to show a tolerance can tell them apart.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: extra threads only fight the ranks for the cores
    try:
        return _simulate(model_fn, dataset, world_size, batch_size, epochs, lr, average, seed)
    finally:
        torch.set_num_threads(threads)


def _simulate(model_fn, dataset, world_size, batch_size, epochs, lr, average, seed) -> dict:
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    torch.manual_seed(seed)
    first = model_fn()
    models = [first] + [_copy(first, model_fn) for _ in range(world_size - 1 if not average else 0)]
    opts = [torch.optim.SGD(m.parameters(), lr=lr) for m in models]
    samplers = [DistributedSampler(dataset, num_replicas=world_size, rank=r, shuffle=True) for r in range(world_size)]
    losses = {r: [] for r in range(world_size)}
    for epoch in range(epochs):
        for s in samplers:
            s.set_epoch(epoch)
        loaders = [DataLoader(dataset, batch_size=batch_size, sampler=s) for s in samplers]
        for batches in zip(*loaders, strict=True):
            _sgd_step(models, opts, batches, losses)
    return losses


def _copy(model, model_fn):
    clone = model_fn()
    clone.load_state_dict(model.state_dict())
    return clone


def _sgd_step(models, opts, batches, losses) -> None:
    """One step: a shared model sums rank losses / N (= mean of rank gradients); separate ones don't."""
    for opt in opts:
        opt.zero_grad()
    world = len(batches)
    for r, (x, y) in enumerate(batches):
        model = models[r % len(models)]
        loss = nn.functional.cross_entropy(model(x), y)
        (loss / (world if len(models) == 1 else 1)).backward()
        losses[r].append(loss.item())
    for opt in opts:
        opt.step()


def max_loss_gap(a: dict, b: dict) -> float:
    """Largest |a - b| over ranks and steps of two ``{rank: [loss, ...]}`` records."""
    gaps = [abs(x - y) for r in a for x, y in zip(a[r], b[r], strict=True)]
    return max(gaps)


# --- exercises -----------------------------------------------------------------------------

def _close(answer, expected: float) -> bool:
    """Whether ``answer`` is right: chapter 8's sizes are read off in MB or GB: within 1 %."""
    return answers.close(answer, expected, rel=0.01, floor=1e-9)


def check_optimizer_bytes(answer, psi: int, stage: int, world_size: int, precision: str = "fp32") -> bool:
    """Exercise 1: per-rank optimizer-state bytes for ``psi`` parameters at a stage and world size."""
    if answers.unanswered(answer, "a number of bytes"):
        return False
    expected = zero_bytes(psi, world_size, stage, precision).optimizer
    per = PRECISIONS[precision][2]
    if _close(answer, per * psi) and stage >= 1 and world_size > 1:
        raise AssertionError(f"That is the whole optimizer state. ZeRO-{stage} partitions it over {world_size} ranks.")
    assert _close(answer, expected), (
        f"Not quite: {answer!r}. Adam keeps {per} bytes of optimizer state per parameter in {precision}; "
        f"stages >= 1 divide it by the world size, stage 0 does not.")
    print(f"correct: {expected:,.0f} bytes")
    return True


def check_smallest_stage(answer, psi: int, world_size: int, budget_bytes: float, precision: str = "fp32") -> bool:
    """Exercise 2: the smallest ZeRO stage whose per-rank model states fit in ``budget_bytes``."""
    if answers.unanswered(answer, "a stage number (0-3), or -1 if none fits"):
        return False
    fits = [s for s in STAGES if zero_bytes(psi, world_size, s, precision).total <= budget_bytes]
    expected = fits[0] if fits else -1
    totals = ", ".join(f"stage {s}: {zero_bytes(psi, world_size, s, precision).total / 1e9:.2f} GB" for s in STAGES)
    assert answer == expected, f"Not quite: {answer!r}. Compare each stage's per-rank total with the budget."
    print(f"correct: stage {expected} ({totals})" if expected >= 0 else f"correct: none fits ({totals})")
    return True


def check_paper_example(answer_gb) -> bool:
    """Exercise 3: the paper's 7.5B-parameter model on 64 GPUs with mixed-precision Adam, ZeRO-2."""
    if answers.unanswered(answer_gb, "gigabytes (1e9 bytes) per GPU"):
        return False
    expected = zero_bytes(7_500_000_000, 64, 2, "mixed").total / 1e9
    assert _close(answer_gb, expected), (
        f"Not quite: {answer_gb!r}. Mixed precision is 2 + 2 + 12 bytes per parameter; ZeRO-2 keeps the 2-byte "
        "parameters whole and divides gradients and optimizer state by 64.")
    print(f"correct: {expected:.1f} GB per GPU (the paper's Figure 1 says 16.6 GB)")
    return True


def adam_update_ratio(scale: float, steps: int = 3, seed: int = 0) -> float:
    """How much Adam's parameter update grows when every gradient is multiplied by ``scale``."""
    g = torch.Generator().manual_seed(seed)
    grads = [torch.randn(1000, generator=g) for _ in range(steps)]
    moved = []
    for s in (1.0, scale):
        p = nn.Parameter(torch.zeros(1000))
        opt = torch.optim.Adam([p], lr=1e-3)
        for grad in grads:
            p.grad = grad * s
            opt.step()
        moved.append(p.detach().abs().sum().item())
    return moved[1] / moved[0]


def check_adam_scale(answer) -> bool:
    """Exercise 4: the factor by which Adam's update changes when all gradients are scaled by N."""
    if answers.unanswered(answer, "a number: the factor"):
        return False
    expected = adam_update_ratio(2.0)
    assert _close(answer, expected), (
        f"Not quite: {answer!r}. Adam divides the momentum m by sqrt(v); scale every gradient by c and m scales by c, "
        "sqrt(v) by |c| as well.")
    print(f"correct: measured ratio {expected:.6f} (SGD's would be 2): a missing average over ranks barely shows "
          "in Adam's losses, which is one reason this chapter checks the math with SGD.")
    return True


def check_zero1_load(answer, world_size: int) -> bool:
    """Exercise 5: which ranks call ``ZeroRedundancyOptimizer.load_state_dict`` with rank 0's consolidated file."""
    if answers.unanswered(answer, "a list of ranks"):
        return False
    ranks = sorted(int(r) for r in answer)
    alone = world_size == 1  # rank 0 is then every rank
    assert ranks != [0] or alone, ("Rank 0 saved the file, but every rank's optimizer holds a share: each must "
                                   "load the consolidated state and keep the part it owns.")
    assert ranks == list(range(world_size)), f"Not quite: {answer!r}. Which ranks hold optimizer state?"
    print("correct: every rank calls load_state_dict with the whole state and keeps its own partition")
    return True
