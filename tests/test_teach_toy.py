"""distlab.teach.toy, chapter 3's checks of what DDP promises: pure, no processes (in the mutation run's selection).

The snapshots and differences the chapter's asserts compare, and its exercises' self-checks word for word.
"""
import pytest
import torch

from distlab.teach import toy as ch3
from distlab.teach.models import ToyModel


def test_snapshot_is_a_copy():
    model = ToyModel()
    snap = ch3.snapshot(model)
    with torch.no_grad():
        model.net1.weight += 1
    assert ch3.max_abs_diff(snap, ch3.snapshot(model)) == pytest.approx(1.0)


def test_max_abs_diff_average_and_drift():
    a, b = {"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, 2.0])}
    assert ch3.max_abs_diff(a, b) == 2.0
    assert ch3.average([a, b])["w"].tolist() == [2.0, 2.0]
    with pytest.raises(KeyError):
        ch3.max_abs_diff(a, {"v": torch.zeros(2)})
    assert ch3.drift({0: [a, a], 1: [a, b]}) == [0.0, 2.0]


def test_check_diverged(capsys):
    same = ch3.snapshot(ToyModel())
    with pytest.raises(AssertionError, match="still identical"):
        ch3.check_diverged({0: same, 1: same})
    with pytest.raises(AssertionError, match="every rank"):
        ch3.check_diverged({0: same, 1: None})
    ch3.check_diverged({0: same, 1: ch3.snapshot(ToyModel())})
    assert capsys.readouterr().out.startswith("correct")


def test_check_why_identical(capsys):
    ch3.check_why_identical(" B ")
    assert capsys.readouterr().out.startswith("correct")
    for wrong, hint in [("a", "once"), ("c", "different slice"), ("d", "backward"), ("z", "Choose one")]:
        with pytest.raises(AssertionError, match=hint):
            ch3.check_why_identical(wrong)



def test_check_buffers_to_save(capsys):
    ch3.check_buffers_to_save(" B")
    assert capsys.readouterr().out.startswith("correct")
    for wrong, hint in [("a", "differs from rank 0's"), ("c", "does not average"), ("x", "Choose one")]:
        with pytest.raises(AssertionError, match=hint):
            ch3.check_buffers_to_save(wrong)



# --- word for word, and the edges (issue #60) --------------------------------------------------

def raised(check, *args, **kwargs) -> str:
    with pytest.raises(AssertionError) as caught:
        check(*args, **kwargs)
    return str(caught.value)


def test_snapshot_names_every_parameter_and_detaches_it():
    model = ToyModel()
    snap = ch3.snapshot(model)
    assert list(snap) == [name for name, _ in model.named_parameters()]
    assert all(not t.requires_grad and t.device.type == "cpu" for t in snap.values())
    assert all(torch.equal(snap[name], p) for name, p in model.named_parameters())


def test_max_abs_diff_compares_in_float_and_takes_the_largest_over_names():
    a = {"w": torch.tensor([1, 2], dtype=torch.int64), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([1.5, 2.0], dtype=torch.float64), "b": torch.tensor([-3.0])}
    assert ch3.max_abs_diff(a, b) == 3.0
    assert ch3.max_abs_diff({"w": torch.tensor([1.0, -5.0])}, {"w": torch.tensor([2.0, 0.0])}) == 5.0
    with pytest.raises(KeyError) as caught:
        ch3.max_abs_diff({"w": torch.zeros(1)}, {"v": torch.zeros(1)})
    assert caught.value.args[0] == "different names: ['w'] vs ['v']"


def test_average_of_three_and_drift_over_three_ranks():
    ws = [{"w": torch.tensor([float(v)])} for v in (1, 2, 6)]
    assert ch3.average(ws)["w"].tolist() == [3.0]
    history = {2: [ws[0], ws[2]], 0: [ws[0], ws[1]], 1: [ws[1], ws[0]]}
    assert ch3.drift(history) == [1.0, 4.0]       # against rank 0 (the smallest rank), however the dict is ordered
    assert ch3.average(ws[:1])["w"].tolist() == [1.0]          # one rank: its own values


def test_check_diverged_word_for_word(capsys):
    a, b = {"w": torch.tensor([1.0])}, {"w": torch.tensor([1.5])}
    every = "Return snapshot(ddp_model.module) from every rank of a run with at least 2 ranks."
    assert raised(ch3.check_diverged, {0: a}) == every
    assert raised(ch3.check_diverged, {0: a, 1: None}) == every
    assert raised(ch3.check_diverged, {0: a, 1: a}) == (
        "The replicas are still identical (largest difference 0.00e+00). DDP averages gradients, so identical "
        "gradients are not enough to diverge: change what each rank does *with* them, or change the parameters "
        "outside DDP's view.")
    ch3.check_diverged({0: a, 1: b})
    assert capsys.readouterr().out == (
        "correct: the replicas differ by up to 5.00e-01. DDP never compares parameters after construction; it only "
        "guarantees equal gradients, so anything else that differs per rank makes them drift.\n")
    near = {"w": torch.tensor([1.0 + 2 ** -10])}
    assert "(largest difference 9.77e-04)" in raised(ch3.check_diverged, {0: a, 1: near}, tolerance=2 ** -10)
    ch3.check_diverged({0: a, 1: near}, tolerance=2 ** -11)
    assert "(largest difference 9.54e-07)" in raised(ch3.check_diverged, {0: a, 1: {"w": torch.tensor([1 + 2 ** -20])}})
    ch3.check_diverged({0: a, 1: {"w": torch.tensor([1.0 + 2 ** -19])}})   # above the default 1e-6
    ch3.check_diverged({0: a, 1: a, 2: b})                                # any rank that differs will do
    capsys.readouterr()
    ch3.check_diverged({0: a, 1: b, 2: {"w": torch.tensor([2.0])}})        # measured against rank 0
    assert capsys.readouterr().out.startswith("correct: the replicas differ by up to 1.00e+00.")


def test_check_why_identical_word_for_word(capsys):
    ch3.check_why_identical(" B ")
    assert capsys.readouterr().out == (
        "correct: equal start + equal gradients + the same update rule = equal parameters, step after step.\n")
    assert raised(ch3.check_why_identical, "a") == (
        "DDP broadcasts parameters once, in its constructor; after that it sends gradients (and, by default, rank 0's "
        "buffers before each forward), never the parameters.")
    assert raised(ch3.check_why_identical, "c") == (
        "Each rank sees a different slice of the data; that is the point of data parallelism.")
    assert raised(ch3.check_why_identical, "D") == (
        "torch.optim knows nothing about other processes; DDP works in backward(), not in step().")
    assert raised(ch3.check_why_identical, "z") == "Choose one of ['a', 'b', 'c', 'd']."


def test_check_buffers_to_save_word_for_word(capsys):
    ch3.check_buffers_to_save(" B")
    assert capsys.readouterr().out == (
        "correct: the statistics that count are rank 0's (updated with rank 0's batches); the other ranks' copies "
        "carry one local update that the next forward would have replaced.\n")
    assert raised(ch3.check_buffers_to_save, "A ") == (
        "Look at the table above: after each forward rank 1's running_mean differs from rank 0's.")
    assert raised(ch3.check_buffers_to_save, "c") == (
        "DDP broadcasts buffers from rank 0, it does not average them (nn.SyncBatchNorm averages batch statistics "
        "inside each forward).")
    assert raised(ch3.check_buffers_to_save, "x") == "Choose one of ['a', 'b', 'c']."
