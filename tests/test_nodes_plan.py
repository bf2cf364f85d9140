"""distlab.nodes.plan and the refusals of distlab.nodes.namespaces: no processes needed."""
import json

import pytest

from distlab.errors import LaunchArgumentError
from distlab.nodes import namespaces, plan


@pytest.mark.parametrize("rate, bits", [("1gbit", 10**9), ("100mbit", 10**8), ("2.5Gbit", 25 * 10**8),
                                        (" 64 kbit ", 64000), (None, None)])
def test_rates_read_as_tc_writes_them(rate, bits):
    assert plan.rate_bits(rate) == bits


@pytest.mark.parametrize("rate", ["fast", "0", "0mbit", "-1gbit", "1gb", "1 gigabit", 10**9, "", "1kbit"])
def test_a_wrong_rate_is_refused_with_the_forms_that_work(rate):
    with pytest.raises(LaunchArgumentError, match="rate=") as caught:
        plan.rate_bits(rate)
    assert "'100mbit'" in str(caught.value)


@pytest.mark.parametrize("n", [0, -1, plan.MAX_NODES + 1, True, "2", 2.0])
def test_a_wrong_number_of_nodes_is_refused(n):
    with pytest.raises(LaunchArgumentError, match="n="):
        plan.count(n)


def test_node_index_takes_an_index_or_a_host_name():
    assert plan.node_index(1, 2) == 1 and plan.node_index("node1", 2) == 1
    for bad in (2, -1, "node2", "node", True, 1.0):
        with pytest.raises(LaunchArgumentError, match="there are nodes 0 to 1"):
            plan.node_index(bad, 2)


def test_the_bucket_covers_two_ticks_at_its_rate():
    assert plan.burst_bytes(10**9) == 10**9 // 8 * 8 // 1000  # 1 MB at 1 gbit
    assert plan.burst_bytes(10**6) == plan.MIN_BURST  # never below a few packets
    assert plan.shape_command("eth0", 10**8)[:6] == ["qdisc", "replace", "dev", "eth0", "root", "tbf"]
    assert plan.shape_command("eth0", None) == ["qdisc", "del", "dev", "eth0", "root"]


def test_every_node_names_every_node():
    hosts = plan.hosts_file(3)
    assert "10.77.0.1\tnode0" in hosts and "10.77.0.3\tnode2" in hosts and "localhost" in hosts
    assert [plan.address(k) for k in range(2)] == ["10.77.0.1", "10.77.0.2"]


def test_a_node_s_name_resolves_to_one_address_and_its_mapped_address_to_an_alias():
    """Issue #48: a second line naming node0 at ::ffff:10.77.0.1 made ``hostname --ip-address`` print two
    addresses, and a batch script's ``--rdzv_endpoint $head_node_ip:29500`` broke."""
    names: dict[str, list[str]] = {}
    for line in plan.hosts_file(3).splitlines():
        addr, *aliases = line.split()
        for name in aliases:
            names.setdefault(name, []).append(addr)
    for k in range(3):
        assert names[plan.host(k)] == [plan.address(k)]
        assert names[plan.mapped_alias(k)] == [f"::ffff:{plan.address(k)}"]  # c10d's reverse lookup of a peer


def test_traffic_reads_the_switch_ports_the_other_way_round():
    ports = [{"ifname": "br0", "stats64": {"rx": {"bytes": 1, "packets": 1}, "tx": {"bytes": 1, "packets": 1}}},
             {"ifname": "n0", "stats64": {"rx": {"bytes": 500, "packets": 5}, "tx": {"bytes": 70, "packets": 1}}},
             {"ifname": "lo"}]
    assert plan.traffic(json.dumps(ports), 2) == {
        0: {"sent_bytes": 500, "received_bytes": 70, "sent_packets": 5, "received_packets": 1}}


def test_the_refusal_names_the_setting_that_refuses():
    apparmor = {"/proc/sys/kernel/apparmor_restrict_unprivileged_userns": "1"}

    def read(path):
        if path not in apparmor:
            raise OSError(path)
        return apparmor[path]

    assert "apparmor_restrict_unprivileged_userns=0" in namespaces.refusal_cause(read)
    assert "CAP_SYS_ADMIN" in namespaces.refusal_cause(lambda p: "5")
    assert namespaces.missing_tools(lambda tool, path=None: None if tool == "tc" else "/bin/" + tool) == ["tc"]


# --- word for word, and at the edges (issue #60: each kills mutants the checks above let through) -----------------

def refusal(call, *args) -> str:
    with pytest.raises(LaunchArgumentError) as caught:
        call(*args)
    return str(caught.value)


def test_the_number_of_nodes_refusals_word_for_word_and_its_edges_accepted():
    assert refusal(plan.count, "2") == (
        "distlab: invalid argument n='2': the number of nodes must be an int. For example distlab.Nodes(2).")
    assert refusal(plan.count, 11) == (
        "distlab: invalid argument n=11: the number of nodes must be between 1 and 10. torch numbers nodes by "
        "sorted host name, which is node order only up to node9; a lesson needs 2 to 8.")
    assert refusal(plan.count, 0).startswith("distlab: invalid argument n=0: the number of nodes must be between")
    assert [plan.count(n) for n in (1, 2, plan.MAX_NODES)] == [1, 2, 10]


def test_the_rate_refusals_word_for_word_and_the_slowest_rate_accepted():
    forms = "Give a rate as tc writes it: a positive number and bit, kbit, mbit, gbit or tbit, e.g. '1gbit', '100mbit'"
    assert refusal(plan.rate_bits, "fast") == (
        f"distlab: invalid argument rate='fast': not a link rate. {forms}, or None for no limit.")
    assert refusal(plan.rate_bits, "7999bit") == (
        f"distlab: invalid argument rate='7999bit': below 8 kbit, too slow to carry a packet a second. {forms}.")
    assert plan.rate_bits("8kbit") == 8000 and plan.rate_bits("8000bit") == 8000
    assert plan.rate_bits("1TBIT") == 10**12 and plan.rate_bits("0.5mbit") == 500_000
    assert refusal(plan.rate_bits, "0.0mbit").startswith("distlab: invalid argument rate='0.0mbit': not a link rate")


def test_the_whole_tc_command_and_the_bucket_at_its_floor():
    assert plan.shape_command("eth0", 10**8) == ["qdisc", "replace", "dev", "eth0", "root", "tbf", "rate",
                                                  "100000000bit", "burst", "100000", "latency", "20ms"]
    floor_bits = plan.MIN_BURST * 8 * 125  # the rate whose two ticks fill exactly the smallest bucket
    assert plan.burst_bytes(floor_bits) == plan.MIN_BURST == 16384
    assert plan.burst_bytes(floor_bits + 1000) == plan.MIN_BURST + 1
    assert plan.burst_bytes(10**9 + 999) == 1_000_000


def test_a_node_index_refusal_word_for_word():
    assert refusal(plan.node_index, 5, 2) == (
        "distlab: invalid argument node=5: there are nodes 0 to 1. Give a node's index or its host name, "
        "e.g. 1 or 'node1'.")
    assert plan.node_index(0, 1) == 0 and plan.node_index("node0", 1) == 0
    assert refusal(plan.node_index, "xnode1", 2).startswith("distlab: invalid argument node='xnode1'")
    assert refusal(plan.node_index, "node1x", 2).startswith("distlab: invalid argument node='node1x'")


def test_the_hosts_file_line_by_line():
    assert plan.hosts_file(2) == ("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                                  "10.77.0.1\tnode0\n10.77.0.2\tnode1\n"
                                  "::ffff:10.77.0.1\tnode0-v4mapped\n::ffff:10.77.0.2\tnode1-v4mapped\n")
    assert plan.switch_port(3) == "n3"


def test_traffic_skips_a_node_whose_port_is_missing_and_reads_each_counter():
    ports = [{"ifname": "n1", "stats64": {"rx": {"bytes": 9, "packets": 2}, "tx": {"bytes": 4, "packets": 3}}}]
    assert plan.traffic(json.dumps(ports), 2) == {
        1: {"sent_bytes": 9, "received_bytes": 4, "sent_packets": 2, "received_packets": 3}}
