"""Chapter 2's concept figure: what ``torchrun`` starts on one machine."""
from __future__ import annotations

import matplotlib.pyplot as plt

from .dp_vs_ddp import _arrow, _box

AGENT, STORE, WORKER = "#dddddd", "#e6ab02", "#1b9e77"
RENDEZVOUS, LINK = "#7570b3", "#d95f02"


def plot_torchrun(nproc: int = 2):
    """Concept figure: ``torchrun --standalone --nproc-per-node N script.py`` on one machine.

    The agent (torchrun's own process) hosts the rendezvous store and starts one worker per rank
    with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; each worker's
    ``init_process_group`` meets the others through that store, then the backend connects the
    workers directly. Box and arrow labels only: the chapter's markdown carries the caption.
    """
    w, h = 2.8, 0.7
    ys = [0.9 * (nproc - 1) - 1.8 * r for r in range(nproc)] if nproc > 1 else [0.0]
    fig, ax = plt.subplots(figsize=(8.5, 1.6 + 1.1 * nproc))
    agent = _box(ax, 0, 0, "torchrun\n(elastic agent)", AGENT, w=2.2, h=h)
    store = _box(ax, 8, 0, "TCPStore\nMASTER_ADDR:MASTER_PORT", STORE, w=3.0, h=h)
    top = max(ys) + h / 2
    ax.annotate("", xy=(store[0], h / 2), xytext=(agent[0], h / 2),
                arrowprops={"arrowstyle": "-", "color": "black", "connectionstyle": "arc3,rad=-0.35"})
    ax.text(4, top + 0.45, "hosts", ha="center", va="bottom", fontsize=9)
    for rank, y in enumerate(ys):
        _box(ax, 4, y, f"rank {rank}\nRANK={rank} LOCAL_RANK={rank}", WORKER, w=w, h=h)
        _arrow(ax, (agent[0] + 1.1, 0), (4 - w / 2, y))
        _arrow(ax, (4 + w / 2, y), (store[0] - 1.5, 0), color=RENDEZVOUS, dashed=True)
    for upper, lower in zip(ys, ys[1:], strict=False):
        ax.annotate("", xy=(4, lower + h / 2), xytext=(4, upper - h / 2),
                    arrowprops={"arrowstyle": "<->", "color": LINK, "linewidth": 2})
        ax.text(4.1, (upper + lower) / 2, "gloo / NCCL", ha="left", va="center", fontsize=9, color=LINK)
    ax.text(1.2, min(ys) - 0.2, "start with env,\nwatch, restart", ha="center", va="top", fontsize=9)
    ax.text(6.9, min(ys) - 0.2, "init_process_group\n(rendezvous)", ha="center", va="top", fontsize=9,
            color=RENDEZVOUS)
    ax.set_xlim(-1.3, 9.7)
    ax.set_ylim(min(ys) - 1.1, top + 1.0)
    ax.axis("off")
    fig.tight_layout()
    return fig
