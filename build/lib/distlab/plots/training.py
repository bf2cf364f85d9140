"""Figures for chapter 7 (the two-GPU training script): loss curves per rank, and throughput."""
from __future__ import annotations

from matplotlib.figure import Figure


def loss_curves(losses_by_rank: dict[int, list[float]], reference: list[float] | None = None):
    """Each rank's loss per optimizer step; optionally the single-process run on the global batches.

    The ranks' curves differ (each sees its own shard), while their mean follows the reference: the
    picture of "DDP = one big batch".
    """
    fig = Figure(figsize=(7, 3.6), layout="constrained")
    ax = fig.subplots()
    for rank, losses in sorted(losses_by_rank.items()):
        ax.plot(range(1, len(losses) + 1), losses, lw=1, alpha=0.8, label=f"rank {rank}")
    if reference is not None:
        ax.plot(range(1, len(reference) + 1), reference, color="black", lw=1.6, ls="--",
                label="one process, global batches")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy loss")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, fontsize=8, frameon=False)
    return fig


def throughput(samples_per_s: dict[int, float]):
    """Measured samples/s per world size, beside ideal linear scaling from world size 1."""
    worlds = sorted(samples_per_s)
    base = samples_per_s[worlds[0]] / worlds[0]
    fig = Figure(figsize=(5, 3.4), layout="constrained")
    ax = fig.subplots()
    xs = range(len(worlds))
    ax.bar([x - 0.2 for x in xs], [samples_per_s[w] for w in worlds], width=0.4, label="measured")
    ax.bar([x + 0.2 for x in xs], [base * w for w in worlds], width=0.4, color="lightgray", label="ideal (linear)")
    ax.set_xticks(list(xs), [str(w) for w in worlds])
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("samples / s")
    ax.legend(fontsize=8)
    return fig
