"""distlab.teach.practice / .beyond and their plots: predictions checked against torch itself
(PowerSGD's real hook, BatchNorm's real buffers, chapter 8's ZeRO model), checkers both ways."""
import math

import matplotlib
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.nn.parallel import DistributedDataParallel as DDP

from distlab.plots import beyond as beyond_plots
from distlab.plots import practice as practice_plots
from distlab.teach import beyond, practice, zero
from distlab.teach.perf import single_rank_group

matplotlib.use("Agg")


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))


# ------------------------------------------------------------------------------- practice: gradients


def test_flat_grad_puts_zeros_where_a_parameter_has_no_gradient():
    model = nn.Linear(3, 2)
    assert practice.flat_grad(model).tolist() == [0.0] * 8
    model(torch.ones(1, 3)).sum().backward()
    assert practice.flat_grad(model).tolist() == [1.0] * 6 + [1.0, 1.0]


def test_cosine_and_relative_gap():
    a = torch.tensor([1.0, 0.0])
    assert practice.cosine(a, torch.tensor([2.0, 0.0])) == pytest.approx(1.0)
    assert practice.cosine(a, torch.tensor([0.0, 3.0])) == pytest.approx(0.0)
    assert practice.max_rel_gap([1.1, 2.0], [1.0, 2.0]) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="differ in length: 1 vs 2"):
        practice.max_rel_gap([1.0], [1.0, 2.0])


# ------------------------------------------------------------------------------- practice: hooks


def test_param_bytes_counts_every_parameter():
    assert practice.param_bytes(nn.Linear(10, 3)) == 33 * 4
    assert practice.param_bytes(nn.Linear(10, 3), 2) == 33 * 2


@pytest.mark.parametrize("shape,expected", [((4, 256), False), ((256, 256), True), ((256,), False),
                                            ((256, 32), True), ((8, 8), False)])
def test_powersgd_compression_rule(shape, expected):
    assert practice.powersgd_compresses(shape, rank=2) is expected


def _bytes_sent_by_powersgd(model, rank, steps):
    """Run torch's PowerSGD hook under DDP in a one-rank group and count what it all-reduces."""
    sent = []
    real = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        sent[-1] += tensor.numel() * tensor.element_size()
        return real(tensor, *args, **kwargs)

    ddp = DDP(model)
    state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2)
    ddp.register_comm_hook(state, powerSGD.powerSGD_hook)
    dist.all_reduce = counting
    try:
        for _ in range(steps):
            sent.append(0)
            ddp(torch.randn(8, 32)).sum().backward()
    finally:
        dist.all_reduce = real
    return sent


@pytest.mark.parametrize("rank", [1, 2])
def test_powersgd_bytes_predicts_torchs_hook(rank):
    with single_rank_group():
        sent = _bytes_sent_by_powersgd(net(), rank, steps=4)
    assert sent[:2] == [practice.param_bytes(net())] * 2          # plain all-reduce before start_powerSGD_iter
    assert sent[2:] == [practice.powersgd_bytes(net(), rank)] * 2


# ------------------------------------------------------------------------------- practice: BatchNorm, lr


def test_ema_is_what_batchnorm_keeps():
    bn = nn.BatchNorm1d(1)
    g = torch.Generator().manual_seed(0)
    means = []
    for _ in range(7):
        x = torch.randn(16, 1, generator=g) + 3
        means.append(x.mean().item())
        bn(x)
    assert bn.running_mean.item() == pytest.approx(practice.ema(means, 0.1), abs=1e-6)
    assert practice.ema([], 0.1, start=2.0) == 2.0


def test_linear_rule_and_warmup():
    assert practice.linear_scaled_lr(0.1, 256, 2048) == pytest.approx(0.8)
    assert practice.warmup_lr(0, 0.8, 4, start_lr=0.1) == pytest.approx(0.1)
    assert practice.warmup_lr(2, 0.8, 4, start_lr=0.1) == pytest.approx(0.45)
    assert practice.warmup_lr(4, 0.8, 4, start_lr=0.1) == 0.8 == practice.warmup_lr(9, 0.8, 4)
    assert practice.warmup_lr(0, 0.8, 4) == pytest.approx(0.2)
    assert practice.warmup_lr(3, 0.8, 0) == 0.8


# ------------------------------------------------------------------------------- practice: checkers


def test_practice_checkers_accept_right_answers_and_wait_for_none(capsys):
    layer = nn.Linear(1024, 1024)
    assert practice.check_hook_bytes(None, layer, "bf16") is False
    assert "No answer yet" in capsys.readouterr().out
    assert practice.check_hook_bytes(2 * (1024 * 1024 + 1024), layer, "bf16")
    assert practice.check_hook_bytes(4 * 2048 * 4 + 4 * 1024, layer, "powersgd", rank=4)
    assert practice.check_unused_grad(0.2, 0.8, 4, 1)
    assert practice.check_warmup_lr(0.275, 0.1, 256, 2048, 500, 125)


def test_practice_checkers_reject_wrong_answers_with_a_hint():
    layer = nn.Linear(1024, 1024)
    with pytest.raises(AssertionError, match="uncompressed"):
        practice.check_hook_bytes(4 * (1024 * 1024 + 1024), layer, "bf16")
    with pytest.raises(AssertionError, match=r"PowerSGD sends \(n \+ m\) \* rank"):
        practice.check_hook_bytes(123, layer, "powersgd", rank=4)
    with pytest.raises(AssertionError, match="local gradient"):
        practice.check_unused_grad(0.8, 0.8, 4, 1)
    with pytest.raises(AssertionError, match="peak"):
        practice.check_warmup_lr(0.8, 0.1, 256, 2048, 500, 125)
    with pytest.raises(AssertionError, match="Not quite: 'a lot'"):
        practice.check_warmup_lr("a lot", 0.1, 256, 2048, 500, 125)


# ------------------------------------------------------------------------------- beyond: counting


def test_collective_bytes_counts_kinds_and_message_sizes():
    with single_rank_group():
        with beyond.CollectiveBytes() as comm:
            dist.all_reduce(torch.ones(10))
            dist.all_reduce(torch.ones(5))
            out = torch.empty(6)
            dist.all_gather_into_tensor(out, torch.ones(6))
            torch.ones(3) + 1                                       # not a collective
        dist.all_reduce(torch.ones(100))                            # outside: not counted
    assert comm.calls == {"all_reduce": 2, "all_gather": 1}
    assert comm.bytes == {"all_reduce": 60, "all_gather": 24}
    assert comm.wire_bytes(2) == 60 + 12


def test_wire_bytes_uses_ring_factors():
    assert beyond.wire_bytes({"all_reduce": 800}, 4) == 1200
    assert beyond.wire_bytes({"all_gather": 800, "reduce_scatter": 800}, 4) == 1200
    assert beyond.wire_bytes({"send": 10, "recv": 10}, 2) == 10


# ------------------------------------------------------------------------------- beyond: the map


@pytest.mark.parametrize("world", [2, 8])
def test_ddp_and_fsdp2_costs_agree_with_chapter_8s_zero_model(world):
    psi = 132_352
    costs = beyond.strategy_costs(psi=psi, depth=4, d=64, batch=16, world=world)
    assert costs["DDP"].memory == zero.zero_bytes(psi, world, 0).total
    assert costs["FSDP2"].memory == zero.zero_bytes(psi, world, 3).total
    assert costs["FSDP2"].wire == pytest.approx(1.5 * costs["DDP"].wire)


def test_map_leaves_out_splits_that_do_not_fit():
    two = beyond.strategy_costs(psi=1000, depth=4, d=8, batch=4, world=2)
    eight = beyond.strategy_costs(psi=1000, depth=4, d=8, batch=4, world=8)
    assert set(two) == {"DDP", "FSDP2", "TP", "PP"}
    assert "PP" not in eight and {"FSDP2 x TP", "FSDP2 x PP"} <= set(eight)
    table = beyond.costs_table(two, {"DDP": (16_000, 4_000)})
    assert "DDP" in table.splitlines()[1] and "16.0" in table.splitlines()[1]


def _gpipe_idle_fraction(stages, microbatches):
    """Simulate one GPipe phase: stage s works on micro-batch m in slot s + m; count idle slots."""
    slots = microbatches + stages - 1
    busy = {(s, s + m) for s in range(stages) for m in range(microbatches)}
    return 1 - len(busy) / (stages * slots)


@pytest.mark.parametrize("stages,microbatches", [(1, 4), (2, 4), (4, 8), (8, 3)])
def test_bubble_fraction_matches_a_simulated_schedule(stages, microbatches):
    assert beyond.bubble_fraction(stages, microbatches) == pytest.approx(_gpipe_idle_fraction(stages, microbatches))


def test_beyond_checkers():
    assert beyond.check_fsdp_bytes(16 * 7e9 / 64, psi=7_000_000_000, world=64)
    with pytest.raises(AssertionError, match="every DDP rank"):
        beyond.check_fsdp_bytes(16 * 7e9, psi=7_000_000_000, world=64)
    assert beyond.check_tp_message(8 * 2048 * 4096 * 2, tokens=8 * 2048, d=4096, bytes_per_element=2)
    with pytest.raises(AssertionError, match="partial outputs are summed"):
        beyond.check_tp_message(8 * 2048 * 4096 * 4, tokens=8 * 2048, d=4096, bytes_per_element=2)
    assert beyond.check_bubble(3 / 11, stages=4, microbatches=8)
    with pytest.raises(AssertionError, match=r"M \+ S - 1 slots"):
        beyond.check_bubble(3 / 8, stages=4, microbatches=8)
    assert beyond.check_bubble(None, stages=4, microbatches=8) is False


# ------------------------------------------------------------------------------- plots


def test_practice_plots_draw_one_line_per_series():
    fig = practice_plots.plot_running_means({"a": {0: [0, 1], 1: [1, 2]}, "b": {0: [0, 0], 1: [3, 3]}})
    assert len(fig.axes) == 2 and all(len(ax.lines) == 2 for ax in fig.axes)
    fig = practice_plots.plot_hooks({"fp32": 300e3, "fp16": 150e3}, {"fp32": [1.0, 0.9], "fp16": [1.0, 0.8]})
    assert len(fig.axes[0].patches) == 2 and len(fig.axes[1].lines) == 2
    fig = practice_plots.plot_lr_runs({"B=16": (16, [1.0, 0.5]), "B=128": (128, [1.0])})
    assert [line.get_xdata()[-1] for line in fig.axes[0].lines] == [32, 128]


def test_beyond_plots():
    holds = {"data": {0: {"w": ((4, 2), (0, 4), (0, 2))}, 1: {"w": ((4, 2), (0, 4), (0, 2))}},
             "tensor": {0: {"w": ((4, 2), (0, 2), (0, 2))}, 1: {"w": ((4, 2), (2, 4), (0, 2))}}}
    fig = beyond_plots.plot_holdings(holds, {"data": {"all_reduce": 32}, "tensor": {"all_reduce": 8}})
    assert len(fig.axes) == 4
    filled = [p for p in fig.axes[1].patches if p.get_fill()]        # tensor, rank 0: the top half
    assert len(filled) == 1 and math.isclose(filled[0].get_height(), 0.5)
    costs = beyond.strategy_costs(psi=1000, depth=4, d=8, batch=4, world=2)
    fig = beyond_plots.plot_map({2: costs}, {"DDP": (16_000, 4_000)})
    assert len(fig.axes[0].collections) == len(costs) + 1


def test_map_messages_are_what_each_collective_carries():
    """The map predicts message sizes per kind (what CollectiveBytes measures); wire bytes follow from them."""
    two = beyond.strategy_costs(psi=1000, depth=4, d=8, batch=4, world=2)
    assert two["DDP"].messages == {"all_reduce": 4000}
    assert two["FSDP2"].messages == {"all_gather": 8000, "reduce_scatter": 4000}
    assert two["TP"].messages == {"all_reduce": 7 * 4 * 4 * 8}
    assert two["PP"].messages == {"send": 4 * 4 * 8, "recv": 4 * 4 * 8}
    for cost in two.values():
        assert cost.wire == pytest.approx(beyond.wire_bytes(cost.messages, 2))
    eight = beyond.strategy_costs(psi=1000, depth=4, d=8, batch=4, world=8)
    tp = (1000 - 4 * 8) / 2 + 4 * 8
    assert eight["FSDP2 x TP"].messages == {"all_gather": 8 * tp, "reduce_scatter": 4 * tp, "all_reduce": 7 * 128}
    fsdp_part = beyond.wire_bytes({"all_gather": 8 * tp, "reduce_scatter": 4 * tp}, 4)
    assert eight["FSDP2 x TP"].wire == pytest.approx(fsdp_part + beyond.wire_bytes({"all_reduce": 7 * 128}, 2))
    assert eight["FSDP2 x PP"].messages == {"all_gather": 4000, "reduce_scatter": 2000, "send": 128, "recv": 128}


def _sharded_blocks(depth=3):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(depth)])
    mesh = init_device_mesh("cpu", (1,))
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def test_gathered_blocks_counts_fsdp2s_default_and_explicit_prefetch():
    with single_rank_group():
        model = _sharded_blocks()
        gathered = beyond.GatheredBlocks(model)
        for _ in range(2):
            gathered.clear()
            model(torch.randn(4, 8)).sum().backward()
        assert (gathered.forward, gathered.backward) == ([1, 1, 1], [2, 2, 1])   # backward prefetches one block
        blocks = list(model)
        for i, block in enumerate(blocks[:-1]):
            block.set_modules_to_forward_prefetch([blocks[i + 1]])
        blocks[2].set_modules_to_backward_prefetch([blocks[1], blocks[0]])
        gathered.clear()
        model(torch.randn(4, 8)).sum().backward()
        assert (gathered.forward, gathered.backward) == ([2, 2, 1], [3, 2, 1])
        gathered.remove()
        gathered.clear()
        model(torch.randn(4, 8)).sum().backward()
        assert gathered.forward == gathered.backward == []


# ------------------------------------------------------------------------------- word for word (issue #60)
# what the chapters' learners read and what their asserts compare: the mutation run kills any change to it


def raised(check, *args, **kwargs) -> str:
    with pytest.raises(AssertionError) as caught:
        check(*args, **kwargs)
    return str(caught.value)


def test_map_at_four_ranks_pipelines_over_four_stages_and_combines_two_by_two():
    four = beyond.strategy_costs(psi=1000, depth=4, d=8, batch=4, world=4)
    assert list(four) == ["DDP", "FSDP2", "TP", "PP", "FSDP2 x TP", "FSDP2 x PP"]
    assert four["PP"] == beyond.Cost(16 * 1000 / 4, 2 * 128, "4 stages")      # a middle stage sends twice
    assert four["PP"].messages == {"send": 2 * 128, "recv": 2 * 128}
    tp = (1000 - 4 * 8) / 2 + 4 * 8
    assert four["FSDP2 x TP"] == beyond.Cost(16 * tp / 2, 12 * tp / 2 + 7 * 128 * 2 / 2, "2 shard x 2 tensor")
    assert four["FSDP2 x PP"] == beyond.Cost(16 * 1000 / 4, 12 * 500 / 2 + 128, "2 shard x 2 stages")
    assert four["TP"] == beyond.Cost(16 * ((1000 - 32) / 4 + 32), 7 * 128 * 2 * 3 / 4, "4 tensor")
    assert four["DDP"] == beyond.Cost(16_000, 4000 * 2 * 3 / 4, "4 data")
    assert four["FSDP2"] == beyond.Cost(16_000 / 4, 12_000 * 3 / 4, "4 shard")


def test_map_leaves_out_pipelines_a_depth_does_not_divide():
    three = beyond.strategy_costs(psi=1000, depth=3, d=8, batch=4, world=4)
    assert list(three) == ["DDP", "FSDP2", "TP", "FSDP2 x TP"]
    assert list(beyond.strategy_costs(psi=1000, depth=6, d=8, batch=4, world=6)) == [
        "DDP", "FSDP2", "TP", "PP", "FSDP2 x TP", "FSDP2 x PP"]
    assert beyond.strategy_costs(psi=1000, depth=6, d=8, batch=4, world=6)["FSDP2 x TP"].layout == (
        "3 shard x 2 tensor")
    assert list(beyond.strategy_costs(psi=1000, depth=4, d=8, batch=4, world=3)) == ["DDP", "FSDP2", "TP"]


def test_costs_table_word_for_word():
    two = beyond.strategy_costs(psi=1000, depth=4, d=8, batch=4, world=2)
    assert beyond.costs_table(two, {"DDP": (16_000, 4_000), "TP": (8_250, 950)}).splitlines() == [
        "split        layout                  memory kB  measured  sent kB/step  measured",
        "DDP          2 data                       16.0      16.0           4.0       4.0",
        "FSDP2        2 shard                       8.0                     6.0",
        "TP           2 tensor                      8.3       8.2           0.9       0.9",
        "PP           2 stages                      8.0                     0.1"]
    assert beyond.costs_table({}) == "split        layout                  memory kB  measured  sent kB/step  measured"


def test_wire_bytes_of_every_kind():
    assert beyond.wire_bytes({"broadcast": 10, "send": 10, "recv": 10}, 4) == 20
    assert beyond.wire_bytes({"all_gather": 100}, 5) == 80
    assert beyond.wire_bytes({}, 4) == 0


def test_beyond_checkers_word_for_word(capsys):
    assert beyond.check_fsdp_bytes(None, psi=7_000_000_000, world=64) is False
    assert capsys.readouterr().out == "No answer yet: replace None with a number of bytes.\n"
    assert beyond.check_fsdp_bytes("1.75e9", psi=7_000_000_000, world=64) is True
    assert capsys.readouterr().out == "correct: 1.75 GB per rank\n"
    assert raised(beyond.check_fsdp_bytes, 16 * 7e9, psi=7_000_000_000, world=64) == (
        "That is what every DDP rank holds. FSDP2 shards all three kinds of state.")
    assert raised(beyond.check_fsdp_bytes, 123, psi=7_000_000_000, world=64) == (
        "Not quite: 123. fp32 Adam keeps 4 + 4 + 8 bytes per parameter; FSDP2 divides all of it by the ranks.")
    assert beyond.check_tp_message(None, tokens=16384, d=4096, bytes_per_element=2) is False
    assert capsys.readouterr().out == "No answer yet: replace None with a number of bytes.\n"
    assert beyond.check_tp_message(2**27, tokens=16384, d=4096, bytes_per_element=2) is True
    assert capsys.readouterr().out == (
        "correct: 128 MiB per all-reduce, twice per block and step (forward and backward)\n")
    assert raised(beyond.check_tp_message, 1, tokens=16384, d=4096, bytes_per_element=2) == (
        "Not quite: 1. The row-wise layer's partial outputs are summed: one value per token and feature.")
    assert beyond.check_bubble(None, stages=4, microbatches=8) is False
    assert capsys.readouterr().out == "No answer yet: replace None with a fraction between 0 and 1.\n"
    assert beyond.check_bubble(3 / 11, stages=4, microbatches=8) is True
    assert capsys.readouterr().out == "correct: 0.273; more micro-batches shrink it (M = 32 gives 0.086)\n"
    assert raised(beyond.check_bubble, 3 / 8, stages=4, microbatches=8) == (
        "Not quite: 0.375. Count the time slots of one phase: the last micro-batch leaves the last stage after "
        "M + S - 1 slots, and each stage worked in M of them.")


def test_beyond_answers_within_a_tenth_of_a_percent_count():
    assert beyond.check_bubble(3 / 11 * 1.00099, stages=4, microbatches=8) is True
    assert beyond.check_bubble(3 / 11 * 0.99901, stages=4, microbatches=8) is True
    assert raised(beyond.check_bubble, 3 / 11 * 1.00101, stages=4, microbatches=8).startswith("Not quite: 0.273")
    assert raised(beyond.check_bubble, 3 / 11 * 0.99899, stages=4, microbatches=8).startswith("Not quite: 0.272")
    assert beyond.check_bubble(0, stages=1, microbatches=8) is True      # one stage: no bubble, exactly 0
    assert raised(beyond.check_bubble, 1e-9, stages=1, microbatches=8).startswith("Not quite: 1e-09")
    for answer in ("a lot", [0.27], object()):
        assert raised(beyond.check_bubble, answer, stages=4, microbatches=8).startswith(f"Not quite: {answer!r}.")


def test_practice_checkers_word_for_word(capsys):
    layer = nn.Linear(1024, 1024)
    assert practice.check_hook_bytes(None, layer, "fp16") is False
    assert capsys.readouterr().out == "No answer yet: replace None with a number of bytes.\n"
    assert practice.check_hook_bytes("2099200", layer, "fp16") is True
    assert capsys.readouterr().out == "correct: 2,099,200 bytes per step\n"
    assert raised(practice.check_hook_bytes, 4 * (1024 * 1024 + 1024), layer, "fp16") == (
        "4198400 is the uncompressed fp32 gradient. What does the fp16 hook send instead?")
    assert raised(practice.check_hook_bytes, 123, layer, "bf16") == (
        "Not quite: 123. fp16/bf16 send 2 bytes per gradient element; PowerSGD sends (n + m) * rank fp32 numbers for "
        "each n x m matrix it compresses and every other gradient whole.")
    assert practice.check_hook_bytes(4 * 2048 * 1 + 4 * 1024, layer, "powersgd") is True      # rank 1 by default
    capsys.readouterr()
    assert practice.check_unused_grad(None, 0.8, 4, 1) is False
    assert capsys.readouterr().out == "No answer yet: replace None with a number.\n"
    assert practice.check_unused_grad("0.2", 0.8, 4, 1) is True
    assert capsys.readouterr().out == (
        "correct: 0.2. The ranks that skipped the branch contribute zeros to the average.\n")
    assert raised(practice.check_unused_grad, 0.8, 0.8, 4, 1) == (
        "That is one rank's local gradient. DDP averages over *all* ranks; what do the ranks that did not use the "
        "parameter contribute?")
    assert raised(practice.check_unused_grad, 0.3, 0.8, 4, 1) == (
        "Not quite: 0.3. Average over all 4 ranks, zeros included.")
    assert practice.check_warmup_lr(None, 0.1, 256, 2048, 500, 125) is False
    assert capsys.readouterr().out == "No answer yet: replace None with a learning rate.\n"
    assert practice.check_warmup_lr(0.275, 0.1, 256, 2048, 500, 125) is True
    assert capsys.readouterr().out == "correct: 0.275 (peak 0.8 from step 500 on)\n"
    assert raised(practice.check_warmup_lr, 0.8, 0.1, 256, 2048, 500, 125) == (
        "0.8 is the peak rate; step 125 is still inside the warm-up.")
    assert raised(practice.check_warmup_lr, 0.3, 0.1, 256, 2048, 500, 125) == (
        "Not quite: 0.3. The peak is base_lr * batch / base_batch = 0.8; warm-up goes linearly from 0.1 at step 0 to "
        "the peak at step 500.")
    assert practice.check_warmup_lr(0.8, 0.1, 256, 2048, 500, 500) is True     # the warm-up's end: the peak is right


def test_practice_answers_within_a_tenth_of_a_percent_count():
    assert practice.check_unused_grad(0.2 * 1.00099, 0.8, 4, 1) is True
    assert practice.check_unused_grad(0.2 * 0.99901, 0.8, 4, 1) is True
    assert raised(practice.check_unused_grad, 0.2 * 1.00101, 0.8, 4, 1).startswith("Not quite: 0.2002")
    assert raised(practice.check_unused_grad, 0.2 * 0.99899, 0.8, 4, 1).startswith("Not quite: 0.1997")
    assert practice.check_unused_grad(0, 0.8, 4, 0) is True           # nobody used it: exactly 0
    assert raised(practice.check_unused_grad, 1e-9, 0.8, 4, 0).startswith("Not quite: 1e-09")
    assert practice.check_unused_grad(1e-12, 0.8, 4, 0) is True          # the 1e-12 slack itself still counts
    for answer in ("a lot", [0.2], object()):
        assert raised(practice.check_unused_grad, answer, 0.8, 4, 1).startswith(f"Not quite: {answer!r}.")


def test_powersgd_rule_at_its_edge_and_its_default_rate():
    # (n + m) * rank * rate < n * m: 16 x 16 at rank 4 is (32 * 4) * 2 = 256, not below 256
    assert practice.powersgd_compresses((16, 16), rank=4) is False
    assert practice.powersgd_compresses((16, 17), rank=4) is True
    assert practice.powersgd_compresses((16, 16), rank=4, min_compression_rate=1.9) is True
    assert practice.powersgd_compresses((4, 2, 8), rank=1) is True        # 4 x 16: trailing dimensions flattened
    assert practice.powersgd_compresses((4, 2, 2), rank=1) is False       # 4 x 4: (8 * 1) * 2 = 16, not below 16
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 17))            # weights 16 x 16 and 17 x 16
    assert practice.powersgd_bytes(model, rank=4) == (256 + 16) * 4 + ((17 + 16) * 4 + 17) * 4
    assert practice.powersgd_bytes(model, rank=4, min_compression_rate=1.9) == (
        ((16 + 16) * 4 + 16) + ((17 + 16) * 4 + 17)) * 4
    conv = nn.Conv2d(4, 8, 3, bias=False)                                   # 8 x 36 once flattened
    assert practice.powersgd_bytes(conv, rank=1) == (8 + 36) * 4


def test_flat_grad_is_a_float_cpu_vector_in_parameter_order():
    model = nn.Linear(2, 1).double()
    model.weight.grad = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    got = practice.flat_grad(model)
    assert got.dtype == torch.float32 and got.tolist() == [1.0, 2.0, 0.0]


def test_cosine_of_vectors_of_any_length_and_direction():
    assert practice.cosine(torch.tensor([3.0, 4.0]), torch.tensor([4.0, 3.0])) == pytest.approx(24 / 25)
    assert practice.cosine(torch.tensor([1.0, 1.0]), torch.tensor([-2.0, -2.0])) == pytest.approx(-1.0)


def test_max_rel_gap_is_the_largest_relative_to_the_second_sequence():
    assert practice.max_rel_gap([2.0, 3.0, 4.0], [1.0, 3.0, 5.0]) == pytest.approx(1.0)
    assert practice.max_rel_gap([-1.5], [-1.0]) == pytest.approx(0.5)


def test_ema_weighs_the_newest_batch_by_the_momentum():
    assert practice.ema([10.0], 0.1) == pytest.approx(1.0)
    assert practice.ema([10.0, 0.0], 0.5, start=2.0) == pytest.approx(3.0)


def test_warmup_from_the_default_start_and_after_its_end():
    assert practice.warmup_lr(1, 0.8, 4) == pytest.approx(0.35)    # from 0.2 towards 0.8, a quarter of the way
    assert practice.warmup_lr(3, 0.8, 4, start_lr=0.0) == pytest.approx(0.6)
    assert practice.warmup_lr(-1, 0.8, -2) == 0.8 == practice.warmup_lr(-1, 0.8, 0)   # no warm-up: the peak at once
    assert practice.warmup_lr(0, 0.8, 1, start_lr=0.1) == 0.1                          # one warm-up step: step 0
    assert practice.warmup_lr(4, 0.9, 4, start_lr=0.2) == 0.9       # exactly the peak from the warm-up's end on
    assert practice.linear_scaled_lr(0.1, 256, 128) == pytest.approx(0.05)


def test_a_kind_carried_by_two_groups_adds_up_in_the_messages():
    from distlab.teach import splitcost

    cost = splitcost._cost(1.0, "mesh", ({"all_reduce": 10, "send": 1}, 2), ({"all_reduce": 5}, 4))
    assert cost.messages == {"all_reduce": 15, "send": 1}
    assert cost.wire == pytest.approx(10 + 1 + 5 * 1.5)


def test_costs_table_rounds_kilobytes_of_every_column():
    row = beyond.costs_table({"X": beyond.Cost(1050, 1050, "l")}, {"X": (1050, 1050)}).splitlines()[1]
    assert row == "X            l                             1.1       1.1           1.1       1.1"


def test_beyond_checkers_at_their_edges(capsys):
    assert beyond.check_bubble(1e-12, stages=1, microbatches=8) is True       # the 1e-12 slack itself still counts
    capsys.readouterr()
    assert beyond.check_fsdp_bytes(3.75e8, psi=46_875_000, world=2) is True     # 0.375 GB exactly
    assert capsys.readouterr().out == "correct: 0.38 GB per rank\n"
