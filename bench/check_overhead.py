"""What ``distlab.check`` adds to a training script's run: the same script, plain and checked, on 2 ranks.

The script (written to a private work folder) is a torchrun-style DDP training of a small MLP:
DistributedSampler, set_epoch, an optimizer step per batch, rank 0 saving a checkpoint each
epoch, so every hook of the check fires on every step. Plain runs (``distlab.run_script``) and
checked runs (``distlab.check``) alternate in this process, after one warm-up of each; the best
of each is compared, two ways:

- training: the time rank 0 measures itself, from the barrier after ``init_process_group`` to its
  last step, checked / plain; the issue's bound: at most 1.2;
- wall: the whole call, start of the ranks and the check's reading of events included.

"checked" starts fresh interpreters, as the plain run does (``DISTLAB_START=spawn``); "forked" is a
check as it runs in a notebook, its ranks forked from distlab's torch-preloaded server (faster to
start than the plain run: its wall ratio is below 1).

    python bench/check_overhead.py            # about a minute on 2 busy cores
    python bench/check_overhead.py --quick    # 2 rounds

Last line: ``ratio: X`` = checked / plain training time, both on fresh interpreters.
"""
from __future__ import annotations

import argparse
import os
import re
import time

import distlab

SCRIPT = '''
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
dist.barrier()  # both ranks started: the clock measures training, not a rank's start
start = time.perf_counter()
torch.manual_seed(0)
data = TensorDataset(torch.randn(4096, 64), torch.randn(4096, 1))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=32, sampler=sampler)
model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(EPOCHS):
    sampler.set_epoch(epoch)
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), sys.argv[1])
    dist.barrier()
print(f"own_s={time.perf_counter() - start:.4f}", flush=True)
dist.destroy_process_group()
'''


def own_seconds(logs: str) -> float:
    return float(re.findall(r"own_s=([0-9.]+)", logs)[-1])


def plain(path, checkpoint) -> tuple[float, float]:
    t = time.perf_counter()
    result = distlab.run_script(path, 2, [checkpoint], view=None)
    return own_seconds(result.logs[0]), time.perf_counter() - t


def checked(path, checkpoint, start: str = "spawn") -> tuple[float, float]:
    """``start="spawn"``: fresh interpreters, as the plain run's ranks (the comparison); "forkserver":
    forked from distlab's server, as a check in a notebook runs."""
    os.environ["DISTLAB_START"] = start
    try:
        t = time.perf_counter()
        report = distlab.check(path, 2, [checkpoint])
    finally:
        del os.environ["DISTLAB_START"]
    assert report.ok, report.text()
    return own_seconds(report.result.logs[0]), time.perf_counter() - t


def forked(path, checkpoint) -> tuple[float, float]:
    return checked(path, checkpoint, "forkserver")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--epochs", type=int, default=8)
    ns = parser.parse_args()
    folder = distlab.work_folder("check-bench-")
    path, checkpoint = folder / "train.py", str(folder / "model.pt")
    path.write_text(SCRIPT.replace("EPOCHS", str(ns.epochs)))
    rounds = 2 if ns.quick else 4
    runs = {"plain": [], "checked": [], "forked": []}
    for n in range(rounds + 1):  # round 0 warms both up and is not counted
        for name, run in (("plain", plain), ("checked", checked), ("forked", forked)):
            own, wall = run(path, checkpoint)
            print(f"round {n} {name:8s} own {own:6.2f} s  wall {wall:6.2f} s", flush=True)
            if n:
                runs[name].append((own, wall))
    best = {name: (min(o for o, _ in r), min(w for _, w in r)) for name, r in runs.items()}
    for name in ("checked", "forked"):
        print(f"{name}: training {best[name][0]:.3f} s / plain {best['plain'][0]:.3f} s = "
              f"{best[name][0] / best['plain'][0]:.3f}; wall {best[name][1]:.2f} s / plain "
              f"{best['plain'][1]:.2f} s = {best[name][1] / best['plain'][1]:.3f}")
    print(f"ratio: {best['checked'][0] / best['plain'][0]:.3f}")


if __name__ == "__main__":
    main()
