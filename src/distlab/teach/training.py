"""Chapter 7: the article's ``ddp_train.py``, made device-agnostic, plus what proves it right.

* :func:`write_ddp_train` writes the script a learner takes away. It is the article's program
  (SimpleModel, DummyDataset, DistributedSampler with ``set_epoch``, CrossEntropyLoss, SGD, 10 epochs,
  ``Rank r, Epoch e, ...`` prints); the small helpers it needs (device choice, a free port, atomic
  checkpoints) are copied into it from this module by source, so the tests here test the script's code.
* :func:`reference_train` trains the same model on one process with the *global* batches DDP sees,
  for the equivalence check.
* :func:`torchrun_commands` and :func:`slurm_script` write the multi-node launch lines.
* ``check_*`` functions are the chapter's exercise self-checks.
"""
from __future__ import annotations

import inspect
import io
import math
import os
import re
import shlex
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

# ---------------------------------------------------------------------------------------------
# Helpers that ddp_train.py contains verbatim (copied by source; keep them self-contained:
# they may use only os, socket, tempfile and torch)
# ---------------------------------------------------------------------------------------------

LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")


def device_and_backend(local_rank, local_world_size):
    """NCCL on ``cuda:<local rank>`` when every rank on this machine has its own GPU, else gloo on the CPU.

    The article hard-codes ``"nccl"`` and ``.to(rank)``: right on 2×T4, an error on a laptop. The local
    rank (not the global one) picks the GPU, so the same line is right on the second node of a cluster.
    """
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size:
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def free_port():
    """A port the OS reports free right now (bind port 0 on loopback, read it, release it).

    The article's fixed 12355 makes two runs on one host (two users, two notebooks) join each other's
    process group or fail with "address already in use". Another program could still grab this port
    before rank 0 binds it, but that window is milliseconds, not forever.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def use_own_rendezvous():
    """Set MASTER_ADDR/MASTER_PORT for the ranks that ``mp.spawn`` starts from this process.

    A MASTER_PORT you exported yourself is kept. If a launcher started this process (RANK is set),
    its variables describe *its* group and its port is taken by its store, so they are dropped first.
    """
    if "RANK" in os.environ:
        for name in LAUNCHER_VARS:
            os.environ.pop(name, None)
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def save_checkpoint(state, path):
    """Write ``state`` to a temporary file in the same folder, then rename it over ``path``.

    ``os.replace`` is atomic when both names are on one file system: a reader, or a restart after a
    crash mid-save, finds the previous complete checkpoint or the new one, never half a file.
    """
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".checkpoint-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def load_checkpoint(path, device):
    """Load onto *this* rank's device. Without ``map_location`` a checkpoint saved from ``cuda:0`` is
    loaded onto ``cuda:0`` by every rank: all ranks crowd one GPU's memory."""
    return torch.load(path, map_location=device, weights_only=True)


def parameter_checksum(model):
    """One number per model (float64 sum of every parameter): equal on all ranks after DDP training."""
    return sum(p.detach().double().sum().item() for p in model.parameters())


SCRIPT_HELPERS = (device_and_backend, free_port, use_own_rendezvous, save_checkpoint, load_checkpoint,
                  parameter_checksum)

# ---------------------------------------------------------------------------------------------
# The script
# ---------------------------------------------------------------------------------------------

SCRIPT_TEMPLATE = '''"""ddp_train.py: the article's two-GPU DDP training script, made device-agnostic.

One file for a CPU laptop, a 2xT4 server and a cluster:
    python ddp_train.py                                   # starts 2 ranks itself (mp.spawn)
    torchrun --nproc-per-node 2 ddp_train.py              # torchrun starts the ranks
    torchrun --nnodes 2 --node-rank K --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint HOST:29400 ddp_train.py
NCCL + cuda:<local rank> when every local rank has a GPU, gloo + CPU otherwise.
Small run: python ddp_train.py --epochs 2 --size 1024 --batch-size 32
"""
import argparse
import os
import socket
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

try:  # optional: when distlab runs this script, losses also reach the notebook as data
    import distlab
except ImportError:
    distlab = None


# 1. 定义简单模型 (the model)
class SimpleModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(10, 100),
            nn.ReLU(),
            nn.Linear(100, 50),
            nn.ReLU(),
            nn.Linear(50, 2)
        )

    def forward(self, x):
        return self.net(x)


# 2. 定义虚拟数据集 (random data; --seed makes it the same on every rank)
class DummyDataset(Dataset):
    def __init__(self, size=10000):
        self.data = torch.randn(size, 10)
        self.targets = torch.randint(0, 2, (size,))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, idx):
        return self.data[idx], self.targets[idx]


LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")  # what a launcher sets

__HELPERS__


def resume(path, model, optimizer, device):
    """Every rank loads the same checkpoint onto its own device; returns the epoch to continue from."""
    if not path or not os.path.exists(path):
        return 0
    state = load_checkpoint(path, device)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["epoch"]


# 3. 训练函数 (training)
def train(rank, world_size, args):
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    device, backend = device_and_backend(local_rank, local_world_size)
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    if device.type == "cuda":
        torch.cuda.set_device(device)

    torch.manual_seed(args.seed)  # same initial model and same DummyDataset on every rank
    model = SimpleModel().to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(model.parameters(), lr=0.01)

    dataset = DummyDataset(size=args.size)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank)
    dataloader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    start_epoch = resume(args.checkpoint, model, optimizer, device)
    total, step, seen = (args.epochs - start_epoch) * len(dataloader), 0, 0
    start = time.perf_counter()
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # 确保每个epoch有不同的shuffle
        model.train()
        for batch_idx, (data, target) in enumerate(dataloader):
            tick = time.perf_counter()
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            output = model(data)
            loss = criterion(output, target)
            loss.backward()
            optimizer.step()
            step, seen = step + 1, seen + len(data)
            if distlab is not None:
                distlab.report(step=step, total=total, epoch=epoch, batch=batch_idx, loss=loss.item(),
                               step_time=time.perf_counter() - tick)
            if batch_idx % args.log_every == 0:
                print(f"Rank {rank}, Epoch {epoch}, Batch {batch_idx}, Loss: {loss.item()}", flush=True)
        if args.checkpoint:
            if rank == 0:  # one writer: after DDP's step the parameters are the same on every rank
                state = {"epoch": epoch + 1, "model": model.module.state_dict(),
                         "optimizer": optimizer.state_dict()}
                save_checkpoint(state, args.checkpoint)
            dist.barrier()  # no rank runs ahead, or exits, before the checkpoint is complete

    samples_per_s = seen * world_size / max(time.perf_counter() - start, 1e-9)
    if distlab is not None:
        distlab.report(samples_per_s=samples_per_s)
    print(f"Rank {rank}, samples/s: {samples_per_s:.0f}", flush=True)
    print(f"Rank {rank}, parameter checksum: {parameter_checksum(model):.10f}", flush=True)
    # 清理进程组
    dist.destroy_process_group()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="The article's DDP training script, on any device.")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--size", type=int, default=10000, help="samples in DummyDataset")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--seed", type=int, default=0, help="same initial model and data on every rank")
    p.add_argument("--checkpoint", default="", help="rank 0 saves here after every epoch; resume if it exists")
    p.add_argument("--log-every", type=int, default=100, help="print every N batches")
    p.add_argument("--world-size", type=int, default=None,
                   help="start this many ranks here with mp.spawn (plain `python ddp_train.py`: 2)")
    return p.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    if "RANK" in os.environ and args.world_size is None:  # torchrun started this process: it is one rank
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
    else:  # python ddp_train.py: start the ranks here, as the article does
        world_size = args.world_size or 2  # 使用2个GPU
        use_own_rendezvous()
        torch.multiprocessing.spawn(train, args=(world_size, args), nprocs=world_size, join=True)
'''


def ddp_train_source() -> str:
    """The text of ``ddp_train.py``: the template with this module's helpers pasted in by source."""
    helpers = "\n\n".join(inspect.getsource(fn).rstrip() for fn in SCRIPT_HELPERS)
    return SCRIPT_TEMPLATE.replace("__HELPERS__", helpers)


def write_ddp_train(folder) -> Path:
    """Write ``ddp_train.py`` into ``folder`` (a temp folder in the chapter) and return its path."""
    path = Path(folder) / "ddp_train.py"
    path.write_text(ddp_train_source())
    return path


# ---------------------------------------------------------------------------------------------
# The single-process reference: what DDP must be equal to
# ---------------------------------------------------------------------------------------------

def rank_indices(size: int, world_size: int, rank: int, epoch: int) -> list[int]:
    """The sample indices rank ``rank`` trains on in ``epoch`` (DistributedSampler's defaults, seed 0)."""
    from torch.utils.data.distributed import DistributedSampler

    sampler = DistributedSampler(range(size), num_replicas=world_size, rank=rank)
    sampler.set_epoch(epoch)
    return list(sampler)


def global_batches(size: int, batch_size: int, world_size: int, epoch: int) -> list[list[int]]:
    """Step ``i``'s global batch: batch ``i`` of every rank, concatenated in rank order.

    DDP averages the ranks' gradients, and each rank's gradient is the mean over its own batch, so with
    equal batch sizes one DDP step equals one plain step on this concatenation.
    """
    shards = [rank_indices(size, world_size, r, epoch) for r in range(world_size)]
    per_rank = len(shards[0])
    return [[i for shard in shards for i in shard[b:b + batch_size]] for b in range(0, per_rank, batch_size)]


@contextmanager
def one_thread():
    """Run the block with one intra-op thread: for tiny matrices one thread is fastest, and on a machine
    whose cores the ranks share, extra threads only spin and wait."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def reference_train(size: int, batch_size: int, world_size: int, epochs: int, seed: int = 0,
                    lr: float = 0.01) -> dict:
    """Train SimpleModel in this process on DDP's global batches; returns ``model`` state and ``losses``.

    Builds model and data in the script's order after ``torch.manual_seed(seed)``, so it starts from the
    same parameters and the same DummyDataset as every rank of ``ddp_train.py --seed seed``.
    """
    from .models import DummyDataset, SimpleModel

    with one_thread():
        torch.manual_seed(seed)
        model = SimpleModel()
        dataset = DummyDataset(size=size)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        criterion = torch.nn.CrossEntropyLoss()
        losses = []
        for epoch in range(epochs):
            for idx in global_batches(size, batch_size, world_size, epoch):
                optimizer.zero_grad()
                loss = criterion(model(dataset.data[idx]), dataset.targets[idx])
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
    return {"model": {k: v.detach().clone() for k, v in model.state_dict().items()}, "losses": losses}


def max_abs_difference(a: dict, b: dict) -> float:
    """Largest element-wise difference between two state dicts with the same keys."""
    assert a.keys() == b.keys(), f"different parameters: {sorted(a.keys() ^ b.keys())}"
    return max((a[k].float().cpu() - b[k].float().cpu()).abs().max().item() for k in a)


def states_equal(a: dict, b: dict) -> bool:
    """Bit-for-bit equality of two state dicts."""
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


def steps_per_epoch(size: int, batch_size: int, world_size: int) -> int:
    """Optimizer steps each rank takes per epoch (DistributedSampler pads to a multiple of world_size)."""
    return math.ceil(math.ceil(size / world_size) / batch_size)


def losses_by_epoch_step(rows: list[dict]) -> dict[tuple[int, int], float]:
    """A rank's reported losses keyed by (epoch, batch), so a resumed run lines up with a full one."""
    return {(r["epoch"], r["batch"]): r["loss"] for r in rows if "loss" in r}


def samples_per_s(result) -> float:
    """Rank 0's reported throughput of a ddp_train.py run (global samples per second)."""
    values = result.series("samples_per_s", rank=0)
    assert values, "the run reported no samples_per_s (was it started through distlab?)"
    return float(values[-1])


def step_time(result, quantile: float = 0.5, rank: int = 0) -> float:
    """A quantile of a run's reported per-step times (0.5: the median, 0.0: the fastest step).

    On a shared machine the fastest step is the most repeatable figure: other programs can only make
    steps slower, so the minimum is closest to what the step itself costs.
    """
    times = sorted(result.series("step_time", rank=rank))
    assert times, "the run reported no step_time"
    return times[min(int(quantile * len(times)), len(times) - 1)]


def checksums_in(log: str) -> dict[int, float]:
    """``{rank: checksum}`` from the script's ``Rank r, parameter checksum: x`` lines.

    The value has exactly 10 decimals, so a line two ranks wrote into one pipe at once (unbuffered
    ``print`` writes the text and the newline separately) still parses.
    """
    pattern = r"Rank (\d+), parameter checksum: (-?\d+\.\d{10})"
    return {int(rank): float(value) for rank, value in re.findall(pattern, log)}


# ---------------------------------------------------------------------------------------------
# Checkpoints written by every rank: the race, frozen so it can be shown
# ---------------------------------------------------------------------------------------------

def save_in_progress(state, path, atomic: bool, fraction: float = 0.5) -> None:
    """Freeze a save of ``state`` to ``path`` part-way: the bytes a reader would find at that moment.

    ``torch.save(state, path)`` truncates ``path`` first and then writes, so a reader sees a prefix.
    ``save_checkpoint`` writes the prefix to a temporary name instead; ``path`` keeps the old file.
    """
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    target = Path(path).with_name(Path(path).name + ".tmp") if atomic else Path(path)
    with open(target, "wb") as f:
        f.write(data[: int(len(data) * fraction)])


def try_load(path) -> str:
    """``"complete"`` when ``torch.load`` reads the file, else the error's type and first line."""
    try:
        torch.load(path, map_location="cpu", weights_only=True)
        return "complete"
    except Exception as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


# ---------------------------------------------------------------------------------------------
# Beyond one machine
# ---------------------------------------------------------------------------------------------

def torchrun_command(node_rank: int, nnodes: int, nproc_per_node: int, endpoint: str,
                     script: str = "ddp_train.py", script_args=(), rdzv_id: str = "ddp_train") -> list[str]:
    """argv for one node. With the c10d rendezvous the agents meet at ``endpoint`` (host:port on the
    first node, reachable from all), agree on ranks and a store; ``--rdzv-id`` names the job."""
    return ["torchrun", "--nnodes", str(nnodes), "--node-rank", str(node_rank),
            "--nproc-per-node", str(nproc_per_node), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
            "--rdzv-id", rdzv_id, script, *[str(a) for a in script_args]]


def torchrun_commands(nnodes: int, nproc_per_node: int, endpoint: str, script: str = "ddp_train.py",
                      script_args=(), rdzv_id: str = "ddp_train") -> list[str]:
    """The shell command to type on each node (index = node rank); only ``--node-rank`` differs."""
    return [shlex.join(torchrun_command(k, nnodes, nproc_per_node, endpoint, script, script_args, rdzv_id))
            for k in range(nnodes)]


SLURM_TEMPLATE = """#!/bin/bash
#SBATCH --job-name={job_name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1          # one torchrun agent per node; it starts the ranks
#SBATCH --gpus-per-node={gpus}
#SBATCH --cpus-per-task={cpus}
#SBATCH --time={time}

# The first node of the allocation hosts the c10d rendezvous.
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)

srun torchrun \\
    --nnodes "$SLURM_NNODES" \\
    --node-rank "$SLURM_NODEID" \\
    --nproc-per-node {gpus} \\
    --rdzv-backend c10d \\
    --rdzv-endpoint "$head_node:{port}" \\
    --rdzv-id "$SLURM_JOB_ID" \\
    {command}
"""


def slurm_script(nodes: int = 2, gpus_per_node: int = 2, script: str = "ddp_train.py", script_args=(),
                 job_name: str = "ddp_train", time: str = "00:30:00", port: int = 29400,
                 cpus_per_task: int = 8) -> str:
    """An sbatch file: SLURM picks the nodes, ``srun`` starts one torchrun per node."""
    command = shlex.join([script, *[str(a) for a in script_args]])
    return SLURM_TEMPLATE.format(job_name=job_name, nodes=nodes, gpus=gpus_per_node, cpus=cpus_per_task,
                                 time=time, port=port, command=command)


# ---------------------------------------------------------------------------------------------
# Exercise self-checks
# ---------------------------------------------------------------------------------------------

def _unanswered(answer, what: str) -> bool:
    if answer is None:
        print(f"No answer yet: replace None with {what}.")
        return True
    return False


def check_global_batch(answer, per_rank_batch: int = 32, world_size: int = 2) -> bool:
    """Exercise 1: the batch size of the single-process run that DDP training is equal to."""
    if _unanswered(answer, "a number of samples"):
        return False
    expected = per_rank_batch * world_size
    assert answer == expected, (
        f"{answer} is not it. Each of the {world_size} ranks computes a mean gradient over its own "
        f"{per_rank_batch} samples and DDP averages those: a mean over how many samples in all?")
    print(f"correct: {world_size} ranks x {per_rank_batch} = {expected} samples per optimizer step")
    return True


def check_steps_per_epoch(answer, size: int = 10000, batch_size: int = 32, world_size: int = 2) -> bool:
    """Exercise 2: optimizer steps per epoch on each rank."""
    if _unanswered(answer, "a number of steps"):
        return False
    expected = steps_per_epoch(size, batch_size, world_size)
    assert answer == expected, (
        f"{answer} is not it. DistributedSampler gives each rank ceil({size}/{world_size}) indices; "
        f"the DataLoader cuts them into batches of {batch_size} (the last one may be smaller).")
    print(f"correct: ceil(ceil({size}/{world_size})/{batch_size}) = {expected} steps per epoch on every rank")
    return True


def check_node_command(command, node_rank: int = 1, nnodes: int = 2, nproc_per_node: int = 4,
                       endpoint: str = "gpu-node-0:29400") -> bool:
    """Exercise 3: the torchrun line for one node of a multi-node job (flag order does not matter;
    ``--node-rank`` may be left out, the c10d rendezvous ignores it)."""
    if _unanswered(answer=command, what="a torchrun command line (a string)"):
        return False
    given = _flags(shlex.split(command))
    want = _flags(torchrun_command(node_rank, nnodes, nproc_per_node, endpoint))
    assert shlex.split(command)[0] == "torchrun", "start the line with torchrun"
    for flag in ("--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint"):
        assert given.get(flag) == want[flag], (
            f"{flag} should be {want[flag]!r}, got {given.get(flag)!r}. "
            "Hint: compare with training.torchrun_commands(...) for another cluster.")
    assert given.get("--node-rank", want["--node-rank"]) == want["--node-rank"], (
        f"this is node {node_rank}: --node-rank {node_rank} (or leave it out: c10d assigns node ranks)")
    assert given.get("script") == "ddp_train.py", "the command should end with the script: ddp_train.py"
    print("correct: that node joins the c10d rendezvous and starts its ranks")
    return True


def _flags(argv: list[str]) -> dict[str, str]:
    """``{"--flag": value, "script": first positional}``; accepts ``--flag=value`` and underscores."""
    out, i = {}, 1
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            name = name.replace("_", "-")
            if not eq:
                i += 1
                value = argv[i] if i < len(argv) else ""
            out[name] = value
        elif "script" not in out:
            out["script"] = arg
        i += 1
    return out
