"""Chapter 6's picture: which rank read each dataset index in each epoch.

One row per epoch, one column per dataset index, one colour per rank; padding repeats (an index
read by more than one rank) and dropped indices (read by none) get their own colours, so sharding,
reshuffling and padding are visible at a glance.
"""
from __future__ import annotations

from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..teach.sampler import NONE, SEVERAL

_NONE_COLOUR, _SEVERAL_COLOUR = "#ffffff", "#222222"


def rank_maps(panels: dict[str, list[list[int]]], world: int) -> Figure:
    """One heat map per panel; ``panels[title]`` is an ``owner_matrix`` (epochs x dataset index)."""
    fig = Figure(figsize=(7.5, 0.8 + sum(0.3 * len(m) + 0.8 for m in panels.values())),
                 layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    rank_colours = [f"C{r}" for r in range(world)]
    cmap = ListedColormap([_SEVERAL_COLOUR, _NONE_COLOUR, *rank_colours])
    for ax, (title, matrix) in zip(axes, panels.items(), strict=True):
        codes = [[v + 2 for v in row] for row in matrix]  # SEVERAL=-2 -> 0, NONE=-1 -> 1, rank r -> r + 2
        ax.imshow(codes, cmap=cmap, vmin=-0.5, vmax=world + 1.5, aspect="auto", interpolation="nearest")
        n = len(matrix[0])
        ax.set_xticks(range(n))
        ax.set_yticks(range(len(matrix)))
        ax.set_xticks([x - 0.5 for x in range(1, n)], minor=True)
        ax.set_yticks([y - 0.5 for y in range(1, len(matrix))], minor=True)
        ax.grid(which="minor", color="#bbbbbb", linewidth=0.5)
        ax.tick_params(which="minor", length=0)
        ax.set_title(title)
        ax.set_ylabel("epoch")
    axes[-1].set_xlabel("dataset index")
    handles = [Patch(color=c, label=f"rank {r}") for r, c in enumerate(rank_colours)]
    used = {v for m in panels.values() for row in m for v in row}
    if SEVERAL in used:
        handles.append(Patch(facecolor=_SEVERAL_COLOUR, label="several ranks (padding)"))
    if NONE in used:
        handles.append(Patch(facecolor=_NONE_COLOUR, edgecolor="#888888", label="no rank (dropped)"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False)
    return fig
