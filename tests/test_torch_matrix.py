"""bench/torch_matrix.py's pure parts: what a matrix environment installs, and how a run reads in the table."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("torch_matrix", ROOT / "bench" / "torch_matrix.py")
matrix = importlib.util.module_from_spec(spec)
spec.loader.exec_module(matrix)


def test_an_environment_gets_the_books_requirements_but_its_own_torch():
    text = "# pinned\ntorch==2.13.0\ndeepspeed==0.19.8  # ZeRO\nnbclient==0.11.0\n\n-e .\n"
    assert matrix.requirements_without_torch(text) == ["deepspeed==0.19.8", "nbclient==0.11.0"]
    command = matrix.install_command(Path("venv"), "2.11.0")
    assert command[:6] == ["venv/bin/python", "-m", "pip", "install", "--quiet", "torch==2.11.0"]
    assert command[-2:] == ["-e", str(ROOT)]
    assert not [a for a in command[6:] if a.startswith("torch==")]


def test_the_failed_cell_is_the_first_with_an_error_output():
    cells = [{"cell_type": "markdown"},
             {"cell_type": "code", "outputs": [{"output_type": "stream", "text": "ok"}]},
             {"cell_type": "code", "outputs": [{"output_type": "error", "ename": "TypeError",
                                                "evalue": "DistributedDataParallel.__init__() got an unexpected"
                                                          " keyword argument 'forward_sync_buffers'"}]},
             {"cell_type": "code", "outputs": [{"output_type": "error", "ename": "NameError", "evalue": "x"}]}]
    assert matrix.failed_cell(cells) == (2, "TypeError: DistributedDataParallel.__init__() got an unexpected "
                                            "keyword argument 'forward_sync_buffers'")
    assert matrix.failed_cell(cells[:2]) is None


def test_the_table_has_a_row_per_chapter_a_column_per_torch_and_the_count_that_reached_the_end():
    results = {("03_toy_model", "2.11.0"): {"ok": False, "cell": 22, "seconds": 9.6,
                                            "error": "TypeError: " + "x" * 200},
               ("03_toy_model", "2.13.0"): {"ok": True, "cell": None, "seconds": 31.7, "error": None},
               ("05_collectives", "2.13.0"): {"ok": False, "cell": None, "seconds": 900.0,
                                              "error": "no result in 900 s"}}
    text = matrix.table(results, ["03_toy_model", "05_collectives"], ["2.11.0", "2.13.0"])
    rows = text.splitlines()
    assert rows[0] == "| chapter | torch 2.11.0 | torch 2.13.0 |"
    assert rows[2].startswith("| 03_toy_model | ✗ cell 22: TypeError: xxx") and rows[2].endswith("… (10 s) | ✓ 32 s |")
    assert rows[3] == "| 05_collectives | not run | ✗ before any cell: no result in 900 s (900 s) |"
    assert rows[4] == "| reached the end | 0 of 2 | 1 of 2 |"
