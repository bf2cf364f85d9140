"""distlab.teach.sampler against torch's DistributedSampler, and the chapter's exercise checks.

No processes are launched: DistributedSampler takes num_replicas and rank explicitly.
"""
import itertools

import pytest
from torch.utils.data.distributed import DistributedSampler

from distlab.teach import sampler as S


def torch_indices(n, world, rank, shuffle=True, seed=0, epoch=0, drop_last=False):
    s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed,
                           drop_last=drop_last)
    s.set_epoch(epoch)
    return list(s)


GRID = list(itertools.product([1, 2, 3, 7, 10, 11, 16], [1, 2, 3, 4, 8], [True, False], [False, True]))


@pytest.mark.parametrize("n,world,shuffle,drop_last", GRID)
def test_reference_matches_torch_for_every_rank(n, world, shuffle, drop_last):
    for seed, epoch in [(0, 0), (0, 3), (42, 1)]:
        for rank in range(world):
            kw = dict(shuffle=shuffle, seed=seed, epoch=epoch, drop_last=drop_last)
            assert S.rank_indices(n, world, rank, **kw) == torch_indices(n, world, rank, **kw)


@pytest.mark.parametrize("n,world", [(10, 3), (11, 2), (3, 8), (12, 4)])
def test_padding_covers_everything_with_exactly_padding_repeats(n, world):
    shards = S.all_rank_indices(n, world, seed=1)
    counts = S.coverage(shards, n)
    assert min(counts) >= 1
    assert sum(counts) - n == S.padding(n, world) == S.total_size(n, world) - n
    assert {len(s) for s in shards} == {S.num_samples(n, world)}


@pytest.mark.parametrize("n,world", [(10, 3), (11, 2), (12, 4)])
def test_drop_last_reads_each_index_at_most_once_and_skips_dropped(n, world):
    shards = S.all_rank_indices(n, world, seed=1, drop_last=True)
    counts = S.coverage(shards, n)
    assert max(counts) == 1
    assert counts.count(0) == S.dropped(n, world) == n % world


def test_seed_plus_epoch_is_what_matters():
    assert S.epoch_order(9, seed=0, epoch=1) == S.epoch_order(9, seed=1, epoch=0)
    assert S.epoch_order(9, seed=0, epoch=0) != S.epoch_order(9, seed=0, epoch=1)


def test_merge_shards_inverts_the_split():
    order = S.global_order(11, 3, seed=2, epoch=4)
    assert S.merge_shards(S.all_rank_indices(11, 3, seed=2, epoch=4)) == order


def test_owner_matrix_codes():
    epochs = [[[0, 2], [1, 0]], [[3], [1]]]
    assert S.owner_matrix(epochs, 4) == [[S.SEVERAL, 1, 0, S.NONE], [S.NONE, 1, S.NONE, 0]]


def test_check_rank_indices_accepts_right_and_hints_wrong(capsys):
    kw = dict(n=10, world=4, rank=3, seed=7, epoch=2)
    assert S.check_rank_indices(torch_indices(10, 4, 3, seed=7, epoch=2), **kw)
    assert "correct" in capsys.readouterr().out
    assert S.check_rank_indices(None, **kw) is False
    with pytest.raises(AssertionError, match="rank 1's share"):
        S.check_rank_indices(torch_indices(10, 4, 1, seed=7, epoch=2), **kw)
    with pytest.raises(AssertionError, match="epoch 0"):
        S.check_rank_indices(torch_indices(10, 4, 3, seed=7, epoch=0), **kw)
    with pytest.raises(AssertionError, match="ceil"):
        S.check_rank_indices([1, 2], **kw)


def test_check_counts():
    assert S.check_counts((4, 2, 0), 10, 3, drop_last=False)
    assert S.check_counts((3, 0, 1), 10, 3, drop_last=True)
    with pytest.raises(AssertionError, match="rounds N / world up"):
        S.check_counts((3, 2, 0), 10, 3, drop_last=False)
    with pytest.raises(AssertionError, match="never_seen"):
        S.check_counts((3, 0, 0), 10, 3, drop_last=True)


def test_check_same_order():
    assert S.check_same_order(2, seed=3, epoch=4, other_seed=5)
    with pytest.raises(AssertionError, match="seed \\+ epoch"):
        S.check_same_order(4, seed=3, epoch=4, other_seed=5)


def test_rank_maps_draws_one_panel_per_matrix_with_legend():
    from distlab.plots.sampler import rank_maps

    m = S.owner_matrix([S.all_rank_indices(7, 2, epoch=e) for e in range(3)], 7)
    fig = rank_maps({"a": m, "b": m[:1]}, world=2)
    axes = fig.get_axes()
    assert len(axes) == 2 and axes[1].get_xlabel() == "dataset index"
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["rank 0", "rank 1", "several ranks (padding)"]


def test_check_join_lr():
    assert S.check_join_lr(None, lr=0.1, world=2, ranks_left=1) is False
    assert S.check_join_lr(0.05, lr=0.1, world=2, ranks_left=1) is True
    assert S.check_join_lr(0.15, lr=0.2, world=4, ranks_left=3) is True
    with pytest.raises(AssertionError, match="divide_by_initial_world_size=False"):
        S.check_join_lr(0.1, lr=0.1, world=2, ranks_left=1)
    with pytest.raises(AssertionError, match="1 real gradient"):
        S.check_join_lr(0.025, lr=0.1, world=2, ranks_left=1)


# --- the exercise checks word for word (issue #60: a learner reads every one of these) --------------------------

def raised(check, *args, **kw) -> str:
    with pytest.raises(AssertionError) as caught:
        check(*args, **kw)
    return str(caught.value)


def test_check_rank_indices_word_for_word(capsys):
    kw = dict(n=10, world=4, rank=3, seed=7, epoch=2)
    assert S.check_rank_indices(None, **kw) is False
    assert capsys.readouterr().out == "No answer yet: replace None with a list of dataset indices.\n"
    assert S.check_rank_indices([str(i) for i in S.rank_indices(10, 4, 3, seed=7, epoch=2)], **kw) is True
    assert capsys.readouterr().out == "correct\n"
    assert raised(S.check_rank_indices, [1, 2], **kw) == (
        "Every rank gets num_samples = ceil(N / world) = 3 indices, you gave 2.")
    assert raised(S.check_rank_indices, [1], **{**kw, "n": 9, "drop_last": True}) == (
        "Every rank gets num_samples = floor(N / world) = 2 indices, you gave 1.")
    assert raised(S.check_rank_indices, S.rank_indices(10, 4, 0, seed=7, epoch=2), **kw) == (
        "That is rank 0's share. Rank r takes global positions r, r + world, r + 2*world, ...")
    assert raised(S.check_rank_indices, S.rank_indices(10, 4, 3, seed=7, epoch=0), **kw) == (
        "That is epoch 0's order. The generator is seeded with seed + epoch, so set_epoch changes it.")
    assert raised(S.check_rank_indices, S.rank_indices(10, 4, 3, shuffle=False), **kw) == (
        "That is the unshuffled order; with shuffle=True start from torch.randperm(N) with a generator seeded "
        "seed + epoch.")
    wrong = list(reversed(S.rank_indices(10, 4, 3, seed=7, epoch=2)))
    hint = ("Not quite. Build the global order (a permutation of range(N) if shuffle, else range(N)), pad it by "
            "repeating its start (or cut its tail with drop_last) to world * num_samples, then take "
            "order[rank::world].")
    assert raised(S.check_rank_indices, wrong, **kw) == hint
    plain = dict(n=10, world=4, rank=3, shuffle=False)  # unshuffled: no epoch or order hint applies
    assert raised(S.check_rank_indices, [9, 1, 3], **plain) == hint


def test_check_counts_word_for_word(capsys):
    assert S.check_counts(None, 10, 3, drop_last=False) is False
    assert capsys.readouterr().out == "No answer yet: replace None with a tuple (per_rank, repeated, never_seen).\n"
    assert S.check_counts(("4", 2.0, 0), 10, 3, drop_last=False) is True and capsys.readouterr().out == "correct\n"
    assert raised(S.check_counts, (3, 2, 0), 10, 3, drop_last=False) == "per_rank: drop_last=False rounds N / world up."
    assert raised(S.check_counts, (4, 0, 1), 10, 3, drop_last=True) == "per_rank: drop_last=True rounds N / world down."
    assert raised(S.check_counts, (4, 1, 0), 10, 3, drop_last=False) == (
        "repeated: padding fills world * per_rank - N slots with indices from the start of the order")
    assert raised(S.check_counts, (3, 2, 1), 10, 3, drop_last=True) == (
        "repeated: drop_last never pads, so nothing repeats.")
    assert raised(S.check_counts, (3, 0, 0), 10, 3, drop_last=True) == (
        "never_seen: drop_last cuts the order to world * per_rank, the rest is never read")
    assert raised(S.check_counts, (4, 2, 1), 10, 3, drop_last=False) == (
        "never_seen: without drop_last every index is read at least once.")


def test_check_same_order_and_join_lr_word_for_word(capsys):
    assert S.check_same_order(None, seed=3, epoch=4, other_seed=5) is False
    assert capsys.readouterr().out == "No answer yet: replace None with an epoch number.\n"
    assert S.check_same_order("2", seed=3, epoch=4, other_seed=5) is True and capsys.readouterr().out == "correct\n"
    assert raised(S.check_same_order, 2, seed=3, epoch=4, other_seed=4) == (
        "The sampler seeds its generator with seed + epoch; find the epoch that gives the same sum.")
    assert S.check_same_order(3, seed=3, epoch=4, other_seed=4) is True  # 3 + 4 - 4
    capsys.readouterr()
    assert S.check_join_lr(None, lr=0.1, world=2, ranks_left=1) is False
    assert capsys.readouterr().out == "No answer yet: replace None with a learning rate.\n"
    assert S.check_join_lr("0.15", lr=0.2, world=4, ranks_left=3) is True
    assert capsys.readouterr().out == (
        "correct: 0.2 x 3/4 = 0.15: the extra steps move the weights 1.33333 times less than a plain step would\n")
    assert raised(S.check_join_lr, 0.2, lr=0.2, world=4, ranks_left=3) == (
        "That is what divide_by_initial_world_size=False gives. By default DDP divides by the initial world size, "
        "and the joined ranks contribute zeros.")
    assert raised(S.check_join_lr, 0.15 * (1 + 1e-8), lr=0.2, world=4, ranks_left=3) == (
        "Not quite. The all-reduce adds 3 real gradient(s) and 1 zero(s), then divides by 4.")
    assert S.check_join_lr(0.15 * (1 + 1e-10), lr=0.2, world=4, ranks_left=3) is True


def test_the_defaults_are_torchs_a_sampler_made_without_a_seed_or_an_epoch():
    sampler = DistributedSampler(range(10), num_replicas=4, rank=1)  # seed=0, and no set_epoch: epoch 0
    assert S.rank_indices(10, 4, 1) == list(sampler)
    assert S.global_order(10, 4)[1::4] == list(sampler) and S.epoch_order(10) == S.epoch_order(10, 0, 0)


def test_check_rank_indices_defaults_and_an_unshuffled_answer(capsys):
    assert S.check_rank_indices(S.rank_indices(10, 4, 3), n=10, world=4, rank=3) is True  # seed 0, epoch 0
    assert S.check_rank_indices([3, 7, 1], n=10, world=4, rank=3, shuffle=False) is True
    assert capsys.readouterr().out == "correct\ncorrect\n"
