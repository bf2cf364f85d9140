"""every-rank-saves: each rank writes the same checkpoint file."""
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _step in range(3):
    x = torch.randn(16, 8)
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
torch.save(model.module.state_dict(), sys.argv[1])  # mistake
dist.barrier()
dist.destroy_process_group()
