"""The source article's code, in notebook cells, runs with only mp.spawn -> distlab.spawn changed."""
import nbformat
import pytest
from article_code import CELLS
from nbclient import NotebookClient

pytestmark = pytest.mark.slow


def unused_port() -> int:
    """A port the OS just handed out: two suites on one host must not both use the article's 12355."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_article_code_runs_in_a_real_kernel(tmp_path):
    nb = nbformat.v4.new_notebook()
    port = str(unused_port())
    nb.cells = [nbformat.v4.new_code_cell(c.strip().replace("'12355'", f"'{port}'")) for c in CELLS]
    assert sum(f"'{port}'" in c.source for c in nb.cells) == 2  # both of the article's setup() functions
    NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    streamed = "".join(o.get("text", "") for o in nb.cells[4].outputs)
    assert "[rank1] Running basic DDP example on rank 1." in streamed  # live, rank-prefixed in the cell
    script = "".join(o.get("text", "") for o in nb.cells[7].outputs)
    assert "[rank0] Rank 0, Epoch 0, Batch 0, Loss:" in script
