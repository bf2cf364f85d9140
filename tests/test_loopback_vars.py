"""One rule for gloo's and NCCL's interface in every kind of single-node rank (pure)."""
from distlab.warm import group as rank_group
from distlab.worker import loopback_interface, loopback_socket_vars


def test_both_collectives_stay_on_loopback_unless_the_kernel_chose():
    assert loopback_socket_vars({}, "lo") == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    assert loopback_socket_vars({"NCCL_SOCKET_IFNAME": "ib0"}, "lo") == {"GLOO_SOCKET_IFNAME": "lo",
                                                                          "NCCL_SOCKET_IFNAME": "ib0"}


def test_warm_ranks_get_both():
    env = rank_group._rank_environment({"rank": 0, "world_size": 2}, {})
    lo = loopback_interface()
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == lo
