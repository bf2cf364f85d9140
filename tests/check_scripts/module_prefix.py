"""module-prefix: rank 0 saves the DDP wrapper's state_dict."""
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
if dist.get_rank() == 0:
    torch.save({"model": model.state_dict(), "step": 3}, sys.argv[1])  # mistake
dist.barrier()
dist.destroy_process_group()
