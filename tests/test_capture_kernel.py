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
