"""padded-evaluation: 101 test samples over 2 ranks; the sampler repeats one, counted twice."""
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
test = TensorDataset(torch.randn(101, 8), torch.randint(0, 2, (101,)))
loader = DataLoader(test, batch_size=25, sampler=DistributedSampler(test, shuffle=False))
seen = torch.zeros(1)
with torch.no_grad():
    for _x, y in loader:  # mistake
        seen += len(y)
dist.all_reduce(seen)
print(f"rank {dist.get_rank()}: {int(seen.item())} samples evaluated")
dist.destroy_process_group()
