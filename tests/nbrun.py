"""Execute notebooks the way the test suite does: a fresh kernel, cwd = the notebook's folder.

Usage while writing a chapter:  .venv/bin/python tests/nbrun.py book/05_collectives.ipynb
(prints the time of every cell and of the whole notebook; the file itself is left unchanged).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbclient import NotebookClient

CHAPTER_BUDGET_S = 90
CELL_TIMEOUT_S = 180


@dataclass
class Execution:
    path: Path
    seconds: float
    notebook: nbformat.NotebookNode
    error: str | None = None
    cell_seconds: list[float] = field(default_factory=list)


def execute(path: Path, write_to: Path | None = None) -> Execution:
    """Run every cell; cells tagged ``raises-exception`` may raise, any other error is recorded."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    error = None
    try:
        client.execute()
    except Exception as e:  # CellExecutionError carries the cell's traceback
        error = f"{type(e).__name__}: {e}"
    seconds = time.perf_counter() - start
    if write_to is not None:
        nbformat.write(nb, write_to)
    return Execution(path, seconds, nb, error, _cell_seconds(nb))


def _cell_seconds(nb) -> list[float]:
    from datetime import datetime

    out = []
    for cell in nb.cells:
        t = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in t and "shell.execute_reply" in t:
            a = datetime.fromisoformat(t["iopub.execute_input"].replace("Z", "+00:00"))
            b = datetime.fromisoformat(t["shell.execute_reply"].replace("Z", "+00:00"))
            out.append((b - a).total_seconds())
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        ex = execute(Path(arg))
        slow = sorted(enumerate(ex.cell_seconds), key=lambda t: -t[1])[:5]
        print(f"{arg}: {ex.seconds:.1f}s (budget {CHAPTER_BUDGET_S}s); slowest cells {slow}")
        if ex.error:
            print(ex.error)
            sys.exit(1)
