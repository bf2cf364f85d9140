"""accumulation-without-no-sync: 4 micro-batches per step, each backward all-reduces."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ACCUMULATE = 4
for _step in range(3):
    opt.zero_grad()
    for _micro in range(ACCUMULATE):
        loss = model(torch.randn(8, 8)).pow(2).mean() / ACCUMULATE
        loss.backward()  # mistake
    opt.step()
dist.destroy_process_group()
