"""Plots for chapters 1-3: threads vs processes, gradient agreement, replica drift."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

KIND_COLORS = {"serial": "#888888", "threads": "#d95f02", "processes": "#1b9e77"}
REPLICATE = "#7570b3"


def plot_gil(results: dict[str, dict]):
    """Wall time of the same pure-Python work per kind; cores busy (CPU s / wall s); and the share of
    the time both workers ran Python at the same moment (threads: never, the GIL)."""
    kinds = list(results)
    colors = [KIND_COLORS.get(k, "#7570b3") for k in kinds]
    fig, (wall, cores, together) = plt.subplots(1, 3, figsize=(10, 3.2))
    wall.bar(kinds, [results[k]["wall"] for k in kinds], color=colors)
    wall.set_ylabel("wall time (s)")
    wall.set_title("same work, 2 workers")
    cores.bar(kinds, [results[k]["cores"] for k in kinds], color=colors)
    cores.axhline(1.0, color="black", linestyle="--", linewidth=1, label="one core")
    cores.set_ylim(0, max(1.2, 1.25 * max(results[k]["cores"] for k in kinds)))
    cores.set_ylabel("cores busy (CPU s / wall s)")
    cores.set_title("parallelism achieved")
    cores.legend(loc="upper left")
    together.bar(kinds, [results[k]["together"] for k in kinds], color=colors)
    together.set_ylim(0, 1)
    together.set_ylabel("share of the time")
    together.set_title("both workers running at once")
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


def _box(ax, x: float, y: float, text: str, color: str, w: float = 1.5, h: float = 0.6):
    """A labelled box centred at (x, y); returns its centre for arrows."""
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.05",
                                facecolor=color, edgecolor="black", linewidth=1))
    ax.text(x, y, text, ha="center", va="center", fontsize=9)
    return x, y


def _arrow(ax, start, end, bend: float = 0.0, color: str = "black", dashed: bool = False):
    """An arrow between two points (box edges), straight or bent by ``bend``."""
    ax.annotate("", xy=end, xytext=start,
                arrowprops={"arrowstyle": "->", "color": color, "linestyle": "--" if dashed else "-",
                            "connectionstyle": f"arc3,rad={bend}"})


def plot_data_parallel_step(devices: int = 2):
    """Concept figure: what ``nn.DataParallel`` does on every forward, one row per GPU.

    *scatter*: the batch on GPU 0 is cut into one slice per GPU; *replicate*: the module on GPU 0
    is copied to every GPU; *parallel_apply*: one thread per GPU runs its replica on its slice;
    *gather*: the outputs are concatenated on GPU 0. Box and step labels only: the chapter's
    markdown carries the caption.
    """
    w, h = 1.5, 0.6
    fig, ax = plt.subplots(figsize=(8.5, 1.6 + 1.0 * devices))
    rows = [-1.0 * d for d in range(devices)]  # GPU 0 on top
    middle = sum(rows) / devices
    batch = _box(ax, 0, middle, "batch\n(GPU 0)", "#dddddd")
    module = _box(ax, 4.4, 1.2, "module\n(GPU 0)", "#dddddd")
    output = _box(ax, 7.6, middle, "output\n(GPU 0)", "#dddddd")
    for d, y in enumerate(rows):
        _box(ax, 2.2, y, f"slice {d}\n(GPU {d})", KIND_COLORS["processes"])
        _box(ax, 4.4, y, f"replica {d} (GPU {d})\nthread {d}: forward", KIND_COLORS["threads"], w=2.1)
        _arrow(ax, (batch[0] + w / 2, batch[1]), (2.2 - w / 2, y))
        _arrow(ax, (2.2 + w / 2, y), (4.4 - 1.05, y))
        _arrow(ax, (4.4 + 1.05, y), (output[0] - w / 2, output[1]))
        if d == 0:
            _arrow(ax, (module[0], module[1] - h / 2), (4.4, y + h / 2), color=REPLICATE, dashed=True)
        else:
            _arrow(ax, (module[0] + w / 2, module[1]), (4.4 + 1.05, y), bend=-0.5, color=REPLICATE, dashed=True)
    for x, label in [(1.1, "scatter"), (4.4, "parallel_apply"), (6.35, "gather")]:
        ax.text(x, rows[-1] - 0.75, label, ha="center", va="top", fontsize=10, fontweight="bold")
    ax.text(5.35, 1.2, "replicate", ha="left", va="center", fontsize=10, fontweight="bold", color=REPLICATE)
    ax.set_xlim(-0.9, 8.5)
    ax.set_ylim(rows[-1] - 1.2, 1.7)
    ax.axis("off")
    fig.tight_layout()
    return fig
