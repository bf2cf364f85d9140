"""Chapter 11, DDP in practice: reference numbers the chapter's runs are checked against, and the
exercises' self-checks.

The chapter's own cells hold the code a learner reads (training loops, hooks, the synchronised
BatchNorm); what is here only predicts or compares: how many bytes a communication hook should
send, how a gradient compares with another, what an exercise's answer must be.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from distlab.teach import answers

# --------------------------------------------------------------------------- comparing gradients


def flat_grad(module: nn.Module) -> torch.Tensor:
    """Every parameter's gradient in one CPU vector (zeros where a parameter has none)."""
    parts = [torch.zeros(p.numel()) if p.grad is None else p.grad.detach().float().cpu().reshape(-1)
             for p in module.parameters()]
    return torch.cat(parts)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine of the angle between two vectors: 1.0 when they point the same way."""
    return float(torch.dot(a, b) / (a.norm() * b.norm()))


def max_rel_gap(a: list[float], b: list[float]) -> float:
    """Largest ``|a_i - b_i| / |b_i|`` over two equally long sequences (e.g. two loss curves)."""
    if len(a) != len(b):
        raise ValueError(f"sequences differ in length: {len(a)} vs {len(b)}")
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


# --------------------------------------------------------------------------- communication hooks


def param_bytes(model: nn.Module, bytes_per_element: int = 4) -> int:
    """Bytes of all parameters at ``bytes_per_element``: what one all-reduce of the gradients sends."""
    return sum(p.numel() for p in model.parameters()) * bytes_per_element


def powersgd_compresses(shape: tuple[int, ...], rank: int, min_compression_rate: float = 2) -> bool:
    """PowerSGD's rule: a gradient of at least two dimensions is compressed when its low-rank
    factors are ``min_compression_rate`` times smaller than the tensor itself."""
    if len(shape) < 2:
        return False
    n, m = shape[0], math.prod(shape[1:])
    return (n + m) * rank * min_compression_rate < n * m


def powersgd_bytes(model: nn.Module, rank: int, min_compression_rate: float = 2) -> int:
    """fp32 bytes PowerSGD all-reduces per step once compression has started.

    A compressed ``n x m`` gradient travels as two factors, ``P`` (``n x rank``) and ``Q``
    (``m x rank``); every other gradient (biases, matrices not worth compressing) goes whole.
    """
    total = 0
    for p in model.parameters():
        shape = tuple(p.shape)
        if powersgd_compresses(shape, rank, min_compression_rate):
            total += (shape[0] + math.prod(shape[1:])) * rank * 4
        else:
            total += p.numel() * 4
    return total


# --------------------------------------------------------------------------- BatchNorm reference


def ema(values: list[float], momentum: float, start: float = 0.0) -> float:
    """BatchNorm's running statistic after seeing ``values`` one batch at a time."""
    running = start
    for v in values:
        running = (1 - momentum) * running + momentum * v
    return running


# --------------------------------------------------------------------------- learning-rate scaling


def linear_scaled_lr(base_lr: float, base_batch: int, batch: int) -> float:
    """The linear scaling rule (Goyal et al., 2017): the learning rate grows with the global batch."""
    return base_lr * batch / base_batch


def warmup_lr(step: int, peak_lr: float, warmup_steps: int, start_lr: float | None = None) -> float:
    """Linear warm-up from ``start_lr`` (default ``peak_lr / warmup_steps``) to ``peak_lr``."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return peak_lr
    start = peak_lr / warmup_steps if start_lr is None else start_lr
    return start + (peak_lr - start) * step / warmup_steps


# --------------------------------------------------------------------------- exercises


def _close(answer, expected: float) -> bool:
    """Whether ``answer`` is right: chapter 11's numbers are computed exactly: within 0.1 %."""
    return answers.close(answer, expected, rel=1e-3, floor=1e-12)


def check_hook_bytes(answer, model: nn.Module, hook: str, rank: int = 1) -> bool:
    """Exercise 1: bytes one step all-reduces for ``model`` under ``hook`` ("fp16", "bf16" or
    "powersgd", the latter with ``matrix_approximation_rank=rank`` once compression started)."""
    if answers.unanswered(answer, "a number of bytes"):
        return False
    expected = {"fp16": param_bytes(model, 2), "bf16": param_bytes(model, 2),
                "powersgd": powersgd_bytes(model, rank)}[hook]
    if _close(answer, param_bytes(model)):
        raise AssertionError(f"{answer!r} is the uncompressed fp32 gradient. What does the {hook} hook send instead?")
    assert _close(answer, expected), (
        f"Not quite: {answer!r}. fp16/bf16 send 2 bytes per gradient element; PowerSGD sends (n + m) * rank "
        "fp32 numbers for each n x m matrix it compresses and every other gradient whole.")
    print(f"correct: {expected:,} bytes per step")
    return True


def check_unused_grad(answer, local_grad: float, world_size: int, ranks_using: int) -> bool:
    """Exercise 2: the gradient DDP leaves on a parameter that only ``ranks_using`` of
    ``world_size`` ranks used, each computing ``local_grad`` for it."""
    if answers.unanswered(answer, "a number"):
        return False
    expected = local_grad * ranks_using / world_size
    if _close(answer, local_grad):
        raise AssertionError("That is one rank's local gradient. DDP averages over *all* ranks; "
                             "what do the ranks that did not use the parameter contribute?")
    assert _close(answer, expected), f"Not quite: {answer!r}. Average over all {world_size} ranks, zeros included."
    print(f"correct: {expected:g}. The ranks that skipped the branch contribute zeros to the average.")
    return True


def check_warmup_lr(answer, base_lr: float, base_batch: int, batch: int, warmup_steps: int, step: int) -> bool:
    """Exercise 3: the learning rate at ``step`` under the linear rule with linear warm-up from
    ``base_lr`` (the small-batch rate) to the scaled rate."""
    if answers.unanswered(answer, "a learning rate"):
        return False
    peak = linear_scaled_lr(base_lr, base_batch, batch)
    expected = warmup_lr(step, peak, warmup_steps, start_lr=base_lr)
    if _close(answer, peak) and step < warmup_steps:
        raise AssertionError(f"{answer!r} is the peak rate; step {step} is still inside the warm-up.")
    assert _close(answer, expected), (
        f"Not quite: {answer!r}. The peak is base_lr * batch / base_batch = {peak:g}; warm-up goes linearly "
        f"from {base_lr:g} at step 0 to the peak at step {warmup_steps}.")
    print(f"correct: {expected:g} (peak {peak:g} from step {warmup_steps} on)")
    return True
