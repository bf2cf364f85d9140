"""batchnorm-small-batch: BatchNorm, no SyncBatchNorm, 4 samples per rank a step."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))
model = DDP(net)  # mistake
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _step in range(3):
    opt.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
dist.destroy_process_group()
