"""The generated script runs without the notebook, as its header promises: ``python script.py``
(it starts its ranks with mp.spawn) and ``torchrun --standalone``. Slow: real processes."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_kernel import run_cells

from distlab.api import write_script
from distlab.capture.collect import capture

pytestmark = pytest.mark.slow
SRC = str(Path(__file__).resolve().parent.parent / "src")

CELLS = (
    "import torch\nimport torch.distributed as dist\n",
    "def summed(rank, world):\n"
    "    dist.init_process_group('gloo', rank=rank, world_size=world)\n"
    "    t = torch.ones(1) * (rank + 1)\n    dist.all_reduce(t)\n    dist.destroy_process_group()\n"
    "    print(f'rank {rank} of {world}: sum {t.item()}', flush=True)\n    return t.item()\n",
    "def grouped(scale):\n"
    "    t = torch.ones(1) * (dist.get_rank() + 1) * scale\n    dist.all_reduce(t)\n"
    "    print(f'rank {dist.get_rank()} of {dist.get_world_size()}: sum {t.item()}', flush=True)\n",
)


def _run(command, cwd) -> str:
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DISTLAB_RUN_DIR"):
        env.pop(name, None)
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_python_script_starts_its_own_ranks(tmp_path):
    fn = run_cells(*CELLS)["summed"]
    path = write_script(tmp_path, capture(fn, (2,)), (2,), 2, "spawn", "gloo")
    out = _run([sys.executable, path.name], tmp_path)
    for rank in (0, 1):
        assert f"rank {rank} of 2: sum 3.0" in out and f"[rank{rank}] returned 3.0" in out


def test_torchrun_runs_a_launch_style_script(tmp_path):
    fn = run_cells(*CELLS)["grouped"]
    path = write_script(tmp_path, capture(fn, (10,)), (10,), 2, "launch", "gloo")
    assert f"torchrun --standalone --nproc-per-node 2 {path.name}" in path.read_text()
    out = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", path.name],
               tmp_path)
    assert "rank 0 of 2: sum 30.0" in out and "rank 1 of 2: sum 30.0" in out


LISTENING = (
    "import os\nimport psutil\nimport torch\nimport torch.distributed as dist\n",
    "def listening(rank, world):\n"
    "    dist.init_process_group('gloo', rank=rank, world_size=world)\n"
    "    dist.barrier()\n"
    "    mine = [c.laddr.ip for c in psutil.Process().net_connections('inet') if c.status == 'LISTEN']\n"
    "    parent = [c.laddr.ip for c in psutil.Process(os.getppid()).net_connections('inet') if c.status == 'LISTEN']\n"
    "    dist.barrier()\n    dist.destroy_process_group()\n"
    "    print(f'rank {rank}: mine {sorted(set(mine))} parent {parent}', flush=True)\n",
)


def test_a_script_run_by_hand_keeps_its_rendezvous_and_temp_files_private(tmp_path):
    """``python script.py``: the ranks meet in a private FileStore (the main process listens on no
    port, the ranks only on loopback for gloo), and mp.spawn's error files are not in $TMPDIR."""
    fn = run_cells(*LISTENING)["listening"]
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    path = write_script(tmp_path, capture(fn, (2,)), (2,), 2, "spawn", "gloo")
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "TMPDIR": str(shared)}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DISTLAB_RUN_DIR", "DISTLAB_RUNS",
                 "XDG_RUNTIME_DIR"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, path.name], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        assert f"rank {rank}: mine ['127.0.0.1'] parent []" in done.stdout, done.stdout
    assert sorted(p.name for p in shared.iterdir()) == [f"distlab-{os.getuid()}"]  # no pickle, no pymp-*


def test_a_hand_run_scripts_ranks_keep_gloo_and_nccl_on_loopback(tmp_path):
    """Before: ``python script.py`` set GLOO_SOCKET_IFNAME in its ranks, not NCCL_SOCKET_IFNAME."""
    fn = run_cells("import os\n", "def ifnames(rank):\n"
                   "    return os.environ.get('GLOO_SOCKET_IFNAME'), os.environ.get('NCCL_SOCKET_IFNAME')\n")["ifnames"]
    path = write_script(tmp_path, capture(fn, ()), (), 2, "spawn", "gloo")
    env_names = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
    saved = {n: os.environ.pop(n) for n in env_names if n in os.environ}
    try:
        out = _run([sys.executable, path.name], tmp_path)
    finally:
        os.environ.update(saved)
    from distlab.worker import loopback_interface

    lo = loopback_interface()
    assert f"[rank0] returned ({lo!r}, {lo!r})" in out and f"[rank1] returned ({lo!r}, {lo!r})" in out
