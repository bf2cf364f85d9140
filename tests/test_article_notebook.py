"""The source article's code, in notebook cells, runs with only mp.spawn -> distlab.spawn changed."""
import nbformat
import pytest
from article_code import CELLS
from nbclient import NotebookClient

pytestmark = pytest.mark.slow


def test_article_code_runs_in_a_real_kernel(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c.strip()) for c in CELLS]
    NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    streamed = "".join(o.get("text", "") for o in nb.cells[4].outputs)
    assert "[rank1] Running basic DDP example on rank 1." in streamed  # live, rank-prefixed in the cell
    script = "".join(o.get("text", "") for o in nb.cells[7].outputs)
    assert "[rank0] Rank 0, Epoch 0, Batch 0, Loss:" in script
