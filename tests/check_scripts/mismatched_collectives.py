"""mismatched-collectives: the ranks all-reduce tensors of different sizes."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
dist.all_reduce(torch.ones(2))
if dist.get_rank() == 0:
    dist.all_reduce(torch.ones(4))  # mistake
else:
    dist.all_reduce(torch.ones(8))  # mistake
dist.destroy_process_group()
