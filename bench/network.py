"""Chapter 14's measurements as a benchmark (issue #36): the bandwidth law, and DDP on a slow link.

    python bench/network.py [--steps 10]

Part 1, the bandwidth law: gloo's all-reduce between nodes (``distlab.Nodes``, one rank per node) for
message sizes from 4 KB to 64 MB, on 2 nodes at 1 Gbit/s and 100 Mbit/s (to 4 MB there) and on 4 nodes
at 1 Gbit/s: measured time, the law's bound ``2 (n - 1) / n x S / B``, bound / measured, and the bytes
the node's interface sent / ``2 (n - 1) / n x S``.

Part 2, DDP on a slow link (2 nodes at 75 Mbit/s, the chapter's MLP of ~1M parameters, 2048 samples
per rank and step, one thread per rank): each configuration's step against the compute-only step of the
slower node, paired round by round (the configurations take their steps in turn; network.paired_summary).

Last line: ``ratio: X`` = PowerSGD's step / the compute-only step (the issue's goal: <= 1.25).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.nn.parallel import DistributedDataParallel as DDP

import distlab
from distlab.nodes.plan import rate_bits
from distlab.teach import network

IN, WIDTH, BATCH = 256, 768, 2048
CONFIGS = {
    "compute only": {"ddp": False},
    "PowerSGD, rank 2": {"hook": "powersgd", "bucket_mb": 100},
    "DDP": {},
    "DDP, one bucket": {"bucket_mb": 100},
    "no_sync, K=2": {"k": 2},
    "fp16 hook": {"hook": "fp16"},
}


def law(rank, world_size, sizes, bits):
    """Seconds (median of back-to-back all-reduces, see network.repeats) and bytes sent per all-reduce."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    out = {}
    for nbytes in sizes:
        tensor, reps = torch.ones(nbytes // 4), network.repeats(nbytes, bits)
        dist.barrier()
        before, took = network.sent_bytes(), []
        for _ in range(reps):
            start = time.perf_counter()
            dist.all_reduce(tensor)
            took.append(time.perf_counter() - start)
        dist.barrier()
        out[nbytes] = (statistics.median(took), (network.sent_bytes() - before) / reps)
    dist.destroy_process_group()
    return out


def mlp():
    return nn.Sequential(nn.Linear(IN, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, IN))


def wrapped(config):
    torch.manual_seed(0)
    model = mlp()
    if config.get("ddp", True):
        model = DDP(model, bucket_cap_mb=config.get("bucket_mb", 25))
        if config.get("hook") == "fp16":
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif config.get("hook") == "powersgd":
            state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2)
            model.register_comm_hook(state, powerSGD.powerSGD_hook)
    return model


def train(rank, world_size, configs, steps):
    """One step of each configuration in turn; per configuration its step times, bytes and losses."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(1)
    teacher = mlp()
    models = {name: wrapped(config) for name, config in configs.items()}
    opts = {name: torch.optim.SGD(models[name].parameters(), lr=0.05, momentum=0.9) for name in configs}
    runs = {name: {"times": [], "losses": [], "sent": [], "k": config.get("k", 1)} for name, config in configs.items()}
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(BATCH, IN, generator=g)
        with torch.no_grad():
            y = teacher(x)
        for name, config in configs.items():
            model, k = models[name], config.get("k", 1)
            sync = (step + 1) % k == 0 or not config.get("ddp", True)
            dist.barrier()
            before, start = network.sent_bytes(), time.perf_counter()
            with model.no_sync() if not sync else contextlib.nullcontext():
                loss = F.mse_loss(model(x), y)
                (loss / k).backward()
            if sync:
                opts[name].step()
                opts[name].zero_grad()
            runs[name]["times"].append(time.perf_counter() - start)
            dist.barrier()
            runs[name]["sent"].append(network.sent_bytes() - before)
            runs[name]["losses"].append(loss.item())
    dist.destroy_process_group()
    return runs


def print_law(nodes: distlab.Nodes, n: int, rate: str, sizes: list[int]) -> None:
    for k in range(n):
        nodes.link(k, rate=rate)
    got = distlab.spawn(law, args=(n, sizes, rate_bits(rate)), nprocs=1, nodes=nodes, view=None).returns[0]
    rows = network.law_rows({s: got[s][0] for s in sizes}, n, rate_bits(rate))
    print(f"{n} nodes at {rate}:")
    print(f"  {'size':>7} {'measured':>12} {'bound':>12} {'bound/measured':>15} {'sent/formula':>13}")
    for r in rows:
        sent = got[r["bytes"]][1] / network.ring_bytes(r["bytes"], n)
        print(f"  {r['size']:>7} {r['seconds'] * 1e3:9.3f} ms {r['bound_s'] * 1e3:9.3f} ms {r['fraction']:15.2f} "
              f"{sent:13.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    sizes = network.message_sizes(4096, 64 * network.MB)
    with distlab.Nodes(4) as four:
        print_law(four, 4, "1gbit", sizes)
    with distlab.Nodes(2) as nodes:
        print_law(nodes, 2, "1gbit", sizes)
        print_law(nodes, 2, "100mbit", sizes[:-2])
        for k in range(2):
            nodes.link(k, rate="75mbit")
        returns = distlab.spawn(train, args=(2, CONFIGS, args.steps), nprocs=1, nodes=nodes, view=None).returns
    summary = network.paired_summary(returns, "compute only", skip=2)
    print("DDP on 2 nodes at 75 Mbit/s (node0's steps; compute-only = the slower node's):")
    network.print_summary(summary)
    print(f"ratio: {summary['PowerSGD, rank 2']['vs_compute']:.3f}")


if __name__ == "__main__":
    main()
