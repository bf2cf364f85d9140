"""The recordings against what the chapters print now, where the book's execution ran them for real.

A recording is found by its cell's code alone (``distlab.needs.recorded.cell_key``), so output that library
code prints (a message, a repr, a table's columns) can change without the key changing. Where the suite
executes a chapter with its sections running (root, namespaces, Slurm: CI), every ``%%needs`` cell's fresh
output is compared with its recording by :func:`record.shape` (numbers and generated names masked): a line
the one has and the other lacks means the recording is stale. Record the chapter again.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from distlab.needs import recorded

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "book"))
import record  # noqa: E402  (book/record.py)

#: the chapters whose recorded output has one shape from run to run: two runs here agreed line for line (chapter 7's
#: 3 recorded cells, chapter 14's 20). Not chapter 9 (which peer's error gloo reports when a machine is lost varies:
#: "Read error" or "Connection closed by peer") nor chapter 13 (the job monitor's state lines and squeue's rows
#: follow Slurm's timing): theirs stay keyed by their code only.
STABLE = ("book/07_two_gpu_training", "book/14_network")


def stale(notebook) -> list[str]:
    """Each ``%%needs`` cell that ran here and whose output's shape differs from its recording's."""
    found = []
    for index, cell in enumerate(notebook.cells):
        got = recorded.split(cell.source) if cell.cell_type == "code" else None
        if not got:
            continue
        shown = recorded.find(*got)
        text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in cell.outputs)
        if shown is None or recorded.LABEL.split("(")[0] in text:   # no recording (test_recordings says), or skipped
            continue
        fresh, kept = record.shape(cell.outputs), record.shape(shown["outputs"])
        if fresh != kept:
            found.append(f"cell {index}: now, not recorded: {sorted(fresh - kept)[:3]}; "
                         f"recorded, not now: {sorted(kept - fresh)[:3]}")
    return found


def test_the_stable_chapters_have_recordings():
    assert {f"book/{p.stem}" for p in recorded.FOLDER.glob("*.json")} >= set(STABLE)


def test_the_shape_masks_what_varies_and_keeps_what_library_code_prints():
    run1 = [{"output_type": "stream", "name": "stdout",
             "text": "step 12 took 0.31 s in run_ab12cd\n[rank1] 4 KB\nsaved /tmp/d-abc/x.pt\n"},
            {"output_type": "display_data", "data": {"text/plain": "Nodes(2: node0 10.77.0.1 1000 Mbit/s)"}}]
    run2 = [{"output_type": "stream", "name": "stdout",
             "text": "[rank1] 4 KB\nstep 7 took 12.5 s in run_zz99yy\nsaved /tmp/d-xyz/x.pt\n"},
            {"output_type": "display_data", "data": {"text/plain": "Nodes(2: node0 10.77.0.1 1000 Mbit/s)"}}]
    assert record.shape(run1) == record.shape(run2) == {
        "step # took # s in #", "[rank#] # KB", "saved <tmp>", "Nodes(#: node# #.# # Mbit/s)"}
    changed = [run2[0], {"output_type": "display_data", "data": {"text/plain": "Nodes(2: node0 at 1000 Mbit/s)"}}]
    assert record.shape(changed) != record.shape(run1)            # a repr that changed: the recording is stale


@pytest.mark.slow
@pytest.mark.parametrize("name", STABLE)
def test_each_recording_matches_what_its_cell_prints_now(executed_book, name):
    found = stale(executed_book["executions"][name].notebook)
    assert not found, (f"{name}: recordings stale, record again (.venv/bin/python book/record.py {name}.ipynb, as "
                       "root with Slurm):\n" + "\n".join(found))
