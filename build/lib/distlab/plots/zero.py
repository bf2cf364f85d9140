"""Chapter 8's figure: what one rank holds under each ZeRO stage, measured against the model."""
from __future__ import annotations

import matplotlib.pyplot as plt

KINDS = ("params", "grads", "optimizer", "master")
LABELS = {"params": "parameters", "grads": "gradients (peak)", "optimizer": "Adam moments",
          "master": "fp32 master copy"}
COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868", "master": "#C44E52"}


def plot_bytes_by_stage(rows, unit: float = 1e6, unit_name: str = "MB"):
    """Stacked bars of measured bytes per rank by kind, one bar per run, with the prediction for
    each run's total as a black tick. ``rows``: ``[(label, measured_dict, predicted_total), ...]``."""
    fig, ax = plt.subplots(figsize=(8, 4.2))
    xs = range(len(rows))
    bottoms = [0.0] * len(rows)
    for kind in KINDS:
        heights = [m.get(kind, 0) / unit for _, m, _ in rows]
        if any(heights):
            ax.bar(xs, heights, bottom=bottoms, color=COLORS[kind], label=LABELS[kind], width=0.6)
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.scatter(xs, [p / unit for _, _, p in rows], marker="_", s=900, color="black", linewidths=2,
               label="predicted total", zorder=3)
    ax.set_xticks(list(xs), [label for label, _, _ in rows])
    top = max(max(bottoms), max(p / unit for _, _, p in rows))
    ax.set_ylim(0, 1.3 * top)
    ax.set_ylabel(f"{unit_name} per rank")
    ax.legend(loc="upper right", fontsize=8, ncol=3)
    fig.tight_layout()
    return fig
