"""set-epoch-missing: a shuffling DistributedSampler and no set_epoch."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data))
model = DDP(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _epoch in range(3):
    for x, y in loader:  # mistake
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
dist.destroy_process_group()
