"""The index math of ``torch.utils.data.distributed.DistributedSampler``, written out by hand.

Chapter 6 writes the same index math in its own cells (that is the lesson) and compares it with
torch there; this copy is the reference the exercise checks use, tested against torch in
``tests/test_teach_sampler.py``, so a checker never depends on the learner's code. Only the
random permutation is borrowed from torch (``torch.randperm`` seeded ``seed + epoch``).

The ``check_*`` functions are the chapter's exercise self-checks: they print ``correct`` or raise
an ``AssertionError`` whose message is a hint.
"""
from __future__ import annotations

import math
from collections import Counter

NONE, SEVERAL = -1, -2  # owner_matrix codes: an index no rank read / an index read more than once


def num_samples(n: int, world: int, drop_last: bool = False) -> int:
    """Samples per rank: ``ceil(n / world)`` (pad up), or ``floor(n / world)`` with ``drop_last``."""
    return n // world if drop_last else math.ceil(n / world)


def total_size(n: int, world: int, drop_last: bool = False) -> int:
    """Length of the global index list after padding or truncation: every rank gets an equal share."""
    return num_samples(n, world, drop_last) * world


def padding(n: int, world: int) -> int:
    """How many indices ``drop_last=False`` repeats so that the list divides evenly."""
    return total_size(n, world) - n


def dropped(n: int, world: int) -> int:
    """How many indices ``drop_last=True`` never hands to any rank (the tail of the order)."""
    return n - total_size(n, world, drop_last=True)


def epoch_order(n: int, seed: int = 0, epoch: int = 0, shuffle: bool = True) -> list[int]:
    """The dataset order of one epoch, identical on every rank because every rank seeds alike.

    The generator is seeded with ``seed + epoch``: ``set_epoch`` is what makes epochs differ, and
    ``(seed=0, epoch=1)`` gives the same order as ``(seed=1, epoch=0)``.
    """
    if not shuffle:
        return list(range(n))
    import torch

    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(n, generator=g).tolist()


def global_order(n: int, world: int, *, shuffle: bool = True, seed: int = 0, epoch: int = 0,
                 drop_last: bool = False) -> list[int]:
    """The epoch order cut or padded to ``total_size``: padding repeats the order from its start."""
    order = epoch_order(n, seed, epoch, shuffle)
    size = total_size(n, world, drop_last)
    if drop_last:
        return order[:size]
    repeats = math.ceil(size / n)  # more than one round only when n < world
    return (order * repeats)[:size]


def rank_indices(n: int, world: int, rank: int, *, shuffle: bool = True, seed: int = 0, epoch: int = 0,
                 drop_last: bool = False) -> list[int]:
    """What rank ``rank`` iterates: every ``world``-th entry of the global order, starting at ``rank``."""
    order = global_order(n, world, shuffle=shuffle, seed=seed, epoch=epoch, drop_last=drop_last)
    return order[rank::world]


def all_rank_indices(n: int, world: int, **kw) -> list[list[int]]:
    """``rank_indices`` for every rank, in rank order."""
    return [rank_indices(n, world, r, **kw) for r in range(world)]


def coverage(shards: list[list[int]], n: int) -> list[int]:
    """How many times each dataset index ``0..n-1`` appears across all ranks' shards."""
    seen = Counter(i for shard in shards for i in shard)
    return [seen[i] for i in range(n)]


def owner_matrix(epochs: list[list[list[int]]], n: int) -> list[list[int]]:
    """Per epoch and dataset index: the rank that read it, ``NONE`` or ``SEVERAL`` (padding repeat).

    ``epochs[e][r]`` is rank ``r``'s index list in epoch ``e``; the result feeds the chapter's plot.
    """
    rows = []
    for shards in epochs:
        owners: dict[int, set[int]] = {}
        for rank, shard in enumerate(shards):
            for i in shard:
                owners.setdefault(i, set()).add(rank)
        rows.append([NONE if i not in owners else (min(owners[i]) if len(owners[i]) == 1 else SEVERAL)
                     for i in range(n)])
    return rows


def merge_shards(shards: list[list[int]]) -> list[int]:
    """Interleave the ranks' shards back into the global order (the inverse of ``order[r::world]``)."""
    return [shard[p] for p in range(len(shards[0])) for shard in shards]


# ----------------------------------------------------------------------------- exercise checks


def check_rank_indices(answer, n: int, world: int, rank: int, seed: int = 0, epoch: int = 0,
                       shuffle: bool = True, drop_last: bool = False) -> bool:
    """Self-check: is ``answer`` the list of indices rank ``rank`` iterates in that epoch?"""
    kw = dict(shuffle=shuffle, seed=seed, epoch=epoch, drop_last=drop_last)
    if answer is None:
        print("No answer yet: replace None with a list of dataset indices.")
        return False
    answer = [int(i) for i in answer]
    want = rank_indices(n, world, rank, **kw)
    if answer == want:
        print("correct")
        return True
    assert len(answer) == len(want), (
        f"Every rank gets num_samples = {'floor' if drop_last else 'ceil'}(N / world) = {len(want)} indices, "
        f"you gave {len(answer)}.")
    for other in range(world):
        assert answer != rank_indices(n, world, other, **kw), (
            f"That is rank {other}'s share. Rank r takes global positions r, r + world, r + 2*world, ...")
    if shuffle:
        assert answer != rank_indices(n, world, rank, **{**kw, "epoch": 0}), (
            "That is epoch 0's order. The generator is seeded with seed + epoch, so set_epoch changes it.")
        assert answer != rank_indices(n, world, rank, **{**kw, "shuffle": False}), (
            "That is the unshuffled order; with shuffle=True start from torch.randperm(N) "
            "with a generator seeded seed + epoch.")
    raise AssertionError(
        "Not quite. Build the global order (a permutation of range(N) if shuffle, else range(N)), "
        "pad it by repeating its start (or cut its tail with drop_last) to world * num_samples, "
        "then take order[rank::world].")


def check_counts(answer, n: int, world: int, drop_last: bool) -> bool:
    """Self-check for ``answer = (per_rank, repeated, never_seen)`` of one sampler configuration."""
    if answer is None:
        print("No answer yet: replace None with a tuple (per_rank, repeated, never_seen).")
        return False
    per_rank, repeated, never = (int(x) for x in answer)
    want = (num_samples(n, world, drop_last), 0 if drop_last else padding(n, world),
            dropped(n, world) if drop_last else 0)
    assert per_rank == want[0], (
        f"per_rank: drop_last={drop_last} rounds N / world {'down' if drop_last else 'up'}.")
    assert repeated == want[1], (
        "repeated: padding fills world * per_rank - N slots with indices from the start of the order"
        if not drop_last else "repeated: drop_last never pads, so nothing repeats.")
    assert never == want[2], (
        "never_seen: drop_last cuts the order to world * per_rank, the rest is never read"
        if drop_last else "never_seen: without drop_last every index is read at least once.")
    print("correct")
    return True


def check_same_order(answer, seed: int, epoch: int, other_seed: int) -> bool:
    """Self-check: which epoch of a sampler seeded ``other_seed`` repeats ``(seed, epoch)``'s order?"""
    if answer is None:
        print("No answer yet: replace None with an epoch number.")
        return False
    want = seed + epoch - other_seed
    assert int(answer) == want, (
        "The sampler seeds its generator with seed + epoch; find the epoch that gives the same sum.")
    print("correct")
    return True


def check_join_lr(answer, lr: float, world: int, ranks_left: int) -> bool:
    """Self-check: the effective learning rate of an extra step under ``Join`` (default division).

    ``ranks_left`` ranks still train and all-reduce their gradients; the joined ranks add zeros, and
    DDP divides the sum by the *initial* world size. Against plain SGD on the mean gradient of the
    ranks still training, that is ``lr * ranks_left / world``.
    """
    if answer is None:
        print("No answer yet: replace None with a learning rate.")
        return False
    want = lr * ranks_left / world
    assert not math.isclose(float(answer), lr), (
        "That is what divide_by_initial_world_size=False gives. By default DDP divides by the initial world size, "
        "and the joined ranks contribute zeros.")
    assert math.isclose(float(answer), want, rel_tol=1e-9), (
        f"Not quite. The all-reduce adds {ranks_left} real gradient(s) and {world - ranks_left} zero(s), then divides "
        f"by {world}.")
    print(f"correct: {lr} x {ranks_left}/{world} = {want:g}: the extra steps move the weights "
          f"{world / ranks_left:g} times less than a plain step would")
    return True
