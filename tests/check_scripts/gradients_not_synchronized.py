"""gradients-not-synchronized: mp.spawn ranks train a model never wrapped in DDP."""
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def train(rank, world_size, port):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)  # the same model on every rank
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)  # each rank its own data
    for _step in range(3):
        x = torch.randn(16, 8, generator=g)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()  # mistake
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(train, args=(2, port), nprocs=2)
