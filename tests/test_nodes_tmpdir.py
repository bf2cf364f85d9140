"""What a learner runs on a node gets the node's own TMPDIR (issue #58 item 5).

Chapter 7 has the learner type a plain ``torchrun`` on each of :class:`distlab.Nodes`; every such run left two
``torchelastic_*`` folders in the machine's shared temp dir (torch's agent makes them with ``tempfile`` and
never removes them). A node command now runs with ``TMPDIR`` set to a private folder of the node's, which goes
when the nodes close.
"""
import os
import stat
import sys
from pathlib import Path

import pytest

import distlab

pytestmark = pytest.mark.slow

NOOP = "import torch.distributed as dist\ndist.init_process_group('gloo')\nprint('rank', dist.get_rank(), 'ran')\n"


def test_a_plain_torchrun_on_a_node_leaves_nothing_in_the_shared_temp_dir(shared_tmp, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(shared_tmp))  # the machine's shared temp dir, fresh: nothing else lands here
    script = tmp_path / "noop.py"
    script.write_text(NOOP)
    torchrun = Path(sys.executable).with_name("torchrun")
    with distlab.Nodes(1) as nodes:
        done = nodes.run(0, f"'{torchrun}' --standalone --nproc-per-node 1 '{script}'", timeout=180)
        assert "rank 0 ran" in done.stdout + done.stderr
        left = sorted(p.name for p in shared_tmp.glob("torchelastic_*"))
        assert left == [], f"torchrun on a node left {left} in the shared temp dir"
        used = nodes.run(0, f"'{sys.executable}' -c 'import tempfile; print(tempfile.gettempdir())'").stdout.strip()
        assert used == nodes.tmpdir(0) and list(Path(used).glob("torchelastic_*"))  # torchrun's went there
        st = os.stat(used)
        assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700
    assert not Path(used).exists(), "the node's temp folder outlived the nodes"
