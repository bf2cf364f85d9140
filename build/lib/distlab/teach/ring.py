"""Reference copy of chapter 5's hand-written ring all-reduce (``bench/allreduce.py`` and the tests use it).

The chapter defines this same code in its own cells: that is what a learner reads and runs.
``tests/test_teach_collectives.py`` checks that every definition below is identical to the chapter's
(compared as syntax trees), so the benchmarked ring is the ring the book teaches.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

CHUNK_BYTES = 1 << 20  # pipelining grain: big enough that Python's per-call cost is noise


class Ring:
    """This rank's place in the ring: who is left and right, and a tag for every message."""

    def __init__(self, group, rank, n, step, chunks):
        to_global = (lambda i: i) if group is None else (lambda i: dist.get_global_rank(group, i))
        self.group, self.rank, self.n, self.step, self.chunks = group, rank, n, step, chunks
        self.right, self.left = to_global((rank + 1) % n), to_global((rank - 1) % n)

    def tag(self, phase, step, chunk):
        """gloo matches messages by tag: a unique one per (phase, step, chunk). NCCL ignores tags, but
        every rank posts its sends and receives in the same order, so they would pair up there too."""
        return (phase * self.n + step) * self.chunks + chunk

    def send(self, chunk, phase, step, j):
        return dist.isend(chunk, self.right, group=self.group, tag=self.tag(phase, step, j))

    def recv(self, chunk, phase, step, j):
        return dist.irecv(chunk, self.left, group=self.group, tag=self.tag(phase, step, j))


SERIAL_NUMEL = 16384  # below torch's parallel grain (32768 elements): an add_ this size stays on one thread


def add_on_this_thread(dst, src):
    """dst += src without waking torch's OpenMP thread team (on CPU)."""
    if dst.device.type != "cpu" or dst.numel() <= SERIAL_NUMEL or torch.get_num_threads() == 1:
        dst.add_(src)
        return
    for d, s in zip(dst.split(SERIAL_NUMEL), src.split(SERIAL_NUMEL), strict=True):
        d.add_(s)


def reduce_scatter_phase(ring, segs, like):
    """n-1 steps: send a segment right, add the one arriving from the left, forward it as soon as it is added."""
    r, n = ring.rank, ring.n
    size = max(sum(c.numel() for c in s) for s in segs)
    scratch = [torch.empty(size, dtype=like.dtype, device=like.device) for _ in range(2 if n > 2 else 1)]

    def post_recvs(s):  # receives land in two alternating scratch buffers, one step's posted ahead
        bufs = scratch[s % len(scratch)][: sum(c.numel() for c in segs[(r - s - 1) % n])].split(ring.step)
        return bufs, [ring.recv(b, 0, s, j) for j, b in enumerate(bufs)]

    sends = [ring.send(c, 0, 0, j) for j, c in enumerate(segs[r])]
    pending = post_recvs(0)
    for s in range(n - 1):
        bufs, recvs = pending
        if s + 1 < n - 1:
            pending = post_recvs(s + 1)
        target = segs[(r - s - 1) % n]
        for j, work in enumerate(recvs):
            work.wait()
            add_on_this_thread(target[j], bufs[j])
            if s + 1 < n - 1:
                sends.append(ring.send(target[j], 0, s + 1, j))
    for work in sends:
        work.wait()


def all_gather_phase(ring, segs):
    """n-1 steps: finished chunks are received straight into place and forwarded on arrival."""
    r, n = ring.rank, ring.n
    recvs = [[ring.recv(c, 1, s, j) for j, c in enumerate(segs[(r - s) % n])] for s in range(n - 1)]
    sends = [ring.send(c, 1, 0, j) for j, c in enumerate(segs[(r + 1) % n])]
    for s in range(n - 1):
        for j, work in enumerate(recvs[s]):
            work.wait()
            if s + 1 < n - 1:
                sends.append(ring.send(segs[(r - s) % n][j], 1, s + 1, j))
    for work in sends:
        work.wait()


def prepare_ring(tensor, group, chunk_bytes):
    """This rank's place in the ring, and the tensor as n segments of chunks (views, no copies)."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    if n == 1:
        return None, None
    if not tensor.is_contiguous():
        raise ValueError("ring_all_reduce needs a contiguous tensor (call .contiguous() first)")
    step = max(1, chunk_bytes // tensor.element_size())
    segs = [s.split(step) for s in torch.tensor_split(tensor.view(-1), n)]
    return Ring(group, r, n, step, max(len(c) for c in segs)), segs


def ring_all_reduce(tensor, group=None, chunk_bytes=CHUNK_BYTES):
    """Sum ``tensor`` over the ranks of ``group``, in place: a reduce-scatter, then an all-gather."""
    ring, segs = prepare_ring(tensor, group, chunk_bytes)
    if ring is not None:
        reduce_scatter_phase(ring, segs, tensor)
        all_gather_phase(ring, segs)
    return tensor


def ring_reduce_scatter(tensor, group=None, chunk_bytes=CHUNK_BYTES):
    """Only the first phase; returns the index of the segment this rank now owns, fully summed."""
    ring, segs = prepare_ring(tensor, group, chunk_bytes)
    if ring is None:
        return 0
    reduce_scatter_phase(ring, segs, tensor)
    return (ring.rank + 1) % ring.n
