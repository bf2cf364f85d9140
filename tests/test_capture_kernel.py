"""The notebook patterns of issue #14 in a real IPython kernel (the other capture tests fake one). Slow."""
import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow

CELLS = [
    "import dataclasses, functools\nfrom typing import Optional\nimport torch\nimport distlab",
    "@dataclasses.dataclass\nclass Cfg:\n    lr: float = 0.5\n    steps: int = 2",
    "class Net:\n    scale = 1\n    def forward(self, x):\n        return x * self.scale",
    "Net.scale = 3\nModel = Net",
    "@torch.no_grad()\ndef work(rank, cfg: Cfg, t, bias: Optional[float] = None) -> dict:\n"
    "    w = torch.ones(2, requires_grad=True)\n"
    "    return {'out': Model().forward(cfg.lr), 'grad': (w * 2).requires_grad, 'bias': bias, 't': t.tolist()}",
    "big = torch.arange(1_000_000.0)\n"
    "res = distlab.spawn(functools.partial(work, bias=0.25), args=(Cfg(lr=2.0), big[:2]), nprocs=1, view=None)\n"
    "assert res.returns[0] == {'out': 6.0, 'grad': False, 'bias': 0.25, 't': [0.0, 1.0]}, res.returns\n"
    "assert (res.run_dir / 'args.pt').stat().st_size < 20_000",
]


def test_issue_14_patterns_in_a_kernel(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()


WARNING_CELLS = [
    "import json, warnings\nimport distlab",
    "def careful(rank):\n"
    "    # a comment keeps the cell's and the script's line numbers apart\n"
    "    warnings.warn(f'rank {rank} takes care')\n"
    "    return rank",
    "res = distlab.spawn(careful, nprocs=2, view=None)\n"
    "print(json.dumps({'logs': res.logs, 'script': str(res.script), 'returns': res.returns}))",
]


def test_a_warning_on_a_rank_names_the_notebook_cell_not_the_generated_script(tmp_path):
    """#38 item 9: errors named the cell, warnings the script (``.../careful.py:14: UserWarning``)."""
    import json
    import os

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in WARNING_CELLS]
    NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    shown = json.loads("".join(o.get("text", "") for o in nb.cells[2].outputs if o.output_type == "stream"))
    assert shown["returns"] == {"0": 0, "1": 1}
    script = os.path.basename(shown["script"])
    for rank in ("0", "1"):
        log = shown["logs"][rank]
        assert f"Cell In[2], line 3, in careful: UserWarning: rank {rank} takes care\n" in log, log
        assert "  warnings.warn(f'rank {rank} takes care')\n" in log, log
        assert script not in log, log
