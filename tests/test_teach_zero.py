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
    assert avg[0][0] == alone[0][0] and avg[1][0] == alone[1][0]   # same start: rank 1's copy starts as rank 0's
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
    assert zero.check_zero1_load([0], 1) is True  # alone, rank 0 is every rank
    with pytest.raises(AssertionError, match="every rank's optimizer holds a share"):
        zero.check_zero1_load([0], 3)


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


# --- word for word: what chapter 8's learner reads (issue #60: the mutation run kills changed messages) ---------------

def raised(check, *args, **kwargs) -> str:
    with pytest.raises(AssertionError) as caught:
        check(*args, **kwargs)
    return str(caught.value)


def test_optimizer_bytes_check_word_for_word(capsys):
    assert zero.check_optimizer_bytes(None, PSI, 2, 4) is False
    assert capsys.readouterr().out == "No answer yet: replace None with a number of bytes.\n"
    assert zero.check_optimizer_bytes("2000", PSI, 2, 4) is True
    assert capsys.readouterr().out == "correct: 2,000 bytes\n"
    assert raised(zero.check_optimizer_bytes, 8 * PSI, PSI, 2, 4) == (
        "That is the whole optimizer state. ZeRO-2 partitions it over 4 ranks.")
    assert raised(zero.check_optimizer_bytes, 4 * PSI, PSI, 2, 4) == (
        "Not quite: 4000. Adam keeps 8 bytes of optimizer state per parameter in fp32; stages >= 1 divide it by the "
        "world size, stage 0 does not.")
    assert raised(zero.check_optimizer_bytes, 4 * PSI, PSI, 2, 4, precision="mixed").startswith(
        "Not quite: 4000. Adam keeps 12 bytes of optimizer state per parameter in mixed;")


def test_optimizer_bytes_check_calls_the_whole_state_only_what_zero_would_partition():
    """Stage 0, or one rank: the whole state is the right answer, not a hint."""
    assert raised(zero.check_optimizer_bytes, 8 * PSI, PSI, 1, 2) == (
        "That is the whole optimizer state. ZeRO-1 partitions it over 2 ranks.")
    assert zero.check_optimizer_bytes(8 * PSI, PSI, 0, 4) is True
    assert zero.check_optimizer_bytes(8 * PSI, PSI, 2, 1) is True


def test_answers_within_one_percent_count_and_others_do_not():
    assert zero.check_optimizer_bytes(2 * PSI * 1.0099, PSI, 2, 4) is True
    assert zero.check_optimizer_bytes(2 * PSI * 0.9901, PSI, 2, 4) is True
    assert raised(zero.check_optimizer_bytes, 2 * PSI * 1.0101, PSI, 2, 4).startswith("Not quite: 2020.2")
    assert raised(zero.check_optimizer_bytes, 2 * PSI * 0.9899, PSI, 2, 4).startswith("Not quite: 1979.8")
    assert zero.check_optimizer_bytes(0, 0, 0, 4) is True          # nothing to hold: 0 is exactly right
    assert raised(zero.check_optimizer_bytes, 0.5, 0, 0, 4).startswith("Not quite: 0.5")
    assert zero.check_optimizer_bytes(1e-9, 0, 0, 4) is True       # the 1e-9 slack itself still counts


@pytest.mark.parametrize("answer", ["two thousand", [2000], object()])
def test_an_answer_that_is_no_number_is_not_quite_right(answer):
    assert raised(zero.check_optimizer_bytes, answer, PSI, 2, 4).startswith(f"Not quite: {answer!r}.")


def test_smallest_stage_check_word_for_word(capsys):
    totals = "stage 0: 16.00 GB, stage 1: 9.00 GB, stage 2: 5.50 GB, stage 3: 2.00 GB"
    assert zero.check_smallest_stage(None, 10**9, 8, 8e9) is False
    assert capsys.readouterr().out == "No answer yet: replace None with a stage number (0-3), or -1 if none fits.\n"
    assert zero.check_smallest_stage(2, 10**9, 8, 8e9) is True
    assert capsys.readouterr().out == f"correct: stage 2 ({totals})\n"
    assert zero.check_smallest_stage(2, 10**9, 8, 5.5e9) is True     # a budget the total just fits in
    capsys.readouterr()
    assert zero.check_smallest_stage(0, 10**9, 8, 16e9) is True      # stage 0 fits: a stage number 0, not "none"
    assert capsys.readouterr().out == "correct: stage 0 (stage 0: 16.00 GB, stage 1: 9.00 GB, stage 2: 5.50 GB, " \
                                      "stage 3: 2.00 GB)\n"
    assert zero.check_smallest_stage(-1, 10**9, 8, 1e9) is True
    assert capsys.readouterr().out == f"correct: none fits ({totals})\n"
    capsys.readouterr()
    assert zero.check_smallest_stage(1, 10**9, 2, 11e9, precision="mixed") is True   # fp32's smallest would be 2
    assert capsys.readouterr().out == (
        "correct: stage 1 (stage 0: 16.00 GB, stage 1: 10.00 GB, stage 2: 9.00 GB, stage 3: 8.00 GB)\n")
    assert zero.check_smallest_stage(0, 23_437_500, 1, 1e9) is True    # 0.375 GB each, exactly: rounded to even
    assert capsys.readouterr().out == (
        "correct: stage 0 (stage 0: 0.38 GB, stage 1: 0.38 GB, stage 2: 0.38 GB, stage 3: 0.38 GB)\n")
    assert raised(zero.check_smallest_stage, 3, 10**9, 8, 8e9) == (
        "Not quite: 3. Compare each stage's per-rank total with the budget.")


def test_paper_example_check_word_for_word(capsys):
    assert zero.check_paper_example(None) is False
    assert capsys.readouterr().out == "No answer yet: replace None with gigabytes (1e9 bytes) per GPU.\n"
    assert zero.check_paper_example(16.64) is True
    assert capsys.readouterr().out == "correct: 16.6 GB per GPU (the paper's Figure 1 says 16.6 GB)\n"
    assert raised(zero.check_paper_example, 31.4) == (
        "Not quite: 31.4. Mixed precision is 2 + 2 + 12 bytes per parameter; ZeRO-2 keeps the 2-byte parameters whole "
        "and divides gradients and optimizer state by 64.")


def test_paper_example_counts_within_one_percent_of_16_640625_gb():
    """7.5e9 * (2 + 2 / 64 + 12 / 64) bytes = 16.640625 GB; an answer is right within 1 % (+ 1e-9) of it."""
    assert zero.check_paper_example(16.80703125) is True            # 1 % above, a hair inside
    assert raised(zero.check_paper_example, 16.80703125 + 2.1e-9).startswith("Not quite")
    assert zero.check_paper_example(16.640625 * 0.99) is True
    assert raised(zero.check_paper_example, 16.640625 * 0.99 - 2.1e-9).startswith("Not quite")


def test_max_loss_gap_is_the_largest_absolute_difference_over_ranks_and_steps():
    assert zero.max_loss_gap({0: [1.0, 2.0], 1: [0.5]}, {0: [1.5, 1.0], 1: [0.5]}) == 1.0
    assert zero.max_loss_gap({0: [-1.0]}, {0: [1.0]}) == 2.0
    with pytest.raises(ValueError):   # records of different lengths are not compared step by step
        zero.max_loss_gap({0: [1.0, 2.0]}, {0: [1.0]})


def test_adam_scale_check_word_for_word(capsys):
    assert zero.check_adam_scale(None) is False
    assert capsys.readouterr().out == "No answer yet: replace None with a number: the factor.\n"
    assert zero.check_adam_scale(1) is True
    assert capsys.readouterr().out == (
        "correct: measured ratio 1.000000 (SGD's would be 2): a missing average over ranks barely shows in Adam's "
        "losses, which is one reason this chapter checks the math with SGD.\n")
    assert raised(zero.check_adam_scale, 2) == (
        "Not quite: 2. Adam divides the momentum m by sqrt(v); scale every gradient by c and m scales by c, sqrt(v) by "
        "|c| as well.")


def test_adam_update_ratio_shows_eps_once_gradients_are_tiny():
    """Scaled far below Adam's eps (1e-8), the update shrinks with the gradient: the ratio is measured, not assumed."""
    assert zero.adam_update_ratio(1.0) == 1.0
    assert zero.adam_update_ratio(1e-12) < 0.01
    near_eps = zero.adam_update_ratio(1e-8)
    assert 0.4 < near_eps < 0.5
    assert near_eps == zero.adam_update_ratio(1e-8, steps=3, seed=0)      # seeded, three steps by default
    assert near_eps != zero.adam_update_ratio(1e-8, steps=4) and near_eps != zero.adam_update_ratio(1e-8, seed=1)


def test_zero1_load_check_word_for_word(capsys):
    assert zero.check_zero1_load(None, 2) is False
    assert capsys.readouterr().out == "No answer yet: replace None with a list of ranks.\n"
    assert zero.check_zero1_load(["1", 0], 2) is True
    assert capsys.readouterr().out == (
        "correct: every rank calls load_state_dict with the whole state and keeps its own partition\n")
    assert raised(zero.check_zero1_load, [0], 2) == (
        "Rank 0 saved the file, but every rank's optimizer holds a share: each must load the consolidated state and "
        "keep the part it owns.")
    assert raised(zero.check_zero1_load, [0, 1, 2], 2) == "Not quite: [0, 1, 2]. Which ranks hold optimizer state?"


def test_states_table_word_for_word():
    predicted = zero.zero_bytes(PSI, 2, 1)
    text = zero.states_table([("a", {**predicted.as_dict(), "master": 500}, predicted),
                              ("bb", predicted.as_dict(), predicted)])
    assert text.splitlines() == [
        "MB: measured/predicted       params             grads         optimizer            master             total",
        "a                            0.004/0.004       0.004/0.004       0.004/0.004       0.001/0.000"
        "       0.013/0.012",
        "bb                           0.004/0.004       0.004/0.004       0.004/0.004       0.000/0.000"
        "       0.012/0.012"]
    assert zero.states_table([("a", predicted.as_dict(), predicted)], unit=1e3).splitlines()[1].split()[1] == (
        "4.000/4.000")


def test_a_long_label_widens_the_states_table():
    predicted = zero.zero_bytes(PSI, 2, 1)
    label = "ZeroRedundancyOptimizer, whole"
    lines = zero.states_table([(label, predicted.as_dict(), predicted)]).splitlines()
    assert lines[1].startswith(label + "  " + " " * 5 + "0.004") and lines[0].index("params") == len(label) + 2 + 5


def test_assert_states_match_word_for_word_and_its_edge():
    predicted = zero.zero_bytes(PSI, 2, 2)
    allowed = {"params": 10, "grads": 20, "optimizer": 30, "master": 40}
    good = predicted.as_dict()
    edge = {"params": good["params"] - 10, "grads": good["grads"] + 20, "optimizer": good["optimizer"] + 30,
            "master": 40}
    zero.assert_states_match("edge", edge, predicted, allowed)   # off by exactly what is allowed: fine
    for kind in ("params", "grads", "optimizer", "master"):
        off = {**edge, kind: edge[kind] + (-1 if kind == "params" else 1)}
        with pytest.raises(AssertionError, match=f"^edge {kind}: "):
            zero.assert_states_match("edge", off, predicted, allowed)
    with pytest.raises(AssertionError) as caught:
        zero.assert_states_match("ZeRO-2", {**good, "grads": 12_345.6}, predicted, {**allowed, "grads": 1_024})
    assert str(caught.value) == "ZeRO-2 grads: measured 12,346 B, predicted 2,000 B (allowed ±1,024)"


def test_allowed_bytes_for_the_master_copy_and_without_a_bucket():
    model = zero.deep_mlp(16, 2)
    allowed = zero.allowed_bytes(model)
    assert allowed == {"params": zero.PAD_BYTES, "master": zero.PAD_BYTES, "grads": 4 * 2 * 256 + zero.PAD_BYTES,
                       "optimizer": zero.PAD_BYTES}


def test_model_states_as_dict_names_every_kind():
    states = zero.ModelStates(params=1.0, grads=2.0, optimizer=3.0, master=4.0)
    assert states.as_dict() == {"params": 1.0, "grads": 2.0, "optimizer": 3.0, "master": 4.0, "total": 10.0}
    assert zero.ModelStates(1, 2, 3).master == 0.0


def test_deep_mlp_shape_by_default():
    model = zero.deep_mlp()
    linears = [m for m in model if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(10, 256)] + [(256, 256)] * 16 + [(256, 2)]
    assert [type(m) for m in model][:2] == [nn.Linear, nn.ReLU] and isinstance(model[-1], nn.Linear)
    assert sum(isinstance(m, nn.ReLU) for m in model) == 17


def test_skip_shm_comm_build_message_word_for_word(monkeypatch):
    import deepspeed.ops as ops

    monkeypatch.delitem(ops.__compatible_ops__, "deepspeed_shm_comm")
    with pytest.raises(RuntimeError) as caught:
        zero.skip_shm_comm_build()
    assert str(caught.value) == (
        "DeepSpeed's private op table has no 'deepspeed_shm_comm' entry any more: this workaround no longer applies; "
        "find the new switch or let DeepSpeed build the op.")


class FakeEngine:
    """What measure_ds_step uses of a DeepSpeed engine: call, backward, step, optimizer, module."""

    def __init__(self, module, optimizer):
        self.module, self.optimizer, self.calls = module, optimizer, []

    def __call__(self, x):
        return self.module(x)

    def backward(self, loss):
        self.calls.append("backward")
        loss.backward()

    def step(self):
        self.calls.append("step")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)


def test_measure_ds_step_measures_an_engine_like_a_plain_adam_step():
    torch.manual_seed(0)
    model = SimpleModel()
    psi = zero.count_params(model)
    engine = FakeEngine(model, torch.optim.Adam(model.parameters()))
    states = zero.measure_ds_step(engine, *_batch())
    assert engine.calls == ["backward", "step"]
    assert states == zero.ModelStates(params=4 * psi, grads=4 * psi, optimizer=8 * psi, master=0)
    assert all(p.grad is not None for p in model.parameters())       # the step happened; hooks are gone:
    assert not any(p._post_accumulate_grad_hooks for p in model.parameters())


def test_measure_ds_step_counts_a_master_copy_and_the_peak_before_the_step_frees_gradients():
    torch.manual_seed(0)
    model = SimpleModel()
    psi = zero.count_params(model)
    copy = [p.detach().clone().requires_grad_() for p in model.parameters()]

    class CopyingEngine(FakeEngine):   # ZeRO-1/2 style: the optimizer steps an fp32 copy, then drops the gradients
        def step(self):
            self.calls.append("step")
            for c, p in zip(copy, self.module.parameters(), strict=True):
                c.grad = p.grad.clone()
            self.optimizer.step()
            for p in self.module.parameters():
                p.grad = None

    engine = CopyingEngine(model, torch.optim.Adam(copy))
    states = zero.measure_ds_step(engine, *_batch())
    assert states == zero.ModelStates(params=4 * psi, grads=4 * psi, optimizer=8 * psi, master=4 * psi)


def test_measure_ds_step_counts_the_engines_gradient_partition_buffer():
    """DeepSpeed's optimizer keeps reduced gradients in a partition buffer: the peak counts it (GradPeak is
    given the engine's optimizer)."""
    torch.manual_seed(0)
    model = SimpleModel()
    psi = zero.count_params(model)

    class ZeroOptimizer:   # DeepSpeed's wrapper: the torch optimizer inside, and a gradient partition buffer
        def __init__(self, optimizer):
            self.optimizer, self.grads_in_partition = optimizer, torch.zeros(100)

        def step(self):
            self.optimizer.step()

        def zero_grad(self, set_to_none=True):
            self.optimizer.zero_grad(set_to_none=set_to_none)

    engine = FakeEngine(model, ZeroOptimizer(torch.optim.Adam(model.parameters())))
    states = zero.measure_ds_step(engine, *_batch())
    assert states == zero.ModelStates(params=4 * psi, grads=400 + 4 * psi, optimizer=8 * psi, master=0)


def test_measure_torch_step_counts_an_optimizer_that_updates_a_copy():
    torch.manual_seed(0)
    model = SimpleModel()
    psi = zero.count_params(model)
    copy = [p.detach().clone().requires_grad_() for p in model.parameters()]
    states = zero.measure_torch_step(model, torch.optim.SGD(copy, lr=0.1, momentum=0.9), *_batch())
    assert states.master == 4 * psi and states.params == 4 * psi and states.grads == 4 * psi


def test_isolated_ranks_each_train_alone_on_their_shard():
    """average=False: rank r's losses are those of one model (rank 0's start) trained by plain SGD on r's shard."""
    alone = zero.reference_losses(SimpleModel, DATA, 2, batch_size=32, epochs=1, lr=0.1, average=False)
    torch.manual_seed(0)
    start = SimpleModel().state_dict()
    for rank in (0, 1):
        model = SimpleModel()
        model.load_state_dict(start)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sampler = torch.utils.data.distributed.DistributedSampler(DATA, num_replicas=2, rank=rank)
        want = []
        for x, y in torch.utils.data.DataLoader(DATA, batch_size=32, sampler=sampler):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            want.append(loss.item())
        assert alone[rank] == pytest.approx(want, abs=1e-6)


def test_measure_torch_step_starts_from_zeroed_gradients():
    torch.manual_seed(0)
    model = SimpleModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x, y = _batch()
    nn.functional.cross_entropy(model(x), y).backward()
    stale = [p.grad.clone() for p in model.parameters()]
    zero.measure_torch_step(model, opt, x, y)
    assert all(torch.allclose(p.grad, g) for p, g in zip(model.parameters(), stale, strict=True))  # not doubled


class Sharded:
    """A DTensor's face, as the counters see one (FSDP2): its local shard comes from to_local()."""

    def __init__(self, local):
        self.local = local

    def to_local(self):
        return self.local


def test_counters_read_a_sharded_tensors_local_shard():
    shard = torch.zeros(10)
    assert zero.storage_bytes([Sharded(shard), shard[:5]]) == 40
    assert zero.storage_bytes([Sharded(torch.empty(0))]) == 0


def test_storage_bytes_skips_only_empty_tensors():
    assert zero.storage_bytes([torch.zeros(1)]) == 4
    assert zero.storage_bytes([torch.empty(0), None, torch.zeros(3)]) == 12


def test_param_tensors_include_a_stage_3_partition():
    model = nn.Linear(2, 2)
    assert zero.storage_bytes(zero.param_tensors(model)) == 6 * 4
    model.weight.ds_tensor = torch.zeros(7)      # DeepSpeed's stage 3: the rank's partition of this parameter
    assert zero.storage_bytes(zero.param_tensors(model)) == 6 * 4 + 7 * 4


def test_base_optimizer_unwraps_an_optim_attribute():
    inner = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)

    class Wrapper:
        optim = inner

    class Outer:
        optimizer = Wrapper()

    assert zero.base_optimizer(Wrapper()) is inner and zero.base_optimizer(Outer()) is inner


def test_grad_peak_starts_at_zero_and_may_be_removed_twice():
    model = nn.Linear(2, 2)
    peak = zero.GradPeak(model)
    assert peak.sample() == 0 and peak.peak == 0
    peak.remove()
    peak.remove()
    model(torch.ones(1, 2)).sum().backward()
    assert peak.peak == 0                        # no hook left to sample


def test_grad_peak_counts_the_optimizers_partition_buffer():
    model = nn.Linear(2, 2)

    class ZeroOptimizer:
        grads_in_partition = torch.zeros(50)

    peak = zero.GradPeak(model, ZeroOptimizer())
    assert peak.sample() == 200
    peak.remove()
