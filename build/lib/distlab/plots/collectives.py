"""Pictures for chapters 4 and 5, drawn from what real ranks returned.

* :func:`plot_collective`: each rank's tensor before and after one collective, value by value;
* :func:`plot_timeline`: when each rank waited, worked and sent (a ring pass, a barrier);
* :func:`plot_bandwidth`: bus bandwidth against message size, per implementation and world size.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle

GAP = 0.35  # horizontal space between the pieces of a list (gather, all_gather, ...)
UNDEFINED = {"facecolor": "white", "edgecolor": "0.6", "hatch": "///"}


def _pieces(state) -> list:
    """A rank's state as a list of 1-D value lists: tensor -> [values], list of tensors -> one each."""
    if state is None:
        return []
    if isinstance(state, (list, tuple)) and state and hasattr(state[0], "reshape"):
        return [[float(v) for v in t.reshape(-1)] for t in state]
    return [[float(v) for v in state.reshape(-1)]]


def _label(v: float) -> str:
    return f"{int(v)}" if float(v).is_integer() and abs(v) < 1e6 else f"{v:.3g}"


def _draw_rank(ax, y: float, state, norm, cmap) -> float:
    """Draw one rank's row at height ``y``; returns the width it took."""
    pieces = _pieces(state)
    if not pieces:
        ax.add_patch(Rectangle((0, y - 0.4), 1, 0.8, **UNDEFINED))
        return 1.0
    x = 0.0
    for piece in pieces:
        for v in piece:
            color = cmap(norm(v))
            ax.add_patch(Rectangle((x, y - 0.4), 1, 0.8, facecolor=color, edgecolor="white"))
            dark = sum(color[:3]) / 3 < 0.5
            ax.text(x + 0.5, y, _label(v), ha="center", va="center", fontsize=9,
                    color="white" if dark else "black")
            x += 1
        x += GAP
    return x - GAP


def _row_width(state) -> float:
    pieces = _pieces(state)
    return sum(len(p) for p in pieces) + GAP * (len(pieces) - 1) if pieces else 1.0


def _values(states: list) -> list:
    return [v for s in states for p in _pieces(s) for v in p]


def plot_collective(before: list, after: list, title: str = "", cmap: str = "viridis"):
    """Each rank's tensor(s) before and after a collective, one row per rank, one box per value.

    ``before[r]``/``after[r]`` is a tensor, a list of tensors (drawn as separate pieces) or
    ``None`` (hatched: nothing there, or undefined). Colours encode values, shared by both panels.
    """
    return plot_states({"before": before, "after": after}, title, cmap=cmap)


def plot_states(panels: dict, title: str = "", highlight: dict | None = None, cmap: str = "viridis"):
    """Like :func:`plot_collective` with any number of panels ({panel title: per-rank states}).

    ``highlight[panel]`` is a list of ``(rank, start, stop)`` element ranges to outline.
    """
    from matplotlib.colors import Normalize

    values = [v for states in panels.values() for v in _values(states)] or [0.0]
    low, high = min(values), max(values)
    norm, colors = Normalize(low, high if high > low else low + 1), plt.get_cmap(cmap)
    n = len(next(iter(panels.values())))
    widths = [max(max(_row_width(s) for s in states), 1.5) for states in panels.values()]
    fig, axes = plt.subplots(1, len(panels), figsize=(min(0.6 * sum(widths) + 1.2 * len(panels), 16), 0.55 * n + 1.0),
                             sharey=True, squeeze=False, gridspec_kw={"width_ratios": widths})
    for ax, (name, states) in zip(axes[0], panels.items(), strict=True):
        width = max(_draw_rank(ax, n - 1 - r, s, norm, colors) for r, s in enumerate(states))
        for rank, start, stop in (highlight or {}).get(name, []):
            ax.add_patch(Rectangle((start, n - 1 - rank - 0.45), stop - start, 0.9, fill=False, lw=2.5))
        ax.set_xlim(-0.2, max(width, 1) + 0.2)
        ax.set_ylim(-0.6, n - 0.4)
        ax.set_title(name)
        ax.set_xticks([])
        for side in ("top", "right", "bottom"):
            ax.spines[side].set_visible(False)
    axes[0][0].set_yticks(range(n), [f"rank {r}" for r in reversed(range(n))])
    hatched = any(s is None for states in panels.values() for s in states)
    if hatched:
        fig.legend(handles=[Patch(**UNDEFINED, label="no tensor / undefined")], loc="lower center",
                   frameon=False, bbox_to_anchor=(0.5, 0.0))
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.1 if hatched else 0, 1, 1))
    return fig


KIND_COLORS = {"send": 0, "wait": 1, "work": 2}  # tab10 index by the kind's first word: waiting is always orange


def _kind_color(kind: str, fallback: int):
    colors = plt.get_cmap("tab10").colors
    return colors[KIND_COLORS.get(kind.split()[0], 3 + fallback % 7)]


def plot_timeline(events: dict, title: str = ""):
    """Per-rank bars: ``events[rank]`` is a list of ``(kind, start_s, end_s)``; kinds get a colour each."""
    kinds = sorted({kind for evs in events.values() for kind, _, _ in evs})
    palette = {k: _kind_color(k, i) for i, k in enumerate(kinds)}
    t0 = min(start for evs in events.values() for _, start, _ in evs)
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(events) + 1.2))
    for rank, evs in events.items():
        bars = [((s - t0) * 1e3, max((e - s) * 1e3, 0.5)) for _, s, e in evs]
        ax.broken_barh(bars, (rank - 0.35, 0.7), facecolors=[palette[k] for k, _, _ in evs])
    ax.set_yticks(sorted(events), [f"rank {r}" for r in sorted(events)])
    ax.invert_yaxis()
    ax.set_xlabel("time since the first event (ms)")
    ax.legend(handles=[Patch(color=palette[k], label=k) for k in kinds], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), frameon=False)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def _size_label(nbytes: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g}{unit}"
    return str(nbytes)


def plot_bandwidth(rows: list, memcpy: dict | None = None, title: str = ""):
    """Bus bandwidth (GB/s) against size: colour = world size, line style = implementation.

    ``rows`` are :func:`distlab.teach.collectives.measure_all_reduce` rows; ``memcpy`` maps bytes to
    bytes/s of a one-thread copy, drawn as a yardstick.
    """
    fig, ax = plt.subplots(figsize=(8.5, 4))
    styles = {"gloo": "-", "ring": "--"}
    ranks_seen = sorted({r["ranks"] for r in rows})
    colors = dict(zip(ranks_seen, plt.get_cmap("tab10").colors, strict=False))
    for impl, ranks in sorted({(r["impl"], r["ranks"]) for r in rows}):
        pts = sorted((r["bytes"], r["busbw"]) for r in rows if r["impl"] == impl and r["ranks"] == ranks)
        ax.plot([b for b, _ in pts], [v / 1e9 for _, v in pts], styles.get(impl, "-"), marker="o",
                color=colors[ranks], label=f"{impl}, {ranks} ranks")
    if memcpy:
        pts = sorted(memcpy.items())
        ax.plot([b for b, _ in pts], [v / 1e9 for _, v in pts], ":", marker="s", color="0.4",
                label="one-thread memcpy")
    sizes = sorted({r["bytes"] for r in rows} | set(memcpy or {}))
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [_size_label(b) for b in sizes])
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel("tensor size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.legend(frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig
