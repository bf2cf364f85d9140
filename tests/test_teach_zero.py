"""distlab.teach.zero: the ZeRO memory model, the byte counters, the reference losses, the exercise checks.

No processes are launched: the counters are checked on plain PyTorch models and optimizers in this process
(DeepSpeed's engines are measured by the chapter itself, whose asserts compare them with this model).
"""
import pytest
import torch
import torch.nn as nn

from distlab.teach import zero
from distlab.teach.models import DummyDataset, SimpleModel

PSI = 1_000


@pytest.mark.parametrize("stage,expected", [(0, (4, 4, 8)), (1, (4, 4, 2)), (2, (4, 1, 2)), (3, (1, 1, 2))])
def test_fp32_model_partitions_one_more_kind_per_stage(stage, expected):
    states = zero.zero_bytes(PSI, 4, stage)
    assert (states.params, states.grads, states.optimizer) == tuple(k * PSI for k in expected)
    assert states.master == 0 and states.total == sum(expected) * PSI


def test_fp32_and_mixed_precision_both_cost_16_bytes_per_parameter_without_zero():
    for precision in ("fp32", "mixed"):
        assert zero.zero_bytes(PSI, 8, 0, precision).total == 16 * PSI
        assert zero.zero_bytes(PSI, 8, 3, precision).total == 16 * PSI / 8


def test_mixed_precision_reproduces_the_papers_figure_1():
    gb = [round(zero.zero_bytes(7_500_000_000, 64, s, "mixed").total / 1e9, 1) for s in zero.STAGES]
    assert gb == [120.0, 31.4, 16.6, 1.9]


def test_one_rank_has_nothing_to_partition():
    assert {zero.zero_bytes(PSI, 1, s).total for s in zero.STAGES} == {16 * PSI}


@pytest.mark.parametrize("stage,world,problem", [(4, 2, "stage must be one of .* not 4"),
                                                 (-1, 2, "stage must be one of .* not -1"),
                                                 (1, 0, "world_size must be >= 1, not 0")])
def test_bad_stage_or_world_size_is_refused(stage, world, problem):
    with pytest.raises(ValueError, match=problem):
        zero.zero_bytes(PSI, world, stage)


def test_deepspeed_fp32_adds_a_master_partition_at_stages_1_and_2_only():
    masters = [zero.deepspeed_fp32_bytes(PSI, 2, s).master for s in zero.STAGES]
    assert masters == [0, 4 * PSI / 2, 4 * PSI / 2, 0]
    assert zero.deepspeed_fp32_bytes(PSI, 2, 2).params == zero.zero_bytes(PSI, 2, 2).params


def test_deep_mlp_parameter_count():
    width, depth = 16, 3
    assert zero.count_params(zero.deep_mlp(width, depth)) == (10 * width + width) + depth * (width * width + width) + (
        width * 2 + 2)


def test_storage_bytes_counts_a_buffer_once_however_many_views():
    flat = torch.zeros(100)
    assert zero.storage_bytes([flat[:10], flat[10:], flat.view(10, 10), None, torch.empty(0)]) == 400
    assert zero.storage_bytes([torch.zeros(3), torch.zeros(3)]) == 24


def _batch(n=8):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 10, generator=g), torch.randint(0, 2, (n,), generator=g)


def test_plain_adam_step_is_stage_0_exactly():
    torch.manual_seed(0)
    model = SimpleModel()
    psi = zero.count_params(model)
    states = zero.measure_torch_step(model, torch.optim.Adam(model.parameters()), *_batch())
    assert states.as_dict() == {**zero.zero_bytes(psi, 1, 0).as_dict(), "total": 16 * psi}


def test_grad_partition_buffer_and_views_into_it_count_once():
    model = nn.Linear(10, 10)
    buffer = torch.zeros(200)
    model.weight.grad = buffer[:100].view(10, 10)
    model.bias.grad = torch.zeros(10)

    class FakeZeroOptimizer:
        grads_in_partition = buffer

    assert zero.grad_bytes(model, FakeZeroOptimizer()) == 200 * 4 + 10 * 4
    assert zero.grad_bytes(model) == (100 + 10) * 4   # without the optimizer: values, not buffers


def test_grad_peak_sees_gradients_that_are_freed_before_backward_ends():
    torch.manual_seed(0)
    model = zero.deep_mlp(8, 4)
    params = list(model.parameters())
    first_layer = params[0]   # backward reaches it last

    def free_the_rest(_p):  # like ZeRO-2: gradients of other ranks' partitions are dropped during backward
        for p in params[2:]:
            p.grad = None

    first_layer.register_post_accumulate_grad_hook(free_the_rest)  # registered before GradPeak's, so runs first
    peak = zero.GradPeak(model)
    nn.functional.cross_entropy(model(_batch()[0]), _batch()[1]).backward()
    peak.remove()
    final = zero.grad_bytes(model)
    assert final < 4 * zero.count_params(model)
    assert peak.peak > final and peak.peak <= 4 * zero.count_params(model)
    assert not peak._handles


def test_master_bytes_counts_an_optimizer_that_updates_a_copy():
    model = nn.Linear(10, 10)
    copy = [p.detach().clone().requires_grad_() for p in model.parameters()]
    assert zero.master_bytes(model, torch.optim.Adam(model.parameters())) == 0
    assert zero.master_bytes(model, torch.optim.Adam(copy)) == 110 * 4


def test_base_optimizer_unwraps_wrappers():
    inner = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)

    class Wrapper:
        optimizer = inner

    assert zero.base_optimizer(Wrapper()) is inner and zero.base_optimizer(inner) is inner


def test_optimizer_state_bytes_skips_step_counters():
    model = nn.Linear(10, 10)
    opt = torch.optim.Adam(model.parameters())
    assert zero.optimizer_state_bytes(opt) == 0   # Adam's state appears on the first step
    model(torch.ones(1, 10)).sum().backward()
    opt.step()
    assert zero.optimizer_state_bytes(opt) == 8 * 110


def test_allowed_bytes_and_assert_states_match():
    model = zero.deep_mlp(16, 2)   # largest parameter: 16 x 16
    allowed = zero.allowed_bytes(model, reduce_bucket_size=100)
    assert allowed["grads"] == 4 * (2 * 256 + 100) + zero.PAD_BYTES
    assert allowed["params"] == allowed["optimizer"] == zero.PAD_BYTES
    assert zero.allowed_bytes(model, whole_params=True)["optimizer"] == zero.PAD_BYTES + 8 * 256
    predicted = zero.zero_bytes(PSI, 2, 2)
    good = predicted.as_dict()
    zero.assert_states_match("ok", good, predicted, allowed)
    with pytest.raises(AssertionError, match="bad optimizer"):
        zero.assert_states_match("bad", {**good, "optimizer": good["optimizer"] + 2 * zero.PAD_BYTES}, predicted,
                                 allowed)


def test_states_table_lists_every_row():
    predicted = zero.zero_bytes(PSI, 2, 1)
    text = zero.states_table([("a", predicted.as_dict(), predicted), ("bb", predicted.as_dict(), predicted)])
    assert len(text.splitlines()) == 3 and "optimizer" in text.splitlines()[0]


DATA = DummyDataset(size=128, seed=0)


def test_reference_with_one_rank_is_plain_sgd():
    got = zero.reference_losses(SimpleModel, DATA, 1, batch_size=32, epochs=1, lr=0.01)
    torch.manual_seed(0)
    model = SimpleModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sampler = torch.utils.data.distributed.DistributedSampler(DATA, num_replicas=1, rank=0)
    want = []
    for x, y in torch.utils.data.DataLoader(DATA, batch_size=32, sampler=sampler):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        want.append(loss.item())
    assert got == {0: want}


def test_reference_steps_along_the_mean_of_rank_gradients():
    """Two ranks of 32 = one model on their 64 samples, mean loss: the loss of the next step must agree."""
    avg = zero.reference_losses(SimpleModel, DATA, 2, batch_size=32, epochs=1, lr=0.01)
    torch.manual_seed(0)
    model = SimpleModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    samplers = [torch.utils.data.distributed.DistributedSampler(DATA, num_replicas=2, rank=r) for r in (0, 1)]
    loaders = [torch.utils.data.DataLoader(DATA, batch_size=32, sampler=s) for s in samplers]
    for step, ((x0, y0), (x1, y1)) in enumerate(zip(*loaders, strict=True)):
        opt.zero_grad()
        out = model(torch.cat([x0, x1]))
        assert abs(nn.functional.cross_entropy(out[:32], y0).item() - avg[0][step]) < 1e-6
        assert abs(nn.functional.cross_entropy(out[32:], y1).item() - avg[1][step]) < 1e-6
        nn.functional.cross_entropy(out, torch.cat([y0, y1])).backward()
        opt.step()


def test_isolated_ranks_drift_from_the_average_and_threads_are_restored():
    threads = torch.get_num_threads()
    avg = zero.reference_losses(SimpleModel, DATA, 2, batch_size=32, epochs=2, lr=0.1)
    alone = zero.reference_losses(SimpleModel, DATA, 2, batch_size=32, epochs=2, lr=0.1, average=False)
    assert avg[0][0] == alone[0][0]                        # same start
    assert zero.max_loss_gap(avg, alone) > 1e-4            # then they part
    assert torch.get_num_threads() == threads


def test_optimizer_bytes_check():
    assert zero.check_optimizer_bytes(None, PSI, 2, 4) is False
    assert zero.check_optimizer_bytes(2 * PSI, PSI, 2, 4) is True
    with pytest.raises(AssertionError, match="whole optimizer state"):
        zero.check_optimizer_bytes(8 * PSI, PSI, 2, 4)
    with pytest.raises(AssertionError, match="Not quite"):
        zero.check_optimizer_bytes(4 * PSI, PSI, 2, 4)
    assert zero.check_optimizer_bytes(12 * PSI / 4, PSI, 1, 4, precision="mixed") is True


def test_smallest_stage_check():
    assert zero.check_smallest_stage(None, 10**9, 8, 8e9) is False
    assert zero.check_smallest_stage(2, 10**9, 8, 8e9) is True
    assert zero.check_smallest_stage(-1, 10**9, 8, 1e9) is True
    with pytest.raises(AssertionError, match="Not quite: 3"):
        zero.check_smallest_stage(3, 10**9, 8, 8e9)


def test_paper_example_check():
    assert zero.check_paper_example(None) is False
    assert zero.check_paper_example(16.64) is True
    with pytest.raises(AssertionError, match="divides gradients and optimizer state by 64"):
        zero.check_paper_example(31.4)


def test_adam_ignores_a_gradient_scale_that_sgd_would_double():
    assert abs(zero.adam_update_ratio(2.0) - 1) < 1e-4
    assert zero.check_adam_scale(1) is True
    with pytest.raises(AssertionError, match="sqrt\\(v\\) by \\|c\\|"):
        zero.check_adam_scale(2)


def test_skip_shm_comm_build_marks_the_op_unbuildable(monkeypatch):
    import deepspeed.ops as ops  # a pinned dependency: its private table must still have the entry

    monkeypatch.setitem(ops.__compatible_ops__, "deepspeed_shm_comm", True)   # undone after the test
    zero.skip_shm_comm_build()
    assert ops.__compatible_ops__["deepspeed_shm_comm"] is False


def test_skip_shm_comm_build_says_when_the_private_table_changed(monkeypatch):
    import deepspeed.ops as ops

    monkeypatch.delitem(ops.__compatible_ops__, "deepspeed_shm_comm")
    with pytest.raises(RuntimeError, match="private op table has no 'deepspeed_shm_comm'"):
        zero.skip_shm_comm_build()


def test_zero1_load_check():
    assert zero.check_zero1_load(None, 2) is False
    assert zero.check_zero1_load([1, 0], 2) is True
    with pytest.raises(AssertionError, match="every rank's optimizer holds a share"):
        zero.check_zero1_load([0], 2)
    with pytest.raises(AssertionError, match="Not quite"):
        zero.check_zero1_load([0, 1, 2], 2)


def test_plot_has_one_stacked_bar_per_kind_and_run():
    import matplotlib

    matplotlib.use("Agg")
    from distlab.plots.zero import plot_bytes_by_stage

    rows = [(f"ZeRO-{s}", zero.deepspeed_fp32_bytes(PSI, 2, s).as_dict(), zero.deepspeed_fp32_bytes(PSI, 2, s).total)
            for s in zero.STAGES]
    fig = plot_bytes_by_stage(rows)
    ax = fig.axes[0]
    assert len(ax.patches) == 4 * len(rows)   # params, grads, optimizer, master: zero-height bars included
    assert [t.get_text() for t in ax.get_xticklabels()] == [r[0] for r in rows]
    assert ax.get_ylim()[1] > 16 * PSI / 1e6
