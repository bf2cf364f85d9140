"""Pictures for chapter 11, DDP in practice.

* :func:`plot_running_means`: a BatchNorm running mean per step and rank, one panel per way of running it;
* :func:`plot_hooks`: bytes per step and the loss curve for each communication hook;
* :func:`plot_lr_runs`: training loss against samples seen for several batch sizes and learning rates.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

RANK_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red")


def plot_running_means(modes: dict[str, dict[int, list[float]]]):
    """One panel per mode; in each, every rank's running mean after each step."""
    fig, axes = plt.subplots(1, len(modes), figsize=(3.2 * len(modes), 3.2), sharey=True)
    for ax, (label, per_rank) in zip(axes, modes.items(), strict=True):
        for rank, values in sorted(per_rank.items()):
            ax.plot(range(1, len(values) + 1), values, marker=".", color=RANK_COLORS[rank % 4], label=f"rank {rank}")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("step")
    axes[0].set_ylabel("running mean of feature 0")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_hooks(bytes_per_step: dict[str, float], losses: dict[str, list[float]]):
    """Left: bytes all-reduced per step per hook. Right: each hook's loss curve."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    names = list(bytes_per_step)
    left.bar(names, [bytes_per_step[n] / 1e3 for n in names], color=[RANK_COLORS[i % 4] for i in range(len(names))])
    left.set_ylabel("kB all-reduced per step")
    for i, name in enumerate(losses):
        right.plot(losses[name], color=RANK_COLORS[i % 4], label=name, linewidth=1.2)
    right.set_xlabel("step")
    right.set_ylabel("training loss (rank 0)")
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_lr_runs(runs: dict[str, tuple[int, list[float]]]):
    """Training loss against samples seen; ``runs`` maps a label to (samples per step, losses)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for label, (per_step, losses) in runs.items():
        ax.plot([per_step * (i + 1) for i in range(len(losses))], losses, label=label, linewidth=1.2)
    ax.set_xlabel("samples seen")
    ax.set_ylabel("training loss (global batch)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
