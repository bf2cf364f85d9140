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


def start_node(port: int, script: Path, ckpt: Path, workdir: Path) -> subprocess.Popen:
    argv = T.torchrun_command(nnodes=2, nproc_per_node=1, endpoint=f"127.0.0.1:{port}",
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
    nodes = [start_node(port, script, ckpt, tmp_path) for _ in range(2)]
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


@pytest.mark.slow
def test_chapter_7s_lines_on_two_real_nodes_train_to_the_reference(tmp_path, capsys):
    """The same commands, each typed on its own node (network namespace, own address, 1 Gbit/s link),
    with the rendezvous at node0's name: what chapter 7 runs."""
    import distlab

    script = T.write_ddp_train(tmp_path)
    ckpt = tmp_path / "nodes.pt"
    commands = T.torchrun_commands(nnodes=2, nproc_per_node=2, endpoint="node0:29400", script=str(script),
                                   rdzv_id="chapter7", tee=True,
                                   script_args=["--epochs", EPOCHS, "--size", SIZE, "--batch-size", BATCH,
                                                "--log-every", 2, "--checkpoint", ckpt])
    with distlab.Nodes(2, link="1gbit") as nodes:
        before = nodes.traffic()
        outputs = T.run_on_nodes(nodes, commands, timeout=WAIT_S * 2)
        sent = {k: nodes.traffic()[k]["sent_bytes"] - before[k]["sent_bytes"] for k in (0, 1)}
    assert "[node1] [default0]:Rank 2, Epoch 0, Batch 0, Loss:" in capsys.readouterr().out  # live, per node
    placed = [T.ranks_by_local_rank(out) for out in outputs]
    assert placed == [{0: 0, 1: 1}, {0: 2, 1: 3}]  # RANK vs LOCAL_RANK: node1's local 0 is rank 2
    sums = T.checksums_in("\n".join(outputs))
    assert sorted(sums) == [0, 1, 2, 3] and len(set(sums.values())) == 1
    ref = T.reference_train(SIZE, BATCH, world_size=4, epochs=EPOCHS)
    assert T.max_abs_difference(torch.load(ckpt, weights_only=True)["model"], ref["model"]) < 1e-6
    assert min(sent.values()) > 10_000  # the gradients crossed both links


def test_ranks_by_local_rank_reads_torchruns_tee_prefix():
    out = "[default1]:Rank 3, Epoch 0, Batch 0, Loss: 0.7\n[default0]:Rank 2, Epoch 0\nnoise\n[default1]:Rank 3, x"
    assert T.ranks_by_local_rank(out) == {1: 3, 0: 2}


def test_run_on_nodes_names_the_node_that_failed_and_stops_the_others(capsys):
    import time

    import distlab

    with distlab.Nodes(2) as nodes:
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"node 1 \(node1\): `echo broken; exit 4` ended with exit code 4; "
                                               r"its last lines:\nbroken"):
            T.run_on_nodes(nodes, ["sleep 60", "echo broken; exit 4"], timeout=60)
        assert time.monotonic() - start < 20
    assert "[node1] broken" in capsys.readouterr().out


def test_a_cpp_stack_trace_from_a_node_is_folded_into_one_line(capsys):
    folded = T.FoldedFrames(["node0", "node1"])
    for line in ["warning: store closed", "frame #0: c10::Error", "frame #1: x", "<omitting python frames>",
                 "frame #25: _start"]:
        folded.show(1, line)
    folded.show(0, "Rank 0, done")
    folded.flush(1)
    assert capsys.readouterr().out.splitlines() == [
        "[node1] warning: store closed", "[node0] Rank 0, done",
        "[node1] (4 lines of C++ stack trace, in the returned output)"]


@pytest.mark.slow
def test_a_lost_machine_is_survived_by_an_elastic_restart_on_the_node_left(tmp_path):
    """Chapter 9's lost machine: node1's processes die mid-run; node0's rank sees its peer go at once,
    its agent (--nnodes 1:2 --max-restarts 1) meets again alone and resumes from the checkpoint."""
    import distlab

    script = T.write_ddp_train(tmp_path)
    ckpt = tmp_path / "lost.pt"
    commands = T.torchrun_commands("1:2", 1, "node0:29400", script=str(script), rdzv_id="lost", tee=True,
                                   max_restarts=1, rdzv_conf=T.QUICK_ELASTIC,
                                   script_args=["--size", 2048, "--batch-size", BATCH, "--epochs", 30,
                                                "--log-every", 16, "--checkpoint", ckpt])
    with distlab.Nodes(2) as nodes:
        run = T.OnNodes(nodes, commands, env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}, echo=False)
        run.wait_for(r"Rank 1, Epoch 2, Batch 0", node=1)
        lost_at = run.lose(1)
        saw_at = run.wait_for(T.PEER_LOST.format(address=r"10\.77\.0\.2"), node=0)
        saved = torch.load(ckpt, weights_only=True)["epoch"]
        outputs = run.wait(timeout=180)
    assert saw_at - lost_at < 5
    # the restarted attempt states where it resumed: a line of the old attempt may still arrive after the loss
    node0 = [line for t, k, line in run.lines if k == 0 and t > saw_at]
    restart = next(i for i, line in enumerate(node0) if ", resumed from " in line)
    assert f"Rank 0, resumed from {ckpt} at epoch {saved} of 30" in node0[restart]  # from the last checkpoint
    resumed = [line for line in node0[restart:] if "Epoch" in line]
    assert resumed and all(line.startswith("[default0]:Rank 0, ") for line in resumed)  # one rank left: rank 0
    assert "parameter checksum" in outputs[0]
    assert f"Rank 0, Epoch {saved}, Batch 0" in resumed[0]
    assert torch.load(ckpt, weights_only=True)["epoch"] == 30
