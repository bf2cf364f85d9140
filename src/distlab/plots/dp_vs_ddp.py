"""Plots for chapters 1-3: threads vs processes, gradient agreement, replica drift."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

KIND_COLORS = {"serial": "#888888", "threads": "#d95f02", "processes": "#1b9e77"}


def plot_gil(results: dict[str, dict]):
    """Left: wall time of the same pure-Python work per kind. Right: cores busy (CPU s / wall s)."""
    kinds = list(results)
    colors = [KIND_COLORS.get(k, "#7570b3") for k in kinds]
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.2))
    left.bar(kinds, [results[k]["wall"] for k in kinds], color=colors)
    left.set_ylabel("wall time (s)")
    left.set_title("same work, 2 workers")
    right.bar(kinds, [results[k]["cores"] for k in kinds], color=colors)
    right.axhline(1.0, color="black", linestyle="--", linewidth=1, label="one core")
    right.set_ylim(0, max(1.2, 1.25 * max(results[k]["cores"] for k in kinds)))
    right.set_ylabel("cores busy (CPU s / wall s)")
    right.set_title("parallelism achieved")
    right.legend(loc="upper left")
    fig.tight_layout()
    return fig


def plot_grad_agreement(reference: dict, per_rank: dict[int, dict]):
    """Every gradient element: one process on the full batch (x) vs DDP on each rank (y)."""
    import torch

    ref = torch.cat([g.flatten() for g in reference.values()])
    fig, ax = plt.subplots(figsize=(4.2, 4))
    for rank, grads in sorted(per_rank.items()):
        got = torch.cat([grads[k].flatten().cpu() for k in reference])
        ax.scatter(ref, got, s=14, alpha=0.6, label=f"rank {rank} (DDP)", marker="o" if rank == 0 else "x")
    lo, hi = float(ref.min()), float(ref.max())
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="y = x")
    ax.set_xlabel("gradient, one process, full batch")
    ax.set_ylabel("gradient after DDP backward")
    ax.legend()
    fig.tight_layout()
    return fig


def plot_replica_drift(ddp: list[float], local: list[float]):
    """Largest parameter difference between ranks after each step, with and without DDP."""
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    steps = range(1, len(ddp) + 1)
    ax.plot(steps, local, marker="o", color="#d95f02", label="no DDP (local gradients)")
    ax.plot(steps, ddp, marker="s", color="#1b9e77", label="DDP (averaged gradients)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("max |param(rank r) - param(rank 0)|")
    ax.legend()
    fig.tight_layout()
    return fig
