"""Every chapter in _toc.yml executes top to bottom in a fresh kernel within its time budget.

Cells tagged ``raises-exception`` may raise; nbclient stops at any other error.
"""
import json
from pathlib import Path

import pytest
from book_copy import ROOT, toc_files
from nbrun import CHAPTER_BUDGET_S

CHAPTERS = toc_files()


@pytest.mark.slow
@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_executes_within_budget(executed_book, name):
    ex = executed_book["executions"][name]
    print(f"{name}: {ex.seconds:.1f}s")
    assert ex.error is None, f"{name} failed:\n{ex.error}"
    assert ex.seconds <= CHAPTER_BUDGET_S, f"{name} took {ex.seconds:.0f}s > {CHAPTER_BUDGET_S}s"
    code = [c for c in ex.notebook.cells if c.cell_type == "code"]
    assert code and all(c.get("execution_count") for c in code), "a code cell did not run"


@pytest.mark.parametrize("name", CHAPTERS)
def test_stored_without_outputs(name):
    nb = json.loads((ROOT / f"{name}.ipynb").read_text())
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, f"{name} has stored outputs"


def test_every_notebook_is_in_the_toc():
    on_disk = {str(p.relative_to(ROOT).with_suffix("")) for p in Path(ROOT, "book").glob("*.ipynb")}
    assert on_disk == set(CHAPTERS)


def test_toc_lists_the_planned_chapters_in_order():
    planned = ["01_dp_vs_ddp", "02_setup_cleanup", "03_toy_model", "04_point_to_point", "05_collectives",
               "06_distributed_sampler", "07_two_gpu_training", "08_deepspeed", "09_failure_lab",
               "10_performance_lab", "11_ddp_in_practice", "12_beyond_data_parallel"]
    assert CHAPTERS == ["book/intro"] + [f"book/{p}" for p in planned]
