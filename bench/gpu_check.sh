#!/usr/bin/env bash
# GPU check (DESIGN.md §6). Run from anywhere on a machine with CUDA:   bash bench/gpu_check.sh
#
# Uses that machine's own torch; distlab is pure Python, so PYTHONPATH=src is enough (set below).
# Checks, one line each (PASS / FAIL, seconds), exit status 1 if any FAIL; it never skips:
#   (no GPU)           FAIL at once, exit status 1: this script verifies the GPU path or says it could not
#   nccl_world1        NCCL process group, world size 1: all_reduce, broadcast, barrier on cuda:0
#   gloo_cuda_world2   gloo with CUDA tensors, 2 ranks sharing cuda:0: collectives, then DDP training of the
#                      article's SimpleModel on cuda:0 equal to the single-process reference (chapter 7's claim)
#   toy_model_cuda     chapter 3's demo_basic (ToyModel, DDP, one SGD step) through distlab.spawn on cuda (NCCL)
#   ddp_train_cuda     chapter 7's ddp_train.py under torchrun, 1 rank: NCCL + cuda:0, parameters equal to the
#                      reference; interrupted after 1 epoch and resumed (map_location) == uninterrupted run
#   ddp_train_2ranks   `python ddp_train.py --world-size 2`: NCCL on 2 GPUs when there are 2, else gloo on CPU
#   chapters_cuda      every chapter, executed as the test suite does (solutions included), with
#                      DISTLAB_DEVICE=cuda: every rank on a GPU through gloo (all on cuda:0 with one GPU);
#                      needs nbclient, ipykernel, matplotlib, psutil, tqdm (and deepspeed for chapter 8).
#                      GPU-only branches it takes: chapter 11's TF32 cell (on cuda:0, "high" must move an fp32
#                      product >10x further from float64 than "highest" on compute capability >= 8.0) and its
#                      deterministic-mode cell (CUDA put_ refused, torch.empty NaN-filled); chapter 12's
#                      resumed run, whose dropout draws on the CUDA generator that AppState saves and restores
# The two-GPU NCCL path is only exercised when the machine has >= 2 GPUs. The whole script is meant to finish
# within 10 minutes on one GPU: GPU_CHECK_LIMIT_S bounds each check (240 s), GPU_CHECK_CHAPTERS_S the chapters
# (420 s). GPU_CHECK_ONLY=name[,name] runs only those checks.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=1
PY="${PYTHON:-python}"
LIMIT_S="${GPU_CHECK_LIMIT_S:-240}"
CHAPTERS_S="${GPU_CHECK_CHAPTERS_S:-420}"
ONLY="${GPU_CHECK_ONLY:-}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
failed=0

# Every snippet starts with this: distlab imports psutil at module level; checks that start no distlab
# launch can run on a machine without it.
cat > "$WORK/prelude.py" <<'EOF'
import importlib.util
import os
import socket
import sys
import types

if importlib.util.find_spec("psutil") is None:
    sys.modules["psutil"] = types.ModuleType("psutil")
import torch
import torch.distributed as dist


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
EOF

snippet() {  # snippet NAME: prelude + stdin -> $WORK/NAME.py
  { cat "$WORK/prelude.py"; cat; } > "$WORK/$1.py"
}

selected() {  # selected NAME: true unless GPU_CHECK_ONLY names other checks
  [[ -z "$ONLY" || ",$ONLY," == *",$1,"* ]]
}

run_check() {  # run_check NAME COMMAND...   (limit: $LIMIT_S, or $CHECK_LIMIT_S when set)
  local name=$1 start=$SECONDS
  shift
  selected "$name" || return 0
  if timeout "${CHECK_LIMIT_S:-$LIMIT_S}" "$@" > "$WORK/$name.log" 2>&1; then
    echo "PASS $name ($((SECONDS - start))s): $(tail -n 1 "$WORK/$name.log")"
  else
    echo "FAIL $name ($((SECONDS - start))s), last lines:"
    tail -n 25 "$WORK/$name.log" | sed 's/^/    /'
    failed=1
  fi
}

if ! "$PY" - <<'EOF'
import sys

import torch
print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}, GPUs: {torch.cuda.device_count()}",
      *(f"[{i}] {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())))
print("NCCL", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")
sys.exit(0 if torch.cuda.is_available() and torch.cuda.device_count() >= 1 else 1)
EOF
then
  echo "FAIL gpu_check: no CUDA device here (or no torch): nothing of the GPU path was verified"
  exit 1
fi

# --- 1. NCCL, world size 1 ----------------------------------------------------------------------
snippet nccl_world1 <<'EOF'
assert torch.cuda.is_available(), "no CUDA device"
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1)
t = torch.arange(4.0, device="cuda:0")
dist.all_reduce(t)
dist.broadcast(t, src=0)
dist.barrier()
assert t.is_cuda and t.tolist() == [0.0, 1.0, 2.0, 3.0]
dist.destroy_process_group()
print("nccl world size 1: all_reduce, broadcast, barrier on cuda:0")
EOF
run_check nccl_world1 "$PY" "$WORK/nccl_world1.py"

# --- 2. gloo with CUDA tensors, world size 2 on one GPU -------------------------------------------
snippet gloo_cuda_world2 <<'EOF'
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from distlab.teach import training
from distlab.teach.models import DummyDataset, SimpleModel

SIZE, BATCH, EPOCHS = 256, 16, 2


def rank_main(rank, world, out):
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dev = torch.device("cuda:0")  # both ranks share one GPU: fine for gloo, impossible for NCCL
    t = torch.full((3,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    assert t.is_cuda and t.tolist() == [3.0, 3.0, 3.0], t
    torch.manual_seed(0)
    model = DDP(SimpleModel().to(dev))
    data = DummyDataset(SIZE)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(EPOCHS):
        shard = training.rank_indices(SIZE, world, rank, epoch)
        for b in range(0, len(shard), BATCH):
            idx = shard[b:b + BATCH]
            opt.zero_grad()
            loss_fn(model(data.data[idx].to(dev)), data.targets[idx].to(dev)).backward()
            opt.step()
    if rank == 0:
        torch.save({k: v.cpu() for k, v in model.module.state_dict().items()}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    assert torch.cuda.is_available(), "no CUDA device"
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gloo_cuda.pt")
    mp.spawn(rank_main, args=(2, out), nprocs=2, join=True)
    ref = training.reference_train(SIZE, BATCH, world_size=2, epochs=EPOCHS)
    diff = training.max_abs_difference(torch.load(out), ref["model"])
    assert diff < 1e-5, f"DDP on cuda (gloo) vs CPU reference: {diff:.2e}"
    print(f"gloo + CUDA tensors, 2 ranks on cuda:0: all_reduce ok; DDP == reference, max diff {diff:.1e}")
EOF
run_check gloo_cuda_world2 "$PY" "$WORK/gloo_cuda_world2.py"

# --- 3. Chapter 3's ToyModel code on cuda, through distlab ----------------------------------------
snippet toy_model_cuda <<'EOF'
import importlib.util as _u

missing = [m for m in ("psutil", "tqdm") if _u.find_spec(m) is None]
assert not missing, f"distlab's launcher needs {missing}: pip install {' '.join(missing)}"
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

import distlab


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(rank, world_size):
    print(f"Running basic DDP example on rank {rank}.")
    dist.init_process_group(distlab.backend(world_size), rank=rank, world_size=world_size)
    device = distlab.device(rank)
    model = ToyModel().to(device)
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10, device=device))
    labels = torch.randn(20, 5).to(device)
    loss_fn(outputs, labels).backward()
    optimizer.step()
    backend = dist.get_backend()
    dist.destroy_process_group()
    print(f"Finished running basic DDP example on rank {rank}.")
    return {"device": str(device), "backend": backend}


if __name__ == "__main__":
    res = distlab.spawn(demo_basic, args=(1,), nprocs=1, timeout=120)
    assert res.returns[0] == {"device": "cuda:0", "backend": "nccl"}, res.returns
    assert "Finished running basic DDP example on rank 0." in res.logs[0]
    print(f"ToyModel demo_basic via distlab.spawn: {res.returns[0]}")
EOF
run_check toy_model_cuda "$PY" "$WORK/toy_model_cuda.py"

# --- 4. Chapter 7's ddp_train.py under torchrun on cuda -------------------------------------------
snippet ddp_train_cuda <<'EOF'
import subprocess

from distlab.teach import training

SIZE, BATCH = 512, 32
work = os.path.dirname(os.path.abspath(__file__))
script = training.write_ddp_train(work)
env = {k: v for k, v in os.environ.items() if k not in training.LAUNCHER_VARS}


def torchrun(epochs, ckpt):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", str(script), "--epochs",
           str(epochs), "--size", str(SIZE), "--batch-size", str(BATCH), "--checkpoint", ckpt]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


assert torch.cuda.is_available(), "no CUDA device"
full, part = os.path.join(work, "full.pt"), os.path.join(work, "part.pt")
log = torchrun(2, full)
state = torch.load(full, weights_only=True)  # no map_location: tensors come back where they were saved
assert all(v.is_cuda for v in state["model"].values()), "ddp_train.py did not train on cuda"
ref = training.reference_train(SIZE, BATCH, world_size=1, epochs=2)
diff = training.max_abs_difference(state["model"], ref["model"])
assert diff < 1e-5, f"cuda run vs CPU reference: {diff:.2e}"
torchrun(1, part)   # interrupted after 1 epoch ...
torchrun(2, part)   # ... and resumed: every rank loads with map_location
resumed = torch.load(part, weights_only=True)
assert resumed["epoch"] == 2 and training.states_equal(resumed["model"], state["model"])
rate = [line for line in log.splitlines() if "samples/s" in line]
print(f"ddp_train.py on cuda (NCCL, 1 rank): == reference (max diff {diff:.1e}); resume == uninterrupted; {rate}")
EOF
run_check ddp_train_cuda "$PY" "$WORK/ddp_train_cuda.py"

# --- 5. `python ddp_train.py --world-size 2` ------------------------------------------------------
snippet ddp_train_2ranks <<'EOF'
import subprocess

from distlab.teach import training

work = os.path.dirname(os.path.abspath(__file__))
script = training.write_ddp_train(work)
env = {k: v for k, v in os.environ.items() if k not in training.LAUNCHER_VARS}
ckpt = os.path.join(work, "two.pt")
out = subprocess.run([sys.executable, str(script), "--world-size", "2", "--epochs", "2", "--size", "512",
                      "--checkpoint", ckpt], env=env, capture_output=True, text=True, timeout=180)
assert out.returncode == 0, out.stdout + out.stderr
sums = training.checksums_in(out.stdout)
assert sums.keys() == {0, 1} and sums[0] == sums[1], sums
state = torch.load(ckpt, weights_only=True)
on = "cuda (NCCL, 2 GPUs)" if next(iter(state["model"].values())).is_cuda else "cpu (gloo: fewer than 2 GPUs)"
diff = training.max_abs_difference(state["model"], training.reference_train(512, 32, 2, 2)["model"])
assert diff < 1e-5, diff
print(f"python ddp_train.py --world-size 2 trained on {on}; == reference, max diff {diff:.1e}")
EOF
run_check ddp_train_2ranks "$PY" "$WORK/ddp_train_2ranks.py"

# --- 6. Every chapter on the GPU, through gloo (DISTLAB_DEVICE=cuda) ------------------------------------
DISTLAB_DEVICE=cuda MPLBACKEND=Agg CHECK_LIMIT_S="$CHAPTERS_S" run_check chapters_cuda "$PY" bench/gpu_chapters.py

exit "$failed"
