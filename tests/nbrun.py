"""Execute notebooks the way the test suite does: a fresh kernel, cwd = the notebook's folder.

Usage while writing a chapter:  .venv/bin/python tests/nbrun.py book/05_collectives.ipynb
(prints the time of every cell and of the whole notebook; the file itself is left unchanged).

Exercise solutions are markdown cells tagged ``solution`` (a ``<details>`` block around one fenced
python block), so *Run All* in JupyterLab never runs them and a reader sees them only on a click.
The suite executes them anyway: :func:`solutions_to_code` turns each into a code cell tagged
``hide-cell`` (collapsed in the built book) that runs in the chapter's kernel and calls its checker.
"""
from __future__ import annotations

import re
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


SOLUTION_TAG = "solution"
_FENCE = re.compile(r"```python\n(.*?)```", re.S)


def solution_code(markdown: str) -> str:
    """The python code inside a solution cell's ``<details>`` block; a malformed cell is an error."""
    blocks = _FENCE.findall(markdown)
    if not markdown.lstrip().startswith("<details>") or len(blocks) != 1:
        raise ValueError("a solution cell must be <details><summary>..</summary>, one ```python block, </details>:\n"
                         + markdown[:300])
    return blocks[0]


def solutions_to_code(nb) -> int:
    """Turn every markdown cell tagged ``solution`` into a hidden code cell; returns how many."""
    count = 0
    for i, cell in enumerate(nb.cells):
        tags = cell.get("metadata", {}).get("tags", [])
        if cell.cell_type == "markdown" and SOLUTION_TAG in tags:
            code = nbformat.v4.new_code_cell(solution_code(cell.source))
            code.metadata["tags"] = ["hide-cell", SOLUTION_TAG]
            nb.cells[i] = code
            count += 1
    return count


def execute(path: Path, write_to: Path | None = None) -> Execution:
    """Run every cell, solutions included; cells tagged ``raises-exception`` may raise, any other
    error is recorded."""
    nb = nbformat.read(path, as_version=4)
    solutions_to_code(nb)
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
