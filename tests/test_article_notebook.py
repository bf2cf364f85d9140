"""The source article's code, in notebook cells, runs with only mp.spawn -> distlab.spawn changed."""
import nbformat
import pytest
from article_code import CELLS
from nbclient import NotebookClient
from ports import reserved_port

pytestmark = pytest.mark.slow


def test_article_code_runs_in_a_real_kernel(tmp_path):
    nb = nbformat.v4.new_notebook()
    with reserved_port() as number:  # two suites on one host must not both use the article's 12355
        _run_article(nb, str(number), tmp_path)


def _run_article(nb, port, tmp_path):
    nb.cells = [nbformat.v4.new_code_cell(c.strip().replace("'12355'", f"'{port}'")) for c in CELLS]
    assert sum(f"'{port}'" in c.source for c in nb.cells) == 2  # both of the article's setup() functions
    NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    streamed = "".join(o.get("text", "") for o in nb.cells[4].outputs)
    assert "[rank1] Running basic DDP example on rank 1." in streamed  # live, rank-prefixed in the cell
    script = "".join(o.get("text", "") for o in nb.cells[7].outputs)
    assert "[rank0] Rank 0, Epoch 0, Batch 0, Loss:" in script
