"""distlab.teach.perf and distlab.plots.perf: pure logic directly, DDP in a one-rank group in this process."""
import importlib.util
import math
import time
from pathlib import Path

import matplotlib
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from distlab.teach import perf

matplotlib.use("Agg")

LAUNCH_OUT = """launcher            median s   min s  runs  vs bare
distlab                2.889   2.889     1     1.05
bare                   2.757   2.757     1     1.00
mp.spawn script        5.123   5.123     1     1.86
torchrun               4.840   4.840     1     1.76
ratio: 1.048
"""
ALLREDUCE_OUT = """ranks    size  impl   time (us)  algbw GB/s  busbw GB/s  checked
    2   64 KB  gloo       361.2       0.181       0.181     True
    2    1 MB  gloo      2479.0       0.423       0.423     True
peak busbw gloo 2 ranks: 1.349 GB/s at 16 MB; one-thread memcpy of 16 MB: 13.00 GB/s
ratio: 0.207
"""
SMALL = perf.Workload("small", 64, 64, classify=False)  # make_mlp(64): 10 layers of 16,640 bytes


@pytest.fixture
def group():
    with perf.single_rank_group():
        yield


# ------------------------------------------------------------------ buckets


@pytest.mark.parametrize("cap_mb", [0.5, 1, 4, 25, 100])
@pytest.mark.parametrize("width,depth", [(1024, 10), (512, 6), (300, 3)])
def test_bucket_plan_matches_torchs_assignment(width, depth, cap_mb):
    model = perf.make_mlp(width, depth)
    cap = int(cap_mb * 2**20)
    ours = perf.bucket_plan(perf.ready_order_bytes(model), cap)
    theirs, _ = dist._compute_bucket_assignment_by_size(list(reversed(list(model.parameters()))), [cap])
    assert ours == [list(b) for b in theirs]


def test_bucket_plan_with_a_small_first_bucket_matches_torch():
    model = perf.make_mlp()
    ours = perf.bucket_plan(perf.ready_order_bytes(model), 25 * 2**20, first_cap_bytes=2**20)
    theirs, _ = dist._compute_bucket_assignment_by_size(list(reversed(list(model.parameters()))),
                                                        [2**20, 25 * 2**20])
    assert ours == [list(b) for b in theirs] and len(ours) == 3


def test_bucket_plan_closes_a_bucket_once_it_reaches_the_cap():
    assert perf.bucket_plan([4, 4, 4, 4], cap_bytes=8) == [[0, 1], [2, 3]]
    assert perf.bucket_plan([4, 4, 4], cap_bytes=5) == [[0, 1], [2]]
    assert perf.bucket_plan([100, 1, 1], cap_bytes=8) == [[0], [1, 2]]
    assert perf.bucket_plan([], cap_bytes=8) == []


def test_mlp_sizes():
    model = perf.make_mlp()
    assert perf.n_params(model) == 10_496_000 and perf.grad_bytes(model) == 41_984_000
    assert perf.ready_order_bytes(model)[:2] == [1024 * 4, 1024 * 1024 * 4]  # last layer's bias first


# ------------------------------------------------------------------ DDP at world size 1


def test_plain_vs_ddp_at_world_size_one_changes_no_number(group):
    r = perf.plain_vs_ddp(perf.WORKLOADS["SimpleModel"], batch=8, repeats=2)
    assert r["param_diff"] == 0.0
    assert set(r["plain"]) == set(r["ddp"]) == {*perf.PHASES, "step"}
    assert r["checksums"]["plain"] == r["checksums"]["ddp"]   # one rank: DDP trains exactly like the module
    assert r["ddp_stats"]["buckets"] == 1 and r["ddp_stats"]["comm"] > 0   # ... yet it all-reduced a bucket


def test_plain_vs_ddp_sees_a_slower_ddp_step(group, monkeypatch):
    """The ratio is DDP over plain. On a fake clock (1 ms per reading, and every DDP forward 20 ms more), the DDP
    step must come out 20 ms longer than the plain one, whatever the machine's load."""
    clock = {"now": 0.0}

    def perf_counter():
        clock["now"] += 0.001
        return clock["now"]

    ddp_forward = nn.parallel.DistributedDataParallel.forward

    def slow_forward(self, *args, **kwargs):
        clock["now"] += 0.020
        return ddp_forward(self, *args, **kwargs)

    monkeypatch.setattr(perf.time, "perf_counter", perf_counter)
    monkeypatch.setattr(nn.parallel.DistributedDataParallel, "forward", slow_forward)
    r = perf.plain_vs_ddp(SMALL, batch=4, repeats=3)
    assert r["ddp"]["step"] - r["plain"]["step"] == pytest.approx(0.020)
    assert r["ddp"]["forward"] - r["plain"]["forward"] == pytest.approx(0.020)
    assert r["ratio"] == pytest.approx((r["plain"]["step"] + 0.020) / r["plain"]["step"]) and r["ratio"] > 1


def test_without_dividing_by_k_the_gradient_is_k_times_too_large(group):
    """The check can fail: summing k micro-batch losses is not the large-batch mean."""
    w = perf.WORKLOADS["SimpleModel"]
    torch.manual_seed(0)
    base = w.model()
    ddp = nn.parallel.DistributedDataParallel(w.model())
    ddp.module.load_state_dict(base.state_dict())
    x, y = perf.global_batch(w, 1, 4, 3)
    reference = perf.large_batch_grads(base, x, y, w.loss)
    for xs, ys in perf.my_micro_batches(x, y, 0, 1, 4):
        w.loss(ddp(xs), ys).backward()
    assert perf.max_grad_diff(ddp.module, reference) > 1e-3
    pairs = zip(ddp.module.parameters(), reference, strict=True)
    assert all(torch.allclose(p.grad, 4 * r, atol=1e-6) for p, r in pairs)


def test_profile_counts_one_allreduce_per_bucket(group):
    r = perf.profile_ddp_step(SMALL, batch=4, bucket_cap_mb=0.07)
    assert r["allreduce_calls"] == r["buckets"] == 2
    assert "DistributedDataParallel.forward" in r["table"]


def test_no_sync_timing_times_the_given_accumulation_per_sample(group):
    calls = []

    def accumulate(ddp, micro_batches, loss_fn):
        calls.append(len(micro_batches))
        time.sleep(0.01 * len(micro_batches))   # 10 ms per micro-batch of 2 samples: 5 ms per sample
        loss_fn(ddp(micro_batches[0][0]), micro_batches[0][1]).backward()

    t = perf.no_sync_timing(SMALL, [1, 2], micro=2, accumulate=accumulate, repeats=1)
    assert sorted(set(calls)) == [1, 2]                    # warm-up and timed rounds, every k
    assert set(t) == {1, 2} and all(0.005 <= v < 0.5 for v in t.values())   # seconds per sample, not per step


def test_threads_is_restored():
    before = torch.get_num_threads()
    with perf.threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_single_rank_group_cleans_up():
    with perf.single_rank_group():
        assert dist.get_world_size() == 1
    assert not dist.is_initialized()


# ------------------------------------------------------------------ timing


def test_alternate_rotates_the_order_and_calls_before_untimed():
    log = []
    fns = {name: (lambda name=name: log.append(name) or name) for name in "abc"}
    out = perf.alternate(fns, repeats=3, warmup=1, before=lambda: log.append("|"))
    assert out == {"a": ["a"] * 3, "b": ["b"] * 3, "c": ["c"] * 3}
    assert "".join(log) == "abc" + "|a|b|c" + "|b|c|a" + "|c|a|b"


def test_median_phases_takes_the_median_of_each_key():
    samples = [{"step": 1.0, "forward": 5.0}, {"step": 3.0, "forward": 1.0}, {"step": 2.0, "forward": 2.0}]
    assert perf.median_phases(samples) == {"step": 2.0, "forward": 2.0}
    assert perf.ratios({"a": 2.0, "b": 3.0}, "a") == {"a": 1.0, "b": 1.5}


def test_step_phases_are_positive_and_add_up():
    model = perf.make_mlp(16, 2)
    t = perf.step_phases(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(4, 16),
                         torch.randn(4, 16), SMALL.loss)
    assert all(t[p] > 0 for p in perf.PHASES)
    assert math.isclose(sum(t[p] for p in perf.PHASES), t["step"], rel_tol=1e-9)


# ------------------------------------------------------------------ fits and tables


def test_fit_recovers_alpha_and_beta():
    sizes = [4 * 4**i for i in range(12)]
    alpha, beta = perf.fit_alpha_beta(sizes, [50e-6 + n / 1.2e9 for n in sizes])
    assert math.isclose(alpha, 50e-6, rel_tol=1e-6) and math.isclose(beta, 1.2e9, rel_tol=1e-6)
    assert math.isclose(perf.crossover_bytes(alpha, beta), 60_000, rel_tol=1e-6)
    assert perf.regime(1024, alpha, beta) == "latency" and perf.regime(2**20, alpha, beta) == "bandwidth"


def test_fit_weighs_small_messages():
    sizes = [4, 4096, 4 * 2**20]
    alpha, _ = perf.fit_alpha_beta(sizes, [30e-6, 40e-6, 4.2e-3])
    assert 20e-6 < alpha < 45e-6


def test_parse_table_reads_both_benchmarks():
    rows = perf.parse_table(LAUNCH_OUT)
    assert [r["launcher"] for r in rows] == ["distlab", "bare", "mp.spawn script", "torchrun"]
    assert rows[2]["vs bare"] == 1.86 and rows[0]["runs"] == 1.0
    assert perf.last_ratio(LAUNCH_OUT) == 1.048
    rows = perf.parse_table(ALLREDUCE_OUT)
    assert len(rows) == 2 and rows[1]["size"] == "1 MB" and rows[1]["time (us)"] == 2479.0
    assert rows[0]["checked"] == "True"


def test_parse_errors_are_clear():
    with pytest.raises(ValueError, match="no table"):
        perf.parse_table("nothing here\n")
    with pytest.raises(ValueError, match="ratio: X"):
        perf.last_ratio("ratio: 1.0\nsomething else")


def test_bench_script_is_found():
    assert perf.bench_script("ddp_overhead.py").name == "ddp_overhead.py"
    with pytest.raises(FileNotFoundError, match="no_such.py"):
        perf.bench_script("no_such.py")


def test_shipped_benchmarks_run_from_the_package_and_bench_only_wraps_them():
    """A chapter opened alone has no bench/ beside it: what it runs is in the package (run with -m), and
    bench/<name> is a thin wrapper of that module, no second copy of its code."""
    import ast

    bench = Path(__file__).resolve().parents[1] / "bench"
    for name, module in perf.SHIPPED_BENCHES.items():
        assert importlib.util.find_spec(module) is not None, module
        assert perf.bench_command(name)[1:] == ["-m", module]
        text = (bench / name).read_text()
        assert f"from {module} import main" in text
        assert not [n for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]


def test_ddp_overhead_bench_prints_the_headline_last(capsys):
    spec = importlib.util.spec_from_file_location("ddp_overhead", perf.bench_script("ddp_overhead.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = {"plain": {"step": 0.1}, "ddp": {"step": 0.104}, "ratio": 1.04}
    rows = [bench._row(1, "MLP-10M", 64, "DDP", result)]
    bench.print_table(rows)
    out = capsys.readouterr().out
    table = perf.parse_table(out)
    assert table[0]["DDP/plain"] == 1.04 and table[0]["params"] == 10_496_000


# ------------------------------------------------------------------ exercise checks


def test_check_bucket_count():
    model = perf.make_mlp(512, depth=6)
    assert perf.check_bucket_count(None, model, 2.5) is False
    assert perf.check_bucket_count(2, model, 2.5) is True
    with pytest.raises(AssertionError, match="last layer first"):
        perf.check_bucket_count(3, model, 2.5)


def test_check_allreduce_bytes():
    model = perf.WORKLOADS["SimpleModel"].model()
    assert perf.check_allreduce_bytes(None, model, 2, 4, 8) is False
    assert perf.check_allreduce_bytes(25008 / 64, model, 2, 4, 8) is True
    with pytest.raises(AssertionError, match="world \\* k \\* micro"):
        perf.check_allreduce_bytes(25008 / 8, model, 2, 4, 8)


# ------------------------------------------------------------------ plots


def test_plots_draw_ratios():
    from distlab.plots import perf as plots

    figs = [
        plots.plot_launch(["distlab", "bare"], [1.05, 1.0]),
        plots.plot_message_size([4, 1024, 2**20], [5e-5, 6e-5, 1e-3], 5e-5, 1.1e9),
        plots.plot_overhead({"A": {1: 1.02, 2: 1.5}, "B": {1: 1.1}}),
        plots.plot_buckets({1: {"step": 1.1, "buckets": 10}, 25: {"step": 1.0, "buckets": 2}}, baseline=25),
        plots.plot_no_sync([1, 2, 4], [100.0, 50.0, 25.0], [1.0, 0.7, 0.6]),
        plots.plot_phases({"forward": 1, "backward": 2, "optimizer": 1, "step": 4},
                          {"forward": 1, "backward": 3, "optimizer": 1, "step": 5}, comm=2.0, overlap=1.5),
    ]
    assert [len(f.axes) for f in figs] == [1, 1, 1, 1, 2, 1]
    bars = figs[3].axes[0].patches
    assert [round(b.get_height(), 2) for b in bars] == [1.1, 1.0]  # relative to the baseline cap
    import matplotlib.pyplot as plt

    for f in figs:
        plt.close(f)


def fp16_like_torch(state, bucket):
    buffer = bucket.buffer()
    half = buffer.to(torch.float16).div_(dist.get_world_size())

    def back(fut):
        buffer.copy_(fut.value()[0])
        return buffer

    return dist.all_reduce(half, async_op=True).get_future().then(back)


def fp32_allreduce(state, bucket):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.allreduce_hook(None, bucket)


def bfloat16_instead(state, bucket):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.bf16_compress_hook(None, bucket)


def test_check_fp16_hook():
    assert perf.check_fp16_hook(None) is False
    assert perf.check_fp16_hook(fp16_like_torch) is True
    with pytest.raises(AssertionError, match="not all-reduced in float16"):
        perf.check_fp16_hook(fp32_allreduce)
    with pytest.raises(AssertionError, match="not the same as torch's fp16_compress_hook"):
        perf.check_fp16_hook(bfloat16_instead)
    assert not dist.is_initialized()


def test_bucket_timeline_plot_has_a_row_per_bucket_and_a_panel_per_rank():
    from distlab.plots import perf as plots

    t = {"start": 0.0, "end": 0.05, "ready": [(1, 0.001), (0, 0.02)], "launched": [(0, 0.002), (1, 0.021)],
         "done": [(0, 0.01), (1, 0.04)], "members": {0: [1], 1: [0]}}
    fig = plots.plot_bucket_timeline({0: t, 1: t})
    assert len(fig.axes) == 2
    ax = fig.axes[0]
    assert [tick.get_text() for tick in ax.get_yticklabels()] == ["gradients", "bucket 0", "bucket 1"]
    bars = sorted(ax.patches, key=lambda b: b.get_y())
    assert [(round(b.get_x(), 3), round(b.get_width(), 3)) for b in bars] == [(2.0, 8.0), (21.0, 19.0)]   # ms
    import matplotlib.pyplot as plt

    plt.close(fig)
