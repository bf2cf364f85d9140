"""hang: rank 0 waits in all_reduce while rank 1 waits for a message nobody sends."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4)
if dist.get_rank() == 0:
    dist.all_reduce(t)  # mistake
else:
    dist.recv(t, src=0)  # mistake
dist.destroy_process_group()
