"""The recordings that ``%%needs`` cells show where a platform refuses them, and the chapters around them.

Every ``%%needs`` cell has a recording of its current code (change a cell and this fails until
``book/record.py`` records it again), no recording is left without its cell, none holds an error, a
traceback nobody meant or a path of the machine that made it. And no cell that may run where a
section does not uses a name only that section defines: Run All never ends in a ``NameError``.
"""
from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import nbformat
import pytest

from distlab.needs import recorded

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "book"))
import record  # noqa: E402  (book/record.py)

CHAPTERS = sorted((REPO / "book").glob("*.ipynb"))
LIMIT_BYTES = 3_000_000   # all recordings together: small next to the package's wheel of a few hundred KB of code


def needs_cells(path: Path) -> list[tuple[int, str, str, list]]:
    """(index, requirement, body, tags) of every ``%%needs`` cell of a chapter."""
    nb = nbformat.read(path, as_version=4)
    found = []
    for i, cell in enumerate(nb.cells):
        got = recorded.split(cell.source) if cell.cell_type == "code" else None
        if got:
            found.append((i, *got, cell.metadata.get("tags", [])))
    return found


def test_every_needs_cell_has_a_recording_of_its_current_code():
    stale = [f"{p.name} cell {i} (%%needs {req})" for p in CHAPTERS for i, req, body, _ in needs_cells(p)
             if recorded.find(req, body) is None]
    assert stale == [], "record again: .venv/bin/python book/record.py book/<chapter>.ipynb (as root, with Slurm)"


def test_no_recording_is_left_without_its_cell():
    keys = {recorded.cell_key(req, body) for p in CHAPTERS for _, req, body, _ in needs_cells(p)}
    files = sorted(recorded.FOLDER.glob("*.json"))
    assert files and {f.stem for f in files} <= {p.stem for p in CHAPTERS}
    assert set(recorded.everything()) - keys == set()


def test_the_chapters_with_multi_machine_sections_load_the_magic_first():
    for path in CHAPTERS:
        nb = nbformat.read(path, as_version=4)
        code = [c.source for c in nb.cells if c.cell_type == "code"]
        first = next((i for i, s in enumerate(code) if s.startswith("%%needs")), None)
        if first is not None:
            assert any("%load_ext distlab.needs" in s for s in code[:first]), path.name


@pytest.mark.parametrize("path", sorted(recorded.FOLDER.glob("*.json")), ids=lambda p: p.stem)
def test_a_recording_holds_a_real_run_and_nothing_of_this_machine(path):
    data = json.loads(path.read_text())
    text = json.dumps(data)
    tags = {recorded.cell_key(req, body): t for _, req, body, t in needs_cells(REPO / "book" / data["chapter"])}
    for key, entry in data["cells"].items():
        outputs = json.dumps(entry["outputs"])
        assert all(o["output_type"] in ("stream", "display_data") for o in entry["outputs"]), entry["cell"]
        assert "Not run here" not in outputs and "No recording of this cell" not in outputs, entry["cell"]
        if "prints-traceback" not in tags.get(key, []):
            assert "Traceback (most recent call last)" not in outputs, entry["cell"]
    assert str(REPO) not in text and not re.search(r"/(?:work|home|root)/", text)
    # a recording shows no controls: it must not promise them (a knob lab's live note)
    assert "controls change these" not in text
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", data["recorded"]["date"]) and data["recorded"]["setting"]


def test_the_recordings_stay_small():
    assert sum(p.stat().st_size for p in recorded.FOLDER.glob("*.json")) < LIMIT_BYTES


def test_record_keeps_the_ends_of_a_long_output_and_refuses_a_run_that_did_not_happen():
    long = "".join(f"line {i}\n" for i in range(200))
    short = record.shorten(long)
    assert short.startswith("line 0\n") and short.endswith("line 199\n") and "(90 lines left out" in short
    assert record.shorten("a\nb\n") == "a\nb\n"
    kept = record.kept_output({"output_type": "display_data", "metadata": {},
                               "data": {"image/png": "iVBOR", "application/vnd.jupyter.widget-view+json": {}}})
    assert kept == {"output_type": "display_data", "data": {"image/png": "iVBOR"}, "metadata": {}}
    assert record.scrub(f"{REPO}/book/x.py") == "<book>/book/x.py"
    assert record.scrub("lab(a=1); in JupyterLab, controls change these\n") == (
        "lab(a=1); recorded at these settings: the controls appear where the cell runs\n")
    cell = nbformat.v4.new_code_cell("%%needs nodes\nx")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="Not run here: this section needs ...")]
    with pytest.raises(SystemExit, match="cell 3: it was not run"):
        record.check_ran(cell, 3, "ch.ipynb")


# --- no NameError cascades ---------------------------------------------------------------------

IMPLIED = {None: {None}, "nodes": {None, "nodes"}, "slurm": {None, "slurm"},
           "slurm-nodes": {None, "slurm", "nodes", "slurm-nodes"},   # what holds wherever a cell runs
           "slurm-accounting": {None, "slurm", "slurm-accounting"}}


def names(source: str) -> tuple[set[str], set[str]]:
    """(names a cell binds at any depth, names it reads) from its Python (IPython syntax transformed)."""
    from IPython.core.inputtransformer2 import TransformerManager

    tree = ast.parse(TransformerManager().transform_cell(source))
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound, read


def cascades(cells: list[tuple[str | None, str]]) -> list[str]:
    """Names a cell reads that only cells which may be skipped where it runs have bound. Pure."""
    where: dict[str, set] = {}   # name -> the requirements of the cells that bound it so far
    found = []
    for index, (req, source) in enumerate(cells):
        bound, read = names(source)
        for name in sorted(read - bound):
            if name in where and not where[name] & IMPLIED[req]:
                found.append(f"cell {index} (%%needs {req}) reads {name!r}, bound only under {sorted(where[name])}")
        for name in bound:
            where.setdefault(name, set()).add(req)
    return found


def chapter_cells(path: Path) -> list[tuple[str | None, str]]:
    nb = nbformat.read(path, as_version=4)
    record_solutions = [c for c in nb.cells if c.cell_type == "code" or "solution" in c.metadata.get("tags", [])]
    out = []
    for cell in record_solutions:
        source = cell.source if cell.cell_type == "code" else record_solution(cell.source)
        got = recorded.split(source)
        out.append(got if got else (None, source))
    return out


def record_solution(markdown: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", markdown, re.S)
    return blocks[0] if blocks else ""


@pytest.mark.parametrize("path", [p for p in CHAPTERS if needs_cells(p)], ids=lambda p: p.stem)
def test_no_cell_that_runs_reads_a_name_only_a_skipped_section_binds(path):
    assert cascades(chapter_cells(path)) == []


def test_a_cascade_is_found():
    cells = [(None, "import os"), ("nodes", "nodes = 1\nx = 2"), (None, "print(x, os)"), ("slurm", "y = 1"),
             ("slurm-nodes", "print(y, nodes)"), ("slurm", "print(nodes)")]
    assert cascades(cells) == ["cell 2 (%%needs None) reads 'x', bound only under ['nodes']",
                               "cell 5 (%%needs slurm) reads 'nodes', bound only under ['nodes']"]
