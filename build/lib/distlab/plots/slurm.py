"""Pictures for chapter 13, Slurm: a job's steps over time across its attempts (requeue)."""
from __future__ import annotations

import matplotlib.pyplot as plt

COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red")


def plot_attempts(rows: list[dict], t0: float, requeued_at: float | None = None):
    """Rank 0's ``step`` against seconds since ``t0``, one colour per attempt (``attempt`` in each row)."""
    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    for k in sorted({r["attempt"] for r in rows}):
        mine = [r for r in rows if r["attempt"] == k]
        ax.plot([r["time"] - t0 for r in mine], [r["step"] for r in mine], ".", color=COLORS[k % len(COLORS)],
                label=f"attempt {k}")
    if requeued_at is not None:
        ax.axvline(requeued_at - t0, color="0.4", linestyle="--", label="scontrol requeue")
    ax.set_xlabel("seconds since submission")
    ax.set_ylabel("step")
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig
