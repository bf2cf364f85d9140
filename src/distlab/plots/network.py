"""Chapter 14's pictures: the bandwidth law against measurements, and DDP steps split into
compute and waiting for the link."""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter


def bandwidth_law(curves: dict[str, list[dict]]) -> Figure:
    """One colour per (nodes, rate): measured times as points, the law's bound as a dashed line,
    both on log scales. ``curves[label]``: rows of :func:`distlab.teach.network.law_rows`."""
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.subplots()
    for i, (label, rows) in enumerate(curves.items()):
        sizes = [r["bytes"] for r in rows]
        ax.plot(sizes, [r["seconds"] for r in rows], "o-", color=f"C{i}", label=f"{label}: measured")
        ax.plot(sizes, [r["bound_s"] for r in rows], "--", color=f"C{i}", alpha=0.7, label=f"{label}: 2(n-1)/n S/B")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = [r["bytes"] for r in next(iter(curves.values()))]
    ax.set_xticks(ticks, [r["size"] for r in next(iter(curves.values()))])
    ax.set_xlabel("message size S")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v * 1e3:g} ms"))  # plain text, no mathtext fonts
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel("time per all-reduce")
    ax.grid(color="#dddddd")
    ax.legend(fontsize=8, frameon=False)
    return fig


def step_parts(summary: dict[str, dict], goal: float | None = None) -> Figure:
    """Horizontal bars, one per configuration: compute, then waiting for the link; a dotted line
    at ``goal`` times the compute-only step."""
    names = list(summary)
    fig = Figure(figsize=(7.5, 1.3 + 0.38 * len(names)), layout="constrained")
    ax = fig.subplots()
    compute = [summary[n]["compute_s"] * 1e3 for n in names]
    waiting = [summary[n]["waiting_s"] * 1e3 for n in names]
    ax.barh(range(len(names)), compute, color="C0", label="compute")
    ax.barh(range(len(names)), waiting, left=compute, color="C3", label="waiting for the link")
    if goal is not None:
        base = min(compute)
        ax.axvline(goal * base, color="black", linestyle=":", label=f"{goal:g} x compute-only step")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step")
    ax.grid(axis="x", color="#dddddd")
    ax.set_axisbelow(True)
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    return fig
