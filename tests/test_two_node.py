"""Chapter 7's multi-node launch, executed: two torchrun agents on this host act as two "nodes".

Each agent runs the command ``distlab.teach.training.torchrun_commands`` writes for its node
(``--nnodes 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT``, one rank per node); they meet in
the c10d rendezvous over loopback and train ``ddp_train.py`` together. Both ranks must end with the
same parameters, equal to the single-process reference on the global batches.
"""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distlab.teach import training as T

SIZE, BATCH, EPOCHS = 256, 32, 2
WAIT_S = 90


def start_node(node_rank: int, port: int, script: Path, ckpt: Path, workdir: Path) -> subprocess.Popen:
    argv = T.torchrun_command(node_rank, nnodes=2, nproc_per_node=1, endpoint=f"127.0.0.1:{port}",
                              script=str(script), rdzv_id="two-node-test",
                              script_args=["--epochs", EPOCHS, "--size", SIZE, "--batch-size", BATCH,
                                           "--log-every", 2, "--checkpoint", ckpt])
    torchrun = Path(sys.executable).with_name("torchrun")  # this venv's torchrun, else the same module
    argv[:1] = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    env = {k: v for k, v in os.environ.items() if k not in T.LAUNCHER_VARS}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=workdir, start_new_session=True)


def stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@pytest.mark.slow
def test_two_torchrun_agents_train_to_the_reference(tmp_path):
    script = T.write_ddp_train(tmp_path)
    ckpt = tmp_path / "ckpt.pt"
    port = T.free_port()
    nodes = [start_node(k, port, script, ckpt, tmp_path) for k in range(2)]
    try:
        outputs = [p.communicate(timeout=WAIT_S)[0] for p in nodes]
    finally:
        stop(nodes)
    for k, (p, out) in enumerate(zip(nodes, outputs, strict=True)):
        assert p.returncode == 0, f"node {k} failed:\n{out}"

    sums = [T.checksums_in(out) for out in outputs]
    assert sorted(rank for s in sums for rank in s) == [0, 1]   # one rank on each "node", ranks 0 and 1
    (a,), (b,) = (s.values() for s in sums)
    assert a == b                                               # both nodes hold the same parameters
    for out in outputs:
        assert "Epoch 1, Batch 2, Loss:" in out

    ref = T.reference_train(SIZE, BATCH, world_size=2, epochs=EPOCHS)
    state = torch.load(ckpt, weights_only=True)
    assert state["epoch"] == EPOCHS
    assert T.max_abs_difference(state["model"], ref["model"]) < 1e-6
    assert abs(a - sum(v.double().sum().item() for v in ref["model"].values())) < 1e-4
