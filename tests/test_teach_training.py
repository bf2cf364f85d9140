"""Chapter 7's ddp_train.py (taken from the chapter's %%writefile cell) and distlab.teach.training: the script's
helpers, the single-process reference, checkpoints, multi-node launch lines and the chapter's exercise checks.

The helpers are tested as the script defines them (``runpy`` of the written file, not as ``__main__``), so
these tests test the code a learner reads. Everything except the last test runs in this process.
"""
import json
import os
import re
import runpy
import shutil
import subprocess
import sys

import pytest
import torch

from distlab.plots import training as P
from distlab.teach import training as T


@pytest.fixture
def script(tmp_path):
    return T.write_ddp_train(tmp_path)


@pytest.fixture(scope="module")
def ns(tmp_path_factory):
    """The script's namespace: its functions, imported from the file the chapter writes."""
    return runpy.run_path(str(T.write_ddp_train(tmp_path_factory.mktemp("script"))))


# --- taking the script out of the chapter ----------------------------------------------------

def notebook_with(tmp_path, *sources):
    path = tmp_path / "nb.ipynb"
    cells = [{"cell_type": "code", "source": src, "metadata": {}, "outputs": []} for src in sources]
    path.write_text(json.dumps({"cells": cells}))
    return path


def test_script_from_notebook_takes_the_writefile_cell_without_its_magic(tmp_path):
    nb = notebook_with(tmp_path, "print(1)", ["%%writefile ddp_train.py\n", "import os\n", "print(os.sep)"],
                       "%%writefile other.py\nx = 1\n")
    assert T.script_from_notebook(nb) == "import os\nprint(os.sep)\n"
    assert T.script_from_notebook(nb, "other.py") == "x = 1\n"


def test_script_from_notebook_wants_exactly_one_cell(tmp_path):
    with pytest.raises(ValueError, match="found 0"):
        T.script_from_notebook(notebook_with(tmp_path, "%%writefile ddp_train.py.bak\nx\n"))
    with pytest.raises(ValueError, match="found 2"):
        T.script_from_notebook(notebook_with(tmp_path, "%%writefile ddp_train.py\na\n", "%%writefile ddp_train.py\nb"))


def test_the_chapter_writes_the_script_it_shows(script):
    assert T.chapter_notebook().name == "07_two_gpu_training.ipynb"
    assert script.read_text().startswith('"""ddp_train.py: the article')


# --- the script -------------------------------------------------------------------------------

def test_script_compiles_and_keeps_the_articles_program(script):
    text = script.read_text()
    compile(text, str(script), "exec")
    for line in ["class SimpleModel(nn.Module):", "class DummyDataset(Dataset):", "sampler.set_epoch(epoch)",
                 "criterion = nn.CrossEntropyLoss()", "optimizer = optim.SGD(model.parameters(), lr=0.01)",
                 "sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank)",
                 'print(f"Rank {rank}, Epoch {epoch}, Batch {batch_idx}, Loss: {loss.item()}"',
                 "world_size = args.world_size or 2"]:
        assert layout_free(line) in layout_free(text), line
    assert "'12355'" not in text and 'init_process_group("nccl"' not in text


def layout_free(code: str) -> str:
    """Code without spaces, line breaks and the seams of a string split in two, as the chapter
    compares it: the book wraps the article's long lines at 76 columns (book/fit_code.py)."""
    code = re.sub(r'"\s+f?"', "", code)
    return re.sub(r"\s+", "", code).replace(",)", ")")


def test_layout_free_sees_a_wrapped_line_and_not_a_changed_one():
    wrapped = 'print(\n    f"Rank {rank}, "\n    f"Loss: {x}",\n)'
    assert layout_free('print(f"Rank {rank}, Loss: {x}"') in layout_free(wrapped)
    assert layout_free('print(f"Rank {rank}, Loss: {y}"') not in layout_free(wrapped)


def marked(text: str, line: str, mark: str) -> bool:
    """``line  # mark`` on one line, or ``# mark`` on the line above it (where a comment goes
    when the two do not fit the page)."""
    return f"{line}  # {mark}" in text or re.search(
        rf"^( *)# {re.escape(mark)}\n\1{re.escape(line)}$", text, re.M) is not None


def test_the_scripts_launcher_variables_are_the_harness_ones(ns):
    assert ns["LAUNCHER_VARS"] == T.LAUNCHER_VARS   # tests and the GPU check clear the same variables


def test_script_marks_the_articles_changes(script):
    text = script.read_text()
    for line, mark in [("dist.init_process_group(backend, rank=rank, world_size=world_size)", 'changed: was "nccl"'),
                       ("torch.cuda.set_device(device)", "changed: was torch.cuda.set_device(rank)"),
                       ("use_own_rendezvous()", "added: replaces the article's fixed port 12355")]:
        assert marked(text, line, mark), (line, mark)


def test_script_defaults_are_the_articles(script):
    args = runpy.run_path(str(script))["parse_args"]([])
    assert (args.epochs, args.size, args.batch_size, args.seed, args.log_every) == (10, 10000, 32, 0, 100)
    assert args.world_size is None and args.checkpoint == ""
    small = runpy.run_path(str(script))["parse_args"](["--epochs", "2", "--size", "64", "--world-size", "1"])
    assert (small.epochs, small.size, small.world_size) == (2, 64, 1)


def test_script_is_lint_clean(script):
    ruff = shutil.which("ruff") or os.path.join(os.path.dirname(sys.executable), "ruff")
    assert os.path.exists(ruff), "ruff is in requirements.txt; install it"
    out = subprocess.run([ruff, "check", "--isolated", "--line-length", "120", "--select", "E,F,W,I,B,UP",
                          str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


# --- helpers copied into the script -----------------------------------------------------------

def test_device_and_backend_on_cpu_is_gloo(ns, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ns["device_and_backend"](0, 2) == (torch.device("cpu"), "gloo")


@pytest.mark.parametrize("gpus,local_rank,local_world,expected", [
    (2, 1, 2, (torch.device("cuda", 1), "nccl")),
    (1, 0, 1, (torch.device("cuda", 0), "nccl")),
    (1, 1, 2, (torch.device("cpu"), "gloo")),     # fewer GPUs than local ranks: CPU for all
])
def test_device_and_backend_with_gpus(ns, monkeypatch, gpus, local_rank, local_world, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    assert ns["device_and_backend"](local_rank, local_world) == expected


def test_a_slurm_task_bound_to_fewer_gpus_than_its_nodes_ranks_fails_instead_of_training_on_the_cpu(ns, monkeypatch):
    """--gpus-per-task=1 / --gpu-bind: each task sees one GPU, 4 ranks on the node: the script said "gloo on
    the CPU" and trained there, slowly and silently."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    with pytest.raises(SystemExit, match=r"local rank 1: 4 ranks on this node but 1 GPU\(s\) visible "
                                         r"\(CUDA_VISIBLE_DEVICES=2\); ask for --gpus-per-node=4"):
        ns["device_and_backend"](1, 4)
    monkeypatch.delenv("SLURM_JOB_ID")  # outside Slurm (a 1-GPU laptop) the CPU stays the answer
    assert ns["device_and_backend"](1, 4) == (torch.device("cpu"), "gloo")


def test_free_port_can_be_bound(ns):
    import socket

    port = ns["free_port"]()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    assert 0 < port < 65536


def test_own_rendezvous_keeps_a_user_port(ns, monkeypatch):
    for name in ns["LAUNCHER_VARS"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_PORT", "23456")
    ns["use_own_rendezvous"]()
    assert os.environ["MASTER_PORT"] == "23456" and os.environ["MASTER_ADDR"] == "localhost"


def test_own_rendezvous_drops_a_launchers_variables(ns, monkeypatch):
    launcher = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "1", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    for name, value in launcher.items():
        monkeypatch.setenv(name, value)
    ns["use_own_rendezvous"]()
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE"):
        assert name not in os.environ
    assert os.environ["MASTER_PORT"] != "1" and os.environ["MASTER_ADDR"] == "localhost"


def test_save_checkpoint_round_trip_leaves_no_temp_file(ns, tmp_path):
    path = tmp_path / "ckpt.pt"
    ns["save_checkpoint"]({"epoch": 3, "w": torch.arange(4.0)}, path)
    ns["save_checkpoint"]({"epoch": 4, "w": torch.arange(5.0)}, path)
    state = ns["load_checkpoint"](path, torch.device("cpu"))
    assert state["epoch"] == 4 and torch.equal(state["w"], torch.arange(5.0))
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_a_save_that_dies_half_way_keeps_the_old_checkpoint(ns, tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    ns["save_checkpoint"]({"epoch": 1}, path)

    def dies_half_way(obj, f):
        f.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt  # e.g. the job is killed mid-save

    monkeypatch.setattr(torch, "save", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        ns["save_checkpoint"]({"epoch": 2}, path)
    monkeypatch.undo()
    assert ns["load_checkpoint"](path, "cpu")["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_in_place_save_in_progress_is_unreadable_atomic_is_not(tmp_path):
    path = tmp_path / "shared.pt"
    state = {"w": torch.zeros(10_000)}
    torch.save(state, path)
    T.save_in_progress(state, path, atomic=True)
    assert T.try_load(path) == "complete"
    T.save_in_progress(state, path, atomic=False)
    assert T.try_load(path) != "complete"


def test_parameter_checksum(ns):
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.fill_(1.5)
        model.bias.fill_(-0.5)
    assert ns["parameter_checksum"](model) == 2.5


# --- the reference ----------------------------------------------------------------------------

def test_global_batches_cover_each_epoch_in_rank_order():
    batches = T.global_batches(size=64, batch_size=8, world_size=2, epoch=1)
    assert len(batches) == 4 and all(len(b) == 16 for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(64))
    shard0 = T.rank_indices(64, 2, 0, epoch=1)
    assert batches[0][:8] == shard0[:8] and batches[1][:8] == shard0[8:16]
    assert batches != T.global_batches(size=64, batch_size=8, world_size=2, epoch=0)


def test_steps_per_epoch():
    assert T.steps_per_epoch(10000, 32, 2) == 157
    assert T.steps_per_epoch(1024, 32, 2) == 16
    assert T.steps_per_epoch(10001, 32, 2) == 157  # 5001 samples per rank: the last batch has 9
    assert T.steps_per_epoch(10, 4, 3) == 1


def test_reference_equals_two_simulated_ddp_ranks():
    """The claim of the chapter, without processes: per-rank mean gradients, averaged (what DDP's
    all-reduce does), give the reference's parameters."""
    size, batch, world, epochs = 128, 8, 2, 2
    with T.one_thread():
        model = simulate_two_ranks(size, batch, world, epochs)
    ref = T.reference_train(size, batch, world, epochs)
    assert T.max_abs_difference(model.state_dict(), ref["model"]) < 1e-6
    assert len(ref["losses"]) == epochs * T.steps_per_epoch(size, batch, world)
    wrong = T.reference_train(size, batch, 1, epochs)
    assert T.max_abs_difference(model.state_dict(), wrong["model"]) > 1e-4


def simulate_two_ranks(size, batch, world, epochs):
    from distlab.teach.models import DummyDataset, SimpleModel

    torch.manual_seed(0)
    model, data = SimpleModel(), DummyDataset(size)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(epochs):
        shards = [T.rank_indices(size, world, r, epoch) for r in range(world)]
        for b in range(0, len(shards[0]), batch):
            grads = []
            for shard in shards:
                model.zero_grad()
                idx = shard[b:b + batch]
                loss_fn(model(data.data[idx]), data.targets[idx]).backward()
                grads.append([p.grad.clone() for p in model.parameters()])
            for p, *gs in zip(model.parameters(), *grads, strict=True):
                p.grad = sum(gs) / world
            opt.step()
    return model


def test_reference_restores_thread_count():
    before = torch.get_num_threads()
    T.reference_train(32, 8, 2, 1)
    assert torch.get_num_threads() == before


def test_states_equal_and_difference():
    a = {"w": torch.ones(3)}
    assert T.states_equal(a, {"w": torch.ones(3)})
    assert not T.states_equal(a, {"w": torch.ones(3) + 1e-7})
    assert T.max_abs_difference(a, {"w": torch.tensor([1.0, 1.5, 1.0])}) == 0.5


def test_log_and_metric_parsing():
    log = "Rank 1, samples/s: 10\nRank 1, parameter checksum: -4.5000000000\nRank 0, parameter checksum: 2.2500000000\n"
    assert T.checksums_in(log) == {1: -4.5, 0: 2.25}
    glued = "Rank 1, parameter checksum: -4.4046045401Rank 0, parameter checksum: -4.4046045401\n\n"
    assert T.checksums_in(glued) == {1: -4.4046045401, 0: -4.4046045401}  # two ranks, one pipe
    rows = [{"epoch": 2, "batch": 0, "loss": 0.5, "step": 1}, {"samples_per_s": 3.0}]
    assert T.losses_by_epoch_step(rows) == {(2, 0): 0.5}


def test_step_time_quantiles_and_samples_per_s():
    from distlab.results import RunResult

    rows = [{"step": i, "step_time": t} for i, t in enumerate([0.5, 0.1, 0.3, 0.2, 9.0])]
    res = RunResult(run_dir=None, script=None, world_size=1, metrics={0: rows + [{"samples_per_s": 123.0}]})
    assert T.step_time(res, 0.0) == 0.1 and T.step_time(res, 0.5) == 0.3 and T.step_time(res, 1.0) == 9.0
    assert T.samples_per_s(res) == 123.0


# --- multi-node -------------------------------------------------------------------------------

def test_torchrun_commands_are_one_line_for_every_machine_without_node_rank():
    """Issue #47: c10d ignores --node-rank (torch reads it only for the static rendezvous), so the
    commands do not teach it: every machine types the same line."""
    cmds = T.torchrun_commands(3, 4, "head:29400", script_args=["--epochs", 5])
    assert len(cmds) == 3 and len(set(cmds)) == 1 and "--node-rank" not in cmds[0]
    assert cmds[0].startswith("torchrun --nnodes 3 --nproc-per-node 4 --rdzv-backend c10d "
                              "--rdzv-endpoint head:29400")
    assert cmds[0].endswith("ddp_train.py --epochs 5")


def test_c10d_order_is_torchs():
    """C10D_ORDER says what torch 2.13's dynamic rendezvous sorts its participants by."""
    import dataclasses
    import inspect

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    assert tuple(f.name for f in dataclasses.fields(dr._NodeDesc)) == T.C10D_ORDER
    assert "enumerate(sorted(state.participants))" in inspect.getsource(dr._DistributedRendezvousOpExecutor)
    import torch.distributed.run as run  # chapter 7: torchrun warns that c10d ignores a --node-rank that is not 0

    assert "node_rank is only used for static rdzv_backend. It will be ignored" in inspect.getsource(run)


def test_agent_rendezvous_reads_torchruns_info_log():
    out = "\n".join([
        "I1205 02:42:51.225000 9111 torch/distributed/run.py:747] Using nproc_per_node=1.",
        "I1205 02:42:51.234000 9111 torch/distributed/elastic/agent/server/api.py:707] [default] "
        "Rendezvous'ing worker group",
        "[default0]:Rank 2, Epoch 0",
        "I1205 02:42:53.345000 9111 torch/distributed/elastic/agent/server/api.py:553]   group_rank=1",
        "I1205 02:42:53.345000 9111 torch/distributed/elastic/agent/server/api.py:553]   group_world_size=2"])
    found = T.agent_rendezvous(out)
    assert found["group_rank"] == 1
    assert (found["rendezvous"] - found["started"]).total_seconds() == pytest.approx(0.009)
    assert T.agent_rendezvous("no log") == {}


def test_info_log_lines_are_folded_and_warnings_kept(capsys):
    folded = T.FoldedFrames(["node0", "node1"])
    for line in ["I1205 02:42:51.225000 9111 torch/x.py:1] a", "I1205 02:42:51.226000 9111 torch/x.py:2] b",
                 "W1205 02:42:52.000000 9111 torch/x.py:3] careful", "frame #0: c10::Error",
                 "I1205 02:42:53.000000 9111 torch/x.py:4] c", "[default0]:Rank 0, done"]:
        folded.show(0, line)
    folded.flush(0)
    assert capsys.readouterr().out.splitlines() == [
        "[node0] (2 lines of torch's INFO log, in the returned output)",
        "[node0] W1205 02:42:52.000000 9111 torch/x.py:3] careful",
        "[node0] (1 lines of C++ stack trace, in the returned output)",
        "[node0] (1 lines of torch's INFO log, in the returned output)",
        "[node0] [default0]:Rank 0, done"]


def test_slurm_script_is_valid_bash():
    text = T.slurm_script(nodes=4, gpus_per_node=8, script_args=["--epochs", 3])
    for line in ["#SBATCH --nodes=4", "#SBATCH --gpus-per-node=8", "#SBATCH --ntasks-per-node=1",
                 "--nproc-per-node 8", "--rdzv-backend c10d", "ddp_train.py --epochs 3"]:
        assert line in text
    if shutil.which("bash"):
        assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_slurm_scripts_rendezvous_is_the_first_nodes_address_at_a_port_of_the_jobs_own(tmp_path):
    """Chapter 7's printed batch script, run with stub ``scontrol`` and ``srun``: the endpoint is the first
    node's NodeAddr (its short name need not resolve elsewhere), the port comes from the job id (a fixed
    29400 makes a second job on that node join the first one's store)."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "scontrol").write_text('#!/bin/bash\ncase "$2" in hostnames) echo gpu07; echo gpu08;; '
                                    '*) echo "NodeName=$4 Arch=x86_64 NodeAddr=10.1.2.7 NodeHostName=$4";; esac\n')
    (stubs / "srun").write_text('#!/bin/bash\necho "srun $*"\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "gpu[07-08]",
           "SLURM_NNODES": "2", "SLURM_CPUS_PER_TASK": "8"}
    for job_id, port in ((4242, 24242), (12345, 20345)):
        out = subprocess.run(["bash", "-c", T.slurm_script()], env={**env, "SLURM_JOB_ID": str(job_id)},
                             capture_output=True, text=True, check=True).stdout
        assert f"--rdzv-endpoint 10.1.2.7:{port} --rdzv-id {job_id}" in out, out


# --- exercise checks --------------------------------------------------------------------------

def test_checks_accept_right_answers_and_wait_for_none(capsys):
    assert T.check_global_batch(None) is False
    assert T.check_global_batch(64) is True
    assert T.check_steps_per_epoch(157) is True
    assert T.check_node_command("torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d "
                                "--rdzv-endpoint gpu-node-0:29400 ddp_train.py") is True
    assert T.check_node_command("torchrun --nproc_per_node=4 --nnodes=2 --rdzv-endpoint=gpu-node-0:29400 "
                                "--rdzv-backend=c10d ddp_train.py --epochs 3") is True
    assert "correct" in capsys.readouterr().out


@pytest.mark.parametrize("check,answer,hint", [
    (T.check_global_batch, 32, "DDP averages"),
    (T.check_steps_per_epoch, 313, "ceil(10000/2)"),
    (T.check_node_command, "torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d "
                           "--rdzv-endpoint gpu-node-0:29400 ddp_train.py", "--nproc-per-node"),
    (T.check_node_command, "torchrun --nnodes 2 --node-rank 1 --nproc-per-node 4 --rdzv-backend c10d "
                           "--rdzv-endpoint gpu-node-0:29400 ddp_train.py", "torch ignores it"),
])
def test_checks_reject_wrong_answers_with_a_hint(check, answer, hint):
    with pytest.raises(AssertionError, match=hint.replace("(", r"\(").replace(")", r"\)")):
        check(answer)


# --- plots ------------------------------------------------------------------------------------

def test_plots_draw_what_they_say():
    fig = P.loss_curves({0: [0.7, 0.69], 1: [0.71, 0.68]}, reference=[0.705, 0.685])
    assert len(fig.axes[0].lines) == 3
    fig = P.throughput({1: 100.0, 2: 150.0})
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights == [100.0, 150.0, 100.0, 200.0]


# --- the script, run as a user would (processes) ----------------------------------------------

@pytest.mark.slow
def test_plain_python_run_trains_like_the_reference(ns, script, tmp_path):
    """`python ddp_train.py` outside distlab: mp.spawn starts 2 ranks; both end at the reference."""
    ckpt = tmp_path / "ckpt.pt"
    env = {k: v for k, v in os.environ.items() if k not in ns["LAUNCHER_VARS"]}
    env["OMP_NUM_THREADS"] = "1"
    out = subprocess.run([sys.executable, str(script), "--epochs", "2", "--size", "128", "--batch-size", "16",
                          "--checkpoint", str(ckpt)], capture_output=True, text=True, timeout=120, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    sums = T.checksums_in(out.stdout)
    assert sums.keys() == {0, 1} and sums[0] == sums[1]
    ref = T.reference_train(128, 16, 2, 2)
    state = torch.load(ckpt, weights_only=True)
    assert state["epoch"] == 2 and T.max_abs_difference(state["model"], ref["model"]) < 1e-6


class _LocalNodes:
    """Runs each "node" command here, and keeps the environment it was given (no namespaces)."""

    hosts = ["node0", "node1"]
    closed = False

    def __init__(self):
        self.envs = []

    def alive(self, node):
        return True

    def kill_processes(self, node, mark=None):
        return []  # (the commands here end by themselves)

    def popen(self, node, argv, **kwargs):
        self.envs.append(kwargs.get("env"))
        return subprocess.Popen(argv, **kwargs)


def test_commands_on_nodes_print_their_lines_as_they_come_whatever_the_kernels_environment(monkeypatch):
    """chapter 9 watches a node's lines to kill it mid-training: a script's print into torchrun's
    --tee file is block-buffered unless PYTHONUNBUFFERED is set (a learner's Jupyter does not set it)."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    nodes = _LocalNodes()
    run = T.OnNodes(nodes, ["echo one", "echo two"], echo=False)
    assert run.wait(timeout=30) == ["one", "two"]
    assert [env["PYTHONUNBUFFERED"] for env in nodes.envs] == ["1", "1"]


def test_commands_on_nodes_can_start_one_node_first_and_the_others_once_it_is_ready():
    """Chapter 7 starts node1's agent alone and node0's only once node1's is in the rendezvous."""
    nodes = _LocalNodes()
    run = T.OnNodes(nodes, ["echo zero", "sleep 1; echo ready; sleep 1; echo done"], echo=False, first=1,
                    ready="^ready$")
    assert run.wait(timeout=30) == ["zero", "ready\ndone"]
    at = {(k, line): t for t, k, line in run.lines}
    assert at[(1, "ready")] < at[(0, "zero")]   # node0's command started after node1's line
    with pytest.raises(RuntimeError, match="no line matching 'never'"):
        T.OnNodes(nodes, ["echo zero", "echo one"], echo=False, first=1, ready="never")


def test_commands_on_nodes_say_a_missing_torchrun_before_starting_anything(monkeypatch, tmp_path):
    """A virtual environment built without console scripts has no ``torchrun`` beside its Python: the
    nodes' run says so, and where it looked, instead of a rendezvous that times out 120 s later."""
    nodes = _LocalNodes()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    commands = T.torchrun_commands(nnodes=2, nproc_per_node=1, endpoint="node1:29400")
    with pytest.raises(RuntimeError) as e:
        T.OnNodes(nodes, commands, env={"PATH": "/usr/bin:/bin"}, echo=False, first=1, ready="Rendezvous")
    assert str(e.value).startswith(
        f"`torchrun` was not found on the nodes: none in the folders searched, in this order "
        f"PATH={tmp_path / 'bin'}:/usr/bin:/bin (the first is this kernel's Python's, {tmp_path / 'bin'}). ")
    assert f"write `{tmp_path / 'bin' / 'python'} -m torch.distributed.run` in place of `torchrun`" in str(e.value)
    assert nodes.envs == []          # nothing started
