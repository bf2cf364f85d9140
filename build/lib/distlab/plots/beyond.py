"""Pictures for chapter 12, beyond data parallel.

* :func:`plot_holdings`: which part of every parameter each rank holds, per way of splitting;
* :func:`plot_map`: model-state bytes against bytes sent per step, per split and world size.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

COLORS = {"data": "tab:blue", "tensor": "tab:orange", "pipeline": "tab:green"}
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def _human(n: float) -> str:
    return f"{n / 1e3:.0f} kB" if n >= 1e3 else f"{n:.0f} B"


def _draw_rank(ax, names: list[str], holds: dict, color: str) -> None:
    """Each parameter a unit square in a grid (one row per block); the part this rank holds filled."""
    per_row = 4
    for i, name in enumerate(names):
        x0, y0 = (i % per_row) * 1.2, -(i // per_row) * 1.2
        ax.add_patch(Rectangle((x0, y0), 1, 1, fill=False, edgecolor="0.6", linewidth=0.6))
        if name not in holds:
            continue
        whole, rows, cols = holds[name]
        n_rows, n_cols = whole[0], whole[1] if len(whole) > 1 else 1
        if rows[1] > rows[0] and cols[1] > cols[0]:
            ax.add_patch(Rectangle((x0 + cols[0] / n_cols, y0 + 1 - rows[1] / n_rows),
                                   (cols[1] - cols[0]) / n_cols, (rows[1] - rows[0]) / n_rows, color=color))
    ax.set_xlim(-0.2, per_row * 1.2)
    ax.set_ylim(-((len(names) - 1) // per_row) * 1.2 - 0.2, 1.2)
    ax.set_aspect("equal")
    ax.set_xticks([0.5 + 1.2 * k for k in range(per_row)])
    ax.set_xticklabels(["up.w", "up.b", "down.w", "down.b"], fontsize=7)
    ax.set_yticks([0.5 - 1.2 * k for k in range((len(names) + per_row - 1) // per_row)])
    ax.set_yticklabels([f"block {k}" for k in range((len(names) + per_row - 1) // per_row)], fontsize=7)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)


def plot_holdings(holds: dict[str, dict[int, dict]], comm: dict[str, dict[str, float]]):
    """``holds[way][rank][name] = (whole shape, (row0, row1), (col0, col1))``; ``comm[way]`` the
    message bytes by kind of one step (for the column titles)."""
    ways = list(holds)
    ranks = sorted(next(iter(holds.values())))
    fig, axes = plt.subplots(len(ranks), len(ways), figsize=(3.1 * len(ways), 2.9 * len(ranks)), squeeze=False)
    for j, way in enumerate(ways):
        kinds = ", ".join(f"{k} {_human(n)}" for k, n in comm[way].items())
        axes[0][j].set_title(f"{way}\n{kinds}", fontsize=9)
        names = list(dict.fromkeys(n for rank in ranks for n in holds[way][rank]))   # every parameter, in order
        for i, rank in enumerate(ranks):
            _draw_rank(axes[i][j], names, holds[way][rank], COLORS.get(way, "tab:gray"))
            if j == 0:
                axes[i][j].set_ylabel(f"rank {rank}")
    fig.tight_layout()
    return fig


def plot_map(costs_by_world: dict[int, dict], measured: dict[str, tuple[float, float]] | None = None):
    """Model-state bytes per rank (y) against bytes sent per rank and step (x), log-log; one marker
    per split, filled for the first world size, hollow for the others; measured values as crosses."""
    fig, ax = plt.subplots(figsize=(6.8, 4.4))
    names = list(dict.fromkeys(n for costs in costs_by_world.values() for n in costs))
    for k, (world, costs) in enumerate(costs_by_world.items()):
        for i, name in enumerate(names):
            if name not in costs:
                continue
            c = costs[name]
            ax.scatter([c.wire], [c.memory], marker=MARKERS[i % len(MARKERS)], s=60,
                       facecolors=f"C{i}" if k == 0 else "none", edgecolors=f"C{i}",
                       label=f"{name}, N={world}")
    if measured:
        ax.scatter([m[1] for m in measured.values()], [m[0] for m in measured.values()], marker="x", color="black",
                   s=40, label="measured, N=2")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bytes sent per rank and step (ring)")
    ax.set_ylabel("model-state bytes per rank")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig
