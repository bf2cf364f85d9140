"""Where live rank output goes: a text stream (every frontend) or ipywidgets panes."""
from __future__ import annotations

import sys


class TextView:
    """``[rank1] line`` on stdout: works in a terminal, nbclient, JupyterLab and the built HTML.

    A metric row with ``step`` and ``total`` drives one text progress bar (rank 0's steps).
    """

    def __init__(self, world_size: int, stream=None):
        self.world_size = world_size
        self.stream = stream
        self._bar = None

    def line(self, rank: int, text: str) -> None:
        stream = self.stream or sys.stdout
        stream.write(f"[rank{rank}] {text}\n")
        stream.flush()

    def metric(self, rank: int, row: dict) -> None:
        if rank != 0 or "total" not in row or "step" not in row:
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=int(row["total"]), desc="rank0", file=sys.stderr, leave=True, mininterval=0.5)
        shown = {k: v for k, v in row.items() if k not in ("rank", "time", "step", "total")}
        self._bar.set_postfix(shown, refresh=False)
        self._bar.update(int(row["step"]) - self._bar.n)  # redraws at most every mininterval

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class WidgetView(TextView):
    """One output pane per rank in tabs, plus a progress bar; for frontends that render widgets."""

    def __init__(self, world_size: int):
        super().__init__(world_size)
        import ipywidgets as w
        from IPython.display import display

        self.panes = [w.Output(layout={"max_height": "20em", "overflow": "auto"}) for _ in range(world_size)]
        self.progress = w.IntProgress(value=0, min=0, max=1, description="rank0")
        tabs = w.Tab(children=self.panes)
        for r in range(world_size):
            tabs.set_title(r, f"rank {r}")
        display(w.VBox([self.progress, tabs]))

    def line(self, rank: int, text: str) -> None:
        self.panes[rank].append_stdout(text + "\n")

    def metric(self, rank: int, row: dict) -> None:
        if rank == 0 and "total" in row and "step" in row:
            self.progress.max, self.progress.value = int(row["total"]), int(row["step"])


def widgets_can_render(environ=None) -> bool:
    """Best guess whether a frontend will draw widgets: a kernel started by a Jupyter server
    (JupyterLab/Notebook set JPY_SESSION_NAME) with ipywidgets installed. nbclient (CI, the book
    build) and terminals get the text stream, which every frontend shows."""
    import importlib.util
    import os
    import sys

    environ = os.environ if environ is None else environ
    in_kernel = "ipykernel" in sys.modules and sys.modules["ipykernel"] is not None
    return in_kernel and "JPY_SESSION_NAME" in environ and importlib.util.find_spec("ipywidgets") is not None


def make_view(view, world_size: int):
    """``"auto"``: widgets where they can render, else text; ``"text"``, ``"widgets"``, ``None``."""
    if view == "auto":
        view = "widgets" if widgets_can_render() else "text"
    if view == "text":
        return TextView(world_size)
    if view == "widgets":
        return WidgetView(world_size)
    if view is None or view == "none":
        return _Silent(world_size)
    return view  # any object with line/metric/close


class _Silent(TextView):
    def line(self, rank: int, text: str) -> None:
        pass

    def metric(self, rank: int, row: dict) -> None:
        pass
