"""Chapter 14's pure helpers: the bandwidth law, the kernel's counters, two-level byte counts,
step statistics and the exercise checks. No process starts here."""
import pytest

from distlab.teach import network

NET_DEV = "\n".join([  # /proc/net/dev as Linux writes it (two header lines, then one line per interface)
    "Inter-|   Receive                                                |  Transmit",
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier",
    "    lo:     840     10    0    0    0     0          0         0      840      10    0    0    0     0       0  0",
    "  eth0: 67240690 1854    0    0    0     0          0         0 67239511     1829    0    0    0     0       0  0",
]) + "\n"


def test_ring_bytes_is_two_n_minus_one_over_n():
    assert network.ring_bytes(100, 1) == 0
    assert network.ring_bytes(100, 2) == 100
    assert network.ring_bytes(100, 4) == 150
    assert network.ring_bytes(100, 32) == pytest.approx(2 * 31 / 32 * 100)
    with pytest.raises(ValueError):
        network.ring_bytes(100, 0)


def test_bound_is_bytes_over_the_rate():
    # the figure: 100 MB of gradients, 1 Gbit/s, 2 ranks: 0.8 s
    assert network.bound_s(100e6, 2, 1e9) == pytest.approx(0.8)
    assert network.bound_s(64 * 2**20, 4, 1e9) == pytest.approx(1.5 * 64 * 2**20 * 8 / 1e9)


def message_sizes(*args) -> list[int]:
    """``network.message_sizes(*args)``, failed after 2 s: a loop that never reaches ``largest`` fails
    the test instead of hanging it."""
    import signal

    def too_long(*_):
        raise TimeoutError("message_sizes never ends")

    signal.signal(signal.SIGALRM, too_long)
    signal.setitimer(signal.ITIMER_REAL, 2)
    try:
        return network.message_sizes(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)


def test_message_sizes_and_their_names():
    sizes = message_sizes(4096, 64 * network.MB)
    assert sizes[0] == 4096 and sizes[-1] == 64 * network.MB and len(sizes) == 8
    assert all(b == 4 * a for a, b in zip(sizes, sizes[1:], strict=False))
    names = [network.size_text(s) for s in (4096, network.MB, 64 * network.MB, 512)]
    assert names == ["4 KB", "1 MB", "64 MB", "512 B"]


def test_repeats_cover_the_token_buckets_burst():
    bits = 1e9
    burst = bits / 8 * 0.008  # 1 MB at 1 Gbit/s
    assert network.repeats(4096, bits) == 40              # capped
    assert network.repeats(network.MB, bits) * network.MB >= 15 * burst
    assert network.repeats(64 * network.MB, bits) == 1      # timed once: long enough alone
    assert network.repeats(16 * network.MB, bits) == 3      # at least 3: a median outvotes one slow moment
    assert network.repeats(4 * network.MB, 100e6) == 3


def test_law_rows_set_measurements_beside_the_bound():
    rows = network.law_rows({64 * network.MB: 0.56, 4096: 0.0007}, 2, 1e9)
    assert [r["bytes"] for r in rows] == [4096, 64 * network.MB]          # sorted by size
    assert rows[1]["fraction"] == pytest.approx(network.bound_s(64 * network.MB, 2, 1e9) / 0.56)
    assert rows[0]["fraction"] < 0.1                                       # latency-bound
    assert "fastest" not in rows[0]
    assert rows[1]["size"] == "64 MB"


def test_law_rows_carry_the_fastest_repeats_and_print_them(capsys):
    rows = network.law_rows({4096: 0.0031, network.MB: 0.009}, 2, 1e9, fastest={4096: 0.0003, network.MB: 0.0085})
    assert [r["fastest"] for r in rows] == [0.0003, 0.0085]
    network.print_rows(rows, "2 nodes:")
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[-1] == "fastest"
    assert out[2].split()[-2:] == ["0.300", "ms"]


def test_net_dev_reads_each_interface(tmp_path):
    counters = network.net_dev(NET_DEV)
    assert set(counters) == {"lo", "eth0"}
    assert counters["eth0"]["rx_bytes"] == 67240690 and counters["eth0"]["tx_bytes"] == 67239511
    assert counters["eth0"]["tx_packets"] == 1829
    path = tmp_path / "dev"
    path.write_text(NET_DEV)
    assert network.sent_bytes("eth0", str(path)) == 67239511
    assert network.sent_bytes("lo", str(path)) == 840


def test_sent_bytes_on_this_machine_reads_proc():
    name = next(iter(network.net_dev(open("/proc/net/dev").read())))
    assert network.sent_bytes(name) >= 0


def test_two_levels_flat_against_hierarchical():
    # 2 nodes x 2 ranks: the flat ring sends 1.5 S out of each node, the leaders' ring S
    assert network.flat_link_bytes(100, 2, 2) == 150
    assert network.hierarchical_link_bytes(100, 2) == 100
    assert network.flat_link_bytes(100, 1, 8) == 0            # one node: nothing crosses a link
    assert network.flat_link_bytes(100, 4, 8) == pytest.approx(2 * 31 / 32 * 100)


def test_quantile_and_cycles():
    assert network.quantile([5, 1, 3, 2, 4], 0) == 1
    assert network.quantile([5, 1, 3, 2, 4], 0.5) == 3
    assert network.quantile([5, 1, 3, 2, 4], 1) == 5
    with pytest.raises(ValueError):
        network.quantile([], 0.5)
    assert network.cycle_times([1, 3, 1, 5, 9], 2) == [2, 3]   # the unfinished cycle is left out
    assert network.cycle_times([1, 2], 1) == [1, 2]


def test_paired_summary_splits_compute_and_waiting():
    node0 = {"compute only": {"times": [9, 0.1, 0.1, 0.2], "sent": [0, 0, 0, 0], "losses": [1, 0.5]},
             "DDP": {"times": [9, 0.4, 0.4, 0.8], "sent": [4e6] * 4, "losses": [1, 0.5]},
             "no_sync": {"times": [9, 0.1, 0.3, 0.6], "sent": [0, 0, 4e6, 0], "losses": [1, 0.6], "k": 2}}
    node1 = {"compute only": {"times": [9, 0.1, 0.1, 0.1], "sent": [0] * 4, "losses": [1]}}
    out = network.paired_summary({0: node0, 1: node1}, "compute only", skip=1)
    # round 3 was twice as slow for everything on node0: the ratios stay 1 and 4
    assert out["compute only"]["vs_compute"] == pytest.approx(1)
    assert out["DDP"]["vs_compute"] == pytest.approx(4)
    assert out["DDP"]["step_s"] == pytest.approx(0.4) and out["DDP"]["waiting_s"] == pytest.approx(0.3)
    assert out["DDP"]["mb_per_step"] == pytest.approx(4)
    assert out["no_sync"]["vs_compute"] == pytest.approx(2)        # one cycle: (0.1 + 0.3) / (0.1 + 0.1)
    assert out["no_sync"]["loss"] == 0.6
    slower1 = {"compute only": {"times": [9, 0.2, 0.2, 0.2], "sent": [0] * 4, "losses": [1]}}
    assert network.paired_summary({0: node0, 1: slower1}, "compute only", skip=1)["DDP"]["vs_compute"] == \
        pytest.approx(2)                                            # the floor is the slower node's compute
    assert network.step_of(node0["DDP"], skip=1, q=0) == pytest.approx(0.4)


def test_exercise_checks(capsys):
    assert network.check_cluster_step(None) is False
    assert network.check_cluster_step(2 * 7 / 8 * 100e6 * 8 / 1e9)
    with pytest.raises(AssertionError, match="sends the gradients once"):
        network.check_cluster_step(0.8)
    with pytest.raises(AssertionError):
        network.check_cluster_step(1.0)
    assert network.check_link_bytes(None) is False
    assert network.check_link_bytes((2 * 31 / 32 * 100e6, 1.5 * 100e6))
    with pytest.raises(AssertionError, match="flat"):
        network.check_link_bytes((1.5 * 100e6, 1.5 * 100e6))
    with pytest.raises(AssertionError, match="hierarchical"):
        network.check_link_bytes((2 * 31 / 32 * 100e6, 100e6))
    with pytest.raises(AssertionError, match="pair"):
        network.check_link_bytes(3)
    assert "correct" in capsys.readouterr().out


def test_the_tables_as_the_chapter_prints_them(capsys):
    """Issue #60: the law's table (with and without the fastest repeats) and the configurations' summary,
    character for character; sizes in binary units at each unit's edge."""
    rows = network.law_rows({4096: 0.002, 2**20: 0.01}, 2, 1e9, fastest={4096: 0.001, 2**20: 0.009})
    network.print_rows(rows, "T")
    network.print_rows(network.law_rows({4096: 0.002}, 2, 1e9), "U")
    network.print_summary({"flat": {"step_s": 0.25, "vs_compute": 1.5, "waiting_s": 0.05, "mb_per_step": 12.345,
                                    "loss": 0.12345}})
    assert capsys.readouterr().out == (
        "T\n"
        "     size     measured        bound  bound/measured      fastest\n"
        "     4 KB     2.000 ms     0.033 ms            0.02     1.000 ms\n"
        "     1 MB    10.000 ms     8.389 ms            0.84     9.000 ms\n"
        "U\n"
        "     size     measured        bound  bound/measured\n"
        "     4 KB     2.000 ms     0.033 ms            0.02\n"
        "configuration                     step  x compute   waiting   MB/step     loss\n"
        "flat                            250 ms       1.50     50 ms     12.35   0.1235\n")
    assert [network.size_text(b) for b in (1023, 1024, 1536, 2**20 - 1, 2**20, 2**30)] == [
        "1023 B", "1 KB", "1.5 KB", "1024 KB", "1 MB", "1 GB"]


# --- mutation second pass (#60) ----------------------------------------------------------------

def test_defaults_and_edges_of_the_sizes_repeats_and_quantiles():
    assert message_sizes() == [4096 * 4**i for i in range(8)]
    assert network.repeats(network.MB, 1e9) == 16           # 16 bursts of 1 MB (at 1 Gbit/s) in 1 MiB messages
    assert network.repeats(32 * network.MB, 1e9) == 1       # `alone` itself is timed once
    assert network.repeats(32 * network.MB - 1, 1e9) == 3
    assert network.quantile([3, 1, 2], 1.5) == 3            # past the end: the largest
    with pytest.raises(ValueError, match="^no values$"):
        network.quantile([], 0.5)
    with pytest.raises(ValueError, match="^a ring needs at least one rank, not 0$"):
        network.ring_bytes(1, 0)
    assert network.cycle_times([1, 2]) == [1, 2]            # one micro-step per cycle unless told
    assert network.step_of({"times": [1, 5, 6, 7, 8]}) == 5      # no warm-up left out, the lower quartile
    assert network.step_of({"times": [1, 5, 6, 7, 8]}, q=1) == 8
    assert network.step_of({"times": [1, 3, 5, 7]}, q=0) == 1
    assert network.step_of({"times": [1, 3, 5, 7], "k": 2}, q=0) == 2    # per micro-step of a cycle


def test_the_counters_of_this_machines_first_interface_and_a_line_with_more_columns(tmp_path):
    path = tmp_path / "dev"
    path.write_text(NET_DEV)
    assert network.sent_bytes(path=str(path)) == 67239511   # eth0 unless told
    later = NET_DEV + "  eth1: " + " ".join(str(i) for i in range(18)) + "\n"   # a kernel with more columns
    assert network.net_dev(later)["eth1"]["tx_bytes"] == 8 and len(network.net_dev(later)["eth1"]) == 16


def test_the_paired_summary_across_nodes_of_different_lengths_and_its_defaults():
    compute = {"times": [9, 1, 1, 1], "sent": [0] * 4, "losses": [3, 2, 1]}
    ddp = {"times": [9, 2, 2, 2, 2, 2], "sent": [10e6] + [4e6] * 5, "losses": [3, 2, 0.5]}  # more steps than the floor
    out = network.paired_summary({0: {"compute only": compute, "DDP": ddp}}, "compute only")  # skip 0: 9 is a floor
    assert out["DDP"]["vs_compute"] == pytest.approx(2) and out["DDP"]["compute_s"] == 1
    assert out["DDP"]["mb_per_step"] == 5 and out["DDP"]["loss"] == 0.5          # the first step counted too
    accumulated = {"times": [9, 1, 1, 1], "sent": [0] * 4, "losses": [1], "k": 2}
    assert network.paired_summary({0: {"compute only": compute, "acc": accumulated}}, "compute only")[
        "acc"]["vs_compute"] == 1
    short = {"compute only": {"times": [9, 1], "sent": [0] * 2, "losses": [1]}}
    with pytest.raises(ValueError):   # nodes that took different numbers of steps: no rounds to pair
        network.paired_summary({0: {"compute only": compute}, 1: short}, "compute only")


def test_the_summary_prints_milliseconds(capsys):
    network.print_summary({"x": {"step_s": 1.0, "vs_compute": 1, "waiting_s": 2.0, "mb_per_step": 0, "loss": 0}})
    assert capsys.readouterr().out.splitlines()[1].split()[1:5] == ["1000", "ms", "1.00", "2000"]


def test_an_answer_counts_within_one_percent_either_way():
    assert network._close(101, 100) and network._close(99, 100) and network._close("101", 100)
    assert not network._close(101.001, 100) and not network._close("abc", 100) and not network._close([1], 100)


def _edges(expected: float) -> tuple[list[float], list[float]]:
    """Answers just inside and just outside the checks' 1 % either way (a part in a billion from the edge)."""
    inside = [expected * (1 + s * 0.01 * (1 - 1e-9)) for s in (-1, 1)]
    outside = [expected * (1 + s * 0.01 * (1 + 1e-9)) for s in (-1, 1)]
    return inside, outside


def test_the_cluster_step_exercise_word_for_word(capsys):
    assert network.check_cluster_step(None) is False
    assert capsys.readouterr().out == "No answer yet: replace None with a number of seconds.\n"
    inside, outside = _edges(2 * 7 / 8 * 25e6 * 4 * 8 / 1e9)        # 1.4 s: 8 nodes, 25 M fp32 at 1 Gbit/s
    assert all(network.check_cluster_step(a) for a in inside)
    assert capsys.readouterr().out == "correct: 1.40 s per step, whatever the GPUs compute in the meantime\n" * 2
    for answer in outside:
        with pytest.raises(AssertionError) as info:
            network.check_cluster_step(answer)
        assert str(info.value) == (
            f"Not quite: {answer!r}. fp32 is 4 bytes per parameter; each rank sends 2 (n - 1) / n of them; "
            "a link of B Gbit/s carries B/8 GB per second.")
    once_inside, once_outside = _edges(25e6 * 4 * 8 / 1e9)          # 0.8 s: the gradients sent once
    for answer in once_inside:
        with pytest.raises(AssertionError, match="^.* sends the gradients once. How many times S does each rank "
                                                 "send in a ring all-reduce on 8 ranks\\?$"):
            network.check_cluster_step(answer)
    for answer in once_outside:
        with pytest.raises(AssertionError, match="^Not quite"):
            network.check_cluster_step(answer)
    assert network.check_cluster_step(2 * 3 / 4 * 1e6 * 4 * 8 / 10e9, params=1e6, nodes=4, gbit=10)


def test_on_two_nodes_the_ring_sends_the_gradients_once_and_that_answer_is_right(capsys):
    """2 (n - 1) / n is 1 for n = 2: the hint about sending the gradients once would refuse the right answer."""
    assert network.check_cluster_step(25e6 * 4 * 8 / 1e9, nodes=2)
    assert capsys.readouterr().out == "correct: 0.80 s per step, whatever the GPUs compute in the meantime\n"
    with pytest.raises(AssertionError, match="^Not quite"):
        network.check_cluster_step(1.6, nodes=2)


def test_the_link_bytes_exercise_word_for_word(capsys):
    assert network.check_link_bytes(None) is False
    assert capsys.readouterr().out == "No answer yet: replace None with a pair (flat, hierarchical) of byte counts.\n"
    flat, hier = 2 * 31 / 32 * 100e6, 2 * 3 / 4 * 100e6             # 4 nodes of 8 ranks, 100 MB
    (flat_in, _), (flat_out, _) = _edges(flat)
    (_, hier_in), (_, hier_out) = _edges(hier)
    assert network.check_link_bytes((flat_in, hier_in))
    assert capsys.readouterr().out == ("correct: 193.8 MB against 150.0 MB per node over the slow links "
                                       "(1.29x as much for the flat ring)\n")
    with pytest.raises(AssertionError) as info:
        network.check_link_bytes((flat_out, hier))
    assert str(info.value) == (f"flat: {flat_out!r} is not it. The ring over all 32 ranks leaves each node once; "
                               "what crosses there is what one rank of that ring sends.")
    with pytest.raises(AssertionError) as info:
        network.check_link_bytes((flat, hier_out))
    assert str(info.value) == (f"hierarchical: {hier_out!r} is not it. Only one rank per node takes part in the "
                               "ring between nodes.")
    assert network.check_link_bytes((75e3, 50e3), nbytes=50e3, nodes=2, per_node=2)   # 0.05 MB: at a rounding edge
    assert capsys.readouterr().out == ("correct: 0.1 MB against 0.1 MB per node over the slow links "
                                       "(1.50x as much for the flat ring)\n")
