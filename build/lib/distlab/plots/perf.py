"""Pictures for chapter 10, the performance lab. Every axis is a ratio against a baseline measured
in the same run, so the shapes mean something on any machine even when the seconds do not.

* :func:`plot_launch`: launchers' wall time relative to bare ``Popen``;
* :func:`plot_message_size`: all-reduce time relative to the smallest message, with the latency and
  bandwidth regimes of a fitted ``alpha + n / beta`` model;
* :func:`plot_overhead`: DDP step time relative to the plain module, per model and world size;
* :func:`plot_buckets`: step time per ``bucket_cap_mb`` relative to the default, with bucket counts;
* :func:`plot_no_sync`: all-reduced bytes and time per sample relative to k = 1;
* :func:`plot_phases`: one step split into forward, backward and optimizer, relative to the plain step.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

COLORS = {"forward": "tab:blue", "backward": "tab:orange", "optimizer": "tab:green",
          "hidden": "tab:purple", "exposed": "tab:red"}


def _human(nbytes: float) -> str:
    for unit, size in (("MB", 2**20), ("KB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{nbytes:g} B"


def _baseline(ax, y: float = 1.0, label: str = "baseline", vertical: bool = False) -> None:
    (ax.axvline if vertical else ax.axhline)(y, color="0.3", linestyle="--", linewidth=1, label=label)


def plot_launch(names: list[str], ratios: list[float]):
    """Horizontal bars: each launcher's median wall time over bare ``Popen``'s."""
    fig, ax = plt.subplots(figsize=(6.5, 0.5 + 0.45 * len(names)))
    ax.barh(names, ratios, color=["tab:blue" if n == "distlab" else "0.6" for n in names])
    _baseline(ax, label="bare Popen", vertical=True)
    ax.invert_yaxis()
    ax.set_xlabel("wall time of a 2-rank trivial job / bare Popen")
    ax.legend(loc="lower right")
    fig.tight_layout()
    return fig


def plot_message_size(sizes: list[float], seconds: list[float], alpha: float, beta: float):
    """All-reduce time over the smallest message's time, against message size (log-log).

    The fitted model is drawn through the points; left of ``alpha * beta`` bytes the start-up cost
    dominates (latency regime), right of it the bytes do (bandwidth regime).
    """
    base = seconds[0]
    crossover = alpha * beta
    lo, hi = min(sizes) / 2, max(sizes) * 2
    grid = [lo * (hi / lo) ** (i / 99) for i in range(100)]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.axvspan(lo, crossover, color="tab:blue", alpha=0.08, label="latency-bound")
    ax.axvspan(crossover, hi, color="tab:orange", alpha=0.08, label="bandwidth-bound")
    ax.plot(grid, [(alpha + n / beta) / base for n in grid], color="0.3", linewidth=1,
            label=f"fit: {alpha * 1e6:.0f} us + n / ({beta / 1e9:.2f} GB/s)")
    ax.plot(sizes, [s / base for s in seconds], "o", color="tab:red", label="gloo all_reduce, 2 ranks")
    ax.axvline(crossover, color="0.3", linestyle=":", label=f"crossover {_human(crossover)}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel(f"time / time of {_human(sizes[0])}")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def plot_overhead(ratios: dict[str, dict[int, float]], goal: float = 1.05):
    """Grouped bars: DDP step time / plain step time, one group per model, one bar per world size."""
    models = list(ratios)
    worlds = sorted({w for r in ratios.values() for w in r})
    width = 0.8 / len(worlds)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for i, world in enumerate(worlds):
        xs = [m + (i - (len(worlds) - 1) / 2) * width for m in range(len(models))]
        ax.bar(xs, [ratios[name].get(world, float("nan")) for name in models], width, label=f"world size {world}")
    _baseline(ax, label="plain module")
    ax.axhline(goal, color="tab:green", linestyle=":", label=f"goal at world size 1 ({goal})")
    ax.set_xticks(range(len(models)), [name.replace(", ", "\n") for name in models])
    ax.set_yscale("log")
    smallest = min(v for r in ratios.values() for v in r.values())
    ax.set_ylim(bottom=min(0.5, 0.8 * smallest))
    plain_numbers = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain_numbers)
    ax.yaxis.set_minor_formatter(plain_numbers)
    ax.set_ylabel("DDP step time / plain step time")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_buckets(sweep: dict[float, dict], baseline: float):
    """Bars: step time per ``bucket_cap_mb`` over the baseline cap's; tick labels give the bucket counts."""
    caps = list(sweep)
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    ax.bar(range(len(caps)), [sweep[c]["step"] / sweep[baseline]["step"] for c in caps],
           color=["tab:blue" if c == baseline else "0.6" for c in caps])
    _baseline(ax, label=f"bucket_cap_mb={baseline:g}")
    labels = [f"{c:g} MB\n{sweep[c]['buckets']} bucket{'s' * (sweep[c]['buckets'] != 1)}" for c in caps]
    ax.set_xticks(range(len(caps)), labels)
    ax.set_xlabel("bucket_cap_mb")
    ax.set_ylabel("DDP step time / baseline")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_no_sync(ks: list[int], bytes_per_sample: list[float], seconds_per_sample: list[float]):
    """Two panels against k: all-reduced bytes per sample, and time per sample, both over k = 1."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.4), sharex=True)
    left.plot(ks, [1 / k for k in ks], color="0.3", linestyle="--", linewidth=1, label="1 / k")
    left.plot(ks, [b / bytes_per_sample[0] for b in bytes_per_sample], "o-", label="counted by the comm hook")
    left.set_ylabel("all-reduced bytes per sample / k=1")
    right.plot(ks, [s / seconds_per_sample[0] for s in seconds_per_sample], "o-", color="tab:orange",
               label="measured")
    _baseline(right, label="k = 1")
    right.set_ylabel("time per sample / k=1")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("micro-batches per optimizer step (k)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_phases(plain: dict[str, float], ddp: dict[str, float], comm: float, overlap: float):
    """Stacked bars relative to the plain step: plain and DDP split into phases, and DDP's own
    all-reduce time split into the part hidden behind backward and the part left exposed."""
    base = plain["step"]
    fig, ax = plt.subplots(figsize=(7.5, 2.8))
    for row, phases in (("plain", plain), ("DDP", ddp)):
        left = 0.0
        for phase in ("forward", "backward", "optimizer"):
            ax.barh(row, phases[phase] / base, left=left, color=COLORS[phase],
                    label=phase if row == "plain" else None)
            left += phases[phase] / base
    hidden = min(overlap, comm)
    ax.barh("DDP all-reduce", hidden / base, color=COLORS["hidden"], label="all-reduce hidden by backward")
    ax.barh("DDP all-reduce", (comm - hidden) / base, left=hidden / base, color=COLORS["exposed"],
            label="all-reduce after backward's compute")
    _baseline(ax, label="plain step", vertical=True)
    ax.invert_yaxis()
    ax.set_xlabel("time / plain step time")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig


def plot_bucket_timeline(timelines: dict[int, dict]):
    """One panel per rank: when each gradient became ready during one backward pass, and when each
    bucket's all-reduce ran (from DDP handing it to the communication hook to its completion).

    ``timelines[rank]`` holds perf_counter seconds: ``start``/``end`` of ``loss.backward()``,
    ``ready`` ``[(param_index, t)]``, ``launched``/``done`` ``[(bucket, t)]`` and ``members``
    ``{bucket: [param_index, ...]}``. Times are drawn in ms from the start of backward.
    """
    ranks = sorted(timelines)
    n_buckets = max(len(t["members"]) for t in timelines.values())
    fig, axes = plt.subplots(len(ranks), 1, figsize=(7.5, 0.9 + (1.1 + 0.35 * n_buckets) * len(ranks)),
                             sharex=True, squeeze=False)
    for ax, rank in zip(axes[:, 0], ranks, strict=True):
        t = timelines[rank]

        def ms(seconds, t0=t["start"]):
            return 1e3 * (seconds - t0)

        bucket_of = {p: b for b, params in t["members"].items() for p in params}
        colour = {b: f"C{b % 10}" for b in t["members"]}
        ready = sorted(t["ready"], key=lambda item: item[1])
        ax.scatter([ms(s) for _, s in ready], [0] * len(ready), marker="|", s=200,
                   c=[colour.get(bucket_of.get(p), "0.4") for p, _ in ready], label="a gradient is ready")
        launched, done = dict(t["launched"]), dict(t["done"])
        for b in sorted(launched):
            ax.barh(1 + b, ms(done[b]) - ms(launched[b]), left=ms(launched[b]), height=0.6, color=colour[b],
                    label="all-reduce of a bucket" if b == 0 else None)
        ax.axvline(ms(ready[-1][1]), color="0.3", linestyle=":", label="last gradient ready")
        ax.axvline(ms(t["end"]), color="0.3", linestyle="--", label="backward() returns")
        ax.set_yticks(range(1 + n_buckets), ["gradients"] + [f"bucket {b}" for b in range(n_buckets)])
        ax.set_ylim(n_buckets + 0.6, -0.6)
        ax.set_ylabel(f"rank {rank}")
    axes[-1, 0].set_xlabel("ms since loss.backward() started")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncols=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig
