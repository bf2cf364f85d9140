"""Teaching helpers of the introduction and chapters 1-2 (DP vs DDP, process-group setup): no ranks launched.
Processes started: plain Python children whose output the introduction's capture collects and the process pool
of the GIL experiment; chapter 2's stores listen in this process. Chapter 3's checks are in test_teach_toy.py."""
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta

import matplotlib
import pytest
import torch

from distlab.teach import dp_vs_ddp as ch1
from distlab.teach import intro
from distlab.teach import process_group as ch2
from distlab.teach import toy as ch3
from distlab.teach.models import ToyModel

matplotlib.use("Agg")


# --- introduction -------------------------------------------------------------------------------

def test_child_output_collects_what_a_child_process_writes_to_the_descriptor():
    code = "import sys; print('to stdout'); print('to stderr', file=sys.stderr)"
    with intro.child_stdout() as out, intro.child_stderr() as err:
        subprocess.run([sys.executable, "-c", code], check=True)
    assert out == ["to stdout"] and err == ["to stderr"]


@pytest.mark.parametrize("kernel_has", ["1", None])
def test_children_in_the_block_print_each_line_in_one_write_and_the_kernel_keeps_its_setting(monkeypatch, kernel_has):
    """PYTHONUNBUFFERED makes print write its text and its newline apart, and two ranks printing at once
    interleaved them ("hello from rank 1 of 2hello from rank 0 of 2") on a busy CI machine: the children
    of the block start without it, buffered, and the kernel's own setting comes back after it."""
    if kernel_has is None:
        monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    else:
        monkeypatch.setenv("PYTHONUNBUFFERED", kernel_has)
    code = "import os, sys; print(os.environ.get('PYTHONUNBUFFERED'), type(sys.stdout.buffer).__name__)"
    with intro.child_stdout() as out:
        subprocess.run([sys.executable, "-c", code], check=True)
    assert out == ["None BufferedWriter"]  # no setting, and a buffer between print and the file
    assert os.environ.get("PYTHONUNBUFFERED") == kernel_has


# --- chapter 1 ----------------------------------------------------------------------------------

def test_spin_is_the_sum_of_squares_and_its_timeline_has_a_stamp_per_chunk():
    assert ch1.spin(5) == 0 + 1 + 4 + 9 + 16
    cpu, stamps = ch1.spin_timeline(10 * ch1.CHUNK)
    assert cpu > 0 and len(stamps) == 11 and stamps == sorted(stamps)


def test_together_is_the_share_of_time_two_timelines_run_at_once():
    step = 1.0
    first = [0.0, 1.0, 2.0, 3.0, 4.0]            # runs 0..4
    second = [2.0, 3.0, 4.0, 5.0, 6.0]           # runs 2..6: both run 2..4, either 0..6
    assert ch1.together([first, second]) == pytest.approx(2 / 6)
    assert ch1.together([first, [t + 4 * step for t in first]]) == 0.0   # one after the other
    assert ch1.together([first, list(first)]) == 1.0


def test_together_leaves_out_a_span_with_a_wait_inside():
    # the GIL's turn: the first worker's span 1..7 held a wait of 5, so it did not run while the second did
    first = [0.0, 1.0, 7.0, 8.0]
    second = [2.0, 3.0, 4.0, 5.0, 6.0]
    assert ch1.together([first, second]) == 0.0
    assert ch1.running_intervals(first, max_gap=1.5) == [(0.0, 1.0), (7.0, 8.0)]


def test_threads_are_never_running_python_together_nor_keep_more_than_one_core_busy():
    pool = ch1.make_pool("threads", 2)
    try:
        run = ch1.time_pool("threads", 2, 300_000, pool)
    finally:
        pool.shutdown()
    assert run["wall"] > 0 and run["cores"] <= 1.1 and run["together"] <= ch1.THREADS_MAX_TOGETHER


def test_a_serial_run_is_never_together():
    run = ch1.time_pool("serial", 2, 100_000)
    assert run["together"] == pytest.approx(0.0, abs=1e-9) and run["cores"] <= 1.1


def test_gil_experiment_reports_every_kind():
    results, rounds = ch1.gil_experiment(iterations=50_000, workers=2, rounds=1, max_rounds=1)
    assert set(results) == set(ch1.KINDS) and rounds == 1
    assert all(r["wall"] > 0 and r["cores"] > 0 and 0 <= r["together"] <= 1 for r in results.values())
    assert results["threads"]["together"] <= ch1.THREADS_MAX_TOGETHER
    assert ch1.speedups(results)["serial"] == 1.0


def test_gil_experiment_goes_on_until_the_processes_were_together_and_stops_at_its_limits(monkeypatch):
    def measured(together):
        def time_pool(kind, workers, iterations, pool=None):
            return {"wall": 1.0, "cores": 1.0, "together": together if kind == "processes" else 0.0}
        return time_pool

    monkeypatch.setattr(ch1, "time_pool", measured(0.0))       # a machine that never lets them run at once
    assert ch1.gil_experiment(iterations=10, rounds=1, max_rounds=3, max_seconds=60)[1] == 3
    assert ch1.gil_experiment(iterations=10, rounds=2, max_rounds=50, max_seconds=0)[1] == 2
    monkeypatch.setattr(ch1, "time_pool", measured(ch1.PROCESSES_MIN_TOGETHER))   # seen at once: done
    results, rounds = ch1.gil_experiment(iterations=10, rounds=1, max_rounds=50, max_seconds=60)
    assert rounds == 1 and results["processes"]["together"] == ch1.PROCESSES_MIN_TOGETHER


def test_keep_best_keeps_the_fastest_wall_and_the_largest_together():
    best = {"wall": float("inf"), "cores": 0.0, "together": 0.0}
    ch1._keep_best(best, {"wall": 2.0, "cores": 1.0, "together": 0.3})
    ch1._keep_best(best, {"wall": 1.0, "cores": 1.9, "together": 0.1})
    ch1._keep_best(best, {"wall": 3.0, "cores": 0.5, "together": 0.6})
    assert best == {"wall": 1.0, "cores": 1.9, "together": 0.6}



def test_speedups_divide_serial_by_each_kind():
    got = ch1.speedups({"serial": {"wall": 2.0}, "threads": {"wall": 2.0}, "processes": {"wall": 1.0}})
    assert got == {"serial": 1.0, "threads": 1.0, "processes": 2.0}


def test_shard_splits_evenly_and_refuses_uneven_batches():
    t = torch.arange(8)
    assert ch1.shard(t, 1, 2).tolist() == [4, 5, 6, 7]
    assert torch.cat([ch1.shard(t, r, 4) for r in range(4)]).tolist() == t.tolist()
    with pytest.raises(ValueError, match="evenly"):
        ch1.shard(torch.arange(7), 0, 2)


def test_averaged_shard_gradients_equal_the_full_batch_gradient():
    torch.manual_seed(1)
    model, x, y = ToyModel(), torch.randn(8, 10), torch.randn(8, 5)
    reference = ch1.full_batch_grads(model, x, y)
    assert ch3.max_abs_diff(ch1.simulated_ddp_grads(model, x, y, 2), reference) < 1e-6
    assert ch3.max_abs_diff(ch1.full_batch_grads(model, x[:4], y[:4]), reference) > 1e-3
    summed = ch1.simulated_ddp_grads(model, x, y, 2, reduction="sum")
    assert torch.allclose(summed["net2.bias"], 20 * reference["net2.bias"], rtol=1e-4)


def test_time_steps_reports_milliseconds_per_timed_call():
    calls = []

    def step():
        calls.append(1)
        time.sleep(0.02 if len(calls) > 2 else 0.5)  # the two warm-up calls are slow and not timed

    ms = ch1.time_steps(step, steps=5, warmup=2)
    assert len(calls) == 7 and 20 <= ms < 400


def test_check_sum_loss_factor(capsys):
    ch1.check_sum_loss_factor(20)
    assert capsys.readouterr().out.startswith("correct")
    with pytest.raises(AssertionError, match="every element"):
        ch1.check_sum_loss_factor(4)
    with pytest.raises(AssertionError, match="averages over ranks"):
        ch1.check_sum_loss_factor(40)
    with pytest.raises(AssertionError, match="is not it"):
        ch1.check_sum_loss_factor(1)


def test_check_dp_every_step(capsys):
    ch1.check_dp_every_step(["Scatter", "replicate", "gather"])
    assert capsys.readouterr().out.startswith("correct")
    with pytest.raises(AssertionError, match="all_reduce is DDP's"):
        ch1.check_dp_every_step({"scatter", "replicate", "gather", "all_reduce"})
    with pytest.raises(AssertionError, match="also does"):
        ch1.check_dp_every_step({"scatter"})
    with pytest.raises(AssertionError, match="not one of the choices"):
        ch1.check_dp_every_step({"broadcast"})


# --- chapter 2 ----------------------------------------------------------------------------------

def test_free_port_is_free_and_a_listening_port_is_not():
    port = ch2.free_port()
    assert ch2.port_is_free(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert not ch2.port_is_free(s.getsockname()[1])
        assert ch2.listening_addresses(s.getsockname()[1]) == {"127.0.0.1"}
        with pytest.raises(TimeoutError, match=str(s.getsockname()[1])):
            ch2.wait_for_free_port(s.getsockname()[1], timeout=0.2, poll=0.05)
    assert ch2.wait_for_free_port(port, timeout=1) < 1


def test_the_articles_port_is_used_when_free_and_replaced_with_a_word_when_held(capsys):
    port = ch2.free_port()
    assert ch2.port_for_article(port, wait_s=0.5) == port and capsys.readouterr().out == ""
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen()
        held = s.getsockname()[1]
        other = ch2.port_for_article(held, wait_s=0.3)
        assert other != held and ch2.port_is_free(other)
    said = capsys.readouterr().out
    assert said.startswith(f"Port {held} is in use on this machine right now (held by a process of yours: pid "
                           f"{os.getpid()} (") and f"runs on port {other} instead" in said


@pytest.mark.parametrize("addresses, expected", [
    (set(), "nobody"), ({"0.0.0.0"}, "all interfaces"), ({"::"}, "all interfaces"),
    ({"127.0.0.1"}, "loopback only"), ({"::1", "::ffff:127.0.0.1"}, "loopback only"),
    ({"10.1.2.3"}, "specific interfaces"), ({"127.0.0.1", "::"}, "all interfaces"),
])
def test_reach(addresses, expected):
    assert ch2.reach(addresses) == expected


def test_tcpstore_listens_on_all_interfaces_even_for_a_loopback_host():
    store = torch.distributed.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False,
                                       timeout=timedelta(seconds=10))
    assert ch2.reach(ch2.listening_addresses(store.port)) == "all interfaces"


def test_a_store_given_a_loopback_socket_listens_on_loopback_only():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    store = torch.distributed.TCPStore("127.0.0.1", port, 1, is_master=True, wait_for_workers=False,
                                       timeout=timedelta(seconds=10), master_listen_fd=sock.detach())
    store.set("k", "v")
    assert ch2.reach(ch2.listening_addresses(port)) == "loopback only"


def test_backends_available_has_gloo():
    available = ch2.backends_available()
    assert set(available) == {"gloo", "nccl", "mpi"} and available["gloo"] is True


def test_exercise_checks_of_chapter_2(capsys):
    ch2.check_no_port_needed({"file://", "FileStore"})
    ch2.check_store_counter(6, world_size=2, adds_per_rank=3)
    assert capsys.readouterr().out.count("correct") == 2
    with pytest.raises(AssertionError, match="open a TCP port"):
        ch2.check_no_port_needed({"file://", "filestore", "env://"})
    with pytest.raises(AssertionError, match="Also"):
        ch2.check_no_port_needed({"file://"})
    with pytest.raises(AssertionError, match="not one of the choices"):
        ch2.check_no_port_needed({"udp://"})
    with pytest.raises(AssertionError, match="atomic"):
        ch2.check_store_counter(3, world_size=2, adds_per_rank=3)


# --- plots --------------------------------------------------------------------------------------

def test_plots_return_figures():
    from distlab.plots import dp_vs_ddp as plots

    results = {k: {"wall": 1.0, "cores": 0.9, "together": 0.0} for k in ch1.KINDS}
    assert len(plots.plot_gil(results).axes) == 3
    grads = ch3.snapshot(ToyModel())
    assert len(plots.plot_grad_agreement(grads, {0: grads, 1: grads}).axes) == 1
    fig = plots.plot_replica_drift([0.0, 0.0], [1e-4, 2e-4])
    assert len(fig.axes[0].lines) == 2


def test_data_parallel_figure_draws_every_step_for_every_device():
    from distlab.plots import dp_vs_ddp as plots

    texts = [t.get_text() for t in plots.plot_data_parallel_step(devices=3).axes[0].texts]
    assert {"scatter", "replicate", "parallel_apply", "gather"} <= set(texts)
    assert [t for t in texts if t.startswith("slice")] == ["slice 0\n(GPU 0)", "slice 1\n(GPU 1)", "slice 2\n(GPU 2)"]
    assert sum(t.startswith("replica ") for t in texts) == 3


# --- chapter 2: who hosts a store, who is connected, the torchrun figure ---------------------------

def test_listening_pids_names_the_process_that_hosts_a_port():
    import os

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert ch2.listening_pids(s.getsockname()[1]) == {os.getpid()}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        assert ch2.listening_pids(s.getsockname()[1]) == set()  # bound, not listening


def test_tcp_links_and_connected_recognise_the_two_ends_of_a_connection():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            accepted, _ = server.accept()
            with accepted:
                links = ch2.tcp_links()
                mine = [link for link in links if link[1] == client.getsockname()[1]]
                theirs = [link for link in links if link[1] == server.getsockname()[1]]
                assert mine == [("127.0.0.1", client.getsockname()[1], "127.0.0.1", server.getsockname()[1])]
                assert ch2.connected(set(mine), set(theirs)) and ch2.connected(set(theirs), set(mine))
                assert not ch2.connected(set(mine), {("127.0.0.1", 1, "127.0.0.1", 2)})
                assert not ch2.connected(set(mine), set(theirs), ignore_ports={server.getsockname()[1]})


def test_check_rank_sum(capsys):
    ch2.check_rank_sum(6.0, world_size=3)
    assert capsys.readouterr().out.startswith("correct")
    with pytest.raises(AssertionError, match="sums"):
        ch2.check_rank_sum(3.0, world_size=3)


def test_torchrun_figure_draws_agent_store_and_one_worker_per_rank():
    from distlab.plots.process_group import plot_torchrun

    texts = [t.get_text() for t in plot_torchrun(nproc=3).axes[0].texts]
    assert "torchrun\n(elastic agent)" in texts and "TCPStore\nMASTER_ADDR:MASTER_PORT" in texts
    assert [t for t in texts if t.startswith("rank ")] == [f"rank {r}\nRANK={r} LOCAL_RANK={r}" for r in range(3)]
    assert texts.count("gloo / NCCL") == 2  # one link between each pair of neighbouring boxes


def test_worker_cores_hands_out_the_cores_this_process_may_use_in_turn():
    import os

    cores = sorted(os.sched_getaffinity(0))
    assert ch1.worker_cores(2 * len(cores)) == cores + cores


def test_a_process_pinned_worker_runs_on_its_core():

    pool = ch1.make_pool("processes", 1)
    try:
        core = ch1.worker_cores(1)[0]
        assert pool.submit(_affinity_after_pinning, core).result() == {core}
    finally:
        pool.shutdown()


def _affinity_after_pinning(core):
    import os

    ch1.spin_timeline(ch1.CHUNK, core)
    return os.sched_getaffinity(0)
