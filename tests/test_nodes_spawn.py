"""distlab.spawn across distlab.Nodes: one agent per node, a c10d rendezvous at node0, real links."""
import os
import socket
import time

import psutil
import pytest

import distlab
from distlab.errors import LaunchArgumentError, WorkerFailedError

pytestmark = pytest.mark.slow


def placed(rank):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return {"host": socket.gethostname(), "local": int(os.environ["LOCAL_RANK"]),
            "world": int(os.environ["WORLD_SIZE"]), "sum": t.item(), "master": os.environ["MASTER_ADDR"]}


def broken_on_the_last(rank):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if rank == dist.get_world_size() - 1:
        raise ValueError("rank on the second node broke")
    dist.all_reduce(torch.ones(1))  # the others wait for it here
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def nodes():
    with distlab.Nodes(2) as made:
        yield made


def our_ranks(run_id_part: str) -> list[int]:
    """Ranks started as fresh interpreters (start="spawn"), found by their command line."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "distlab.launch.rank" in " ".join(p.cmdline()) and run_id_part in " ".join(p.cmdline()):
                found.append(p.pid)
        except psutil.Error:
            continue
    return found


def on_nodes(nodes) -> dict[int, list[int]]:
    """node -> every process running on it (found by its network namespace), except the holder that
    keeps the node: agents and ranks however they started (a forked rank's command line is the
    forkserver's)."""
    from distlab.nodes import held

    return {k: held.members(h.inode("net"), {h.pid, h.starter_pid}) for k, h in enumerate(nodes._nodes)}


def nothing_on(nodes, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while any(on_nodes(nodes).values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(on_nodes(nodes).values())


def test_ranks_run_on_their_nodes_and_meet_over_the_links(nodes):
    before = nodes.traffic()
    res = distlab.spawn(placed, nprocs=2, nodes=nodes, view=None, timeout=180)
    assert [res.returns[r]["host"] for r in range(4)] == ["node0", "node0", "node1", "node1"]
    assert [res.returns[r]["local"] for r in range(4)] == [0, 1, 0, 1]  # RANK vs LOCAL_RANK
    assert {res.returns[r]["world"] for r in range(4)} == {4}
    assert {res.returns[r]["sum"] for r in range(4)} == {10.0}  # 1 + 2 + 3 + 4, across both nodes
    assert {res.returns[r]["master"] for r in range(4)} == {"node0"}
    after = nodes.traffic()
    assert after[1]["sent_bytes"] > before[1]["sent_bytes"]  # node1's ranks talked over its link


def test_a_rank_that_fails_on_a_node_is_named_with_its_node_and_the_others_stop(nodes):
    start = time.monotonic()
    with pytest.raises(WorkerFailedError) as caught:
        distlab.spawn(broken_on_the_last, nprocs=1, nodes=nodes, view=None, timeout=180)
    message = str(caught.value)
    assert "rank 1 (node1, local rank 0) failed first" in message, message
    assert "rank on the second node broke" in message
    assert caught.value.node == 1
    assert time.monotonic() - start < 120
    assert our_ranks("broken_on_the_last") == [] and nothing_on(nodes, within=0)


def test_closed_or_wrong_nodes_are_refused_before_anything_starts():
    closed = distlab.Nodes(1)
    closed.close()
    with pytest.raises(LaunchArgumentError, match="nodes=.*closed"):
        distlab.spawn(placed, nprocs=1, nodes=closed)
    with pytest.raises(LaunchArgumentError, match="must be a distlab.Nodes"):
        distlab.spawn(placed, nprocs=1, nodes=2)


def test_a_second_launch_on_the_nodes_finds_its_agents_started_and_close_ends_them():
    """start="spawn" (fresh interpreters): after a launch, an agent waits on each node (standby): the
    next launch hands it the run instead of starting an interpreter that imports torch. A standby
    that died is replaced."""
    import json
    from pathlib import Path

    from distlab.launch import standby

    with distlab.Nodes(2) as nodes:
        distlab.spawn(placed, nprocs=1, nodes=nodes, view=None, timeout=180, start="spawn")
        waiting = dict(standby._WAITING[nodes])
        assert sorted(waiting) == [0, 1]
        from distlab.teach import failures
        assert failures.no_workers_left()  # waiting standbys are kept on purpose, not leftovers
        res = distlab.spawn(placed, nprocs=1, nodes=nodes, view=None, timeout=180, start="spawn")
        agents = [json.loads((Path(res.run_dir) / f"run-node{k}.json").read_text())["parent_pid"] for k in (0, 1)]
        assert agents == [waiting[0].pid, waiting[1].pid]  # the standbys ran the second launch
        assert {res.returns[r]["host"] for r in (0, 1)} == {"node0", "node1"}
        for proc in standby._WAITING[nodes].values():  # a standby that dies is not used
            proc.kill()
        res = distlab.spawn(placed, nprocs=1, nodes=nodes, view=None, timeout=180, start="spawn")
        assert {res.returns[r]["sum"] for r in (0, 1)} == {3.0}
        left = [p.pid for p in standby._WAITING[nodes].values()]
        assert len(left) == 2
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(pid) for pid in left) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(psutil.pid_exists(pid) for pid in left), "a standby agent outlived its nodes (or its zombie)"


def stuck_on_node1(rank):
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if rank == 1:
        time.sleep(300)  # node1's rank never joins the all-reduce
    dist.all_reduce(torch.ones(1))


def test_a_hang_across_nodes_times_out_with_each_ranks_stack_and_stops_both_nodes(nodes):
    from distlab.errors import WorkerTimeoutError

    start = time.monotonic()
    with pytest.raises(WorkerTimeoutError) as caught:
        distlab.spawn(stuck_on_node1, nprocs=1, nodes=nodes, view=None, timeout=20)
    stacks = caught.value.stacks
    assert sorted(stacks) == [0, 1], stacks
    assert "in all_reduce" in stacks[0], stacks[0]  # rank 0 (node0) waits in the collective
    assert "in stuck_on_node1" in stacks[1] and "all_reduce" not in stacks[1], stacks[1]  # rank 1 never got there
    assert time.monotonic() - start < 90
    assert our_ranks("stuck_on_node1") == [] and nothing_on(nodes, within=0)


def test_a_run_across_nodes_cancelled_leaves_no_rank_on_either_node(nodes):
    from distlab.errors import RunCancelledError

    run = distlab.spawn(stuck_on_node1, nprocs=1, nodes=nodes, join=False, view=None, timeout=300)
    deadline = time.monotonic() + 60
    while not all(len(pids) >= 2 for pids in on_nodes(nodes).values()):  # an agent and a rank on each node
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.1)
    assert run.cancel(timeout=60)
    with pytest.raises(RunCancelledError):
        run.join()
    assert our_ranks("stuck_on_node1") == [] and nothing_on(nodes, within=0)


WHERE_AND_SUM = """import os, socket
t = torch.full((1 << 20,), float(rank))   # 4 MB: over the links, not loopback
dist.all_reduce(t)
(socket.gethostname(), os.environ["LOCAL_RANK"], world_size, t[0].item())"""


def test_warm_ranks_on_nodes_live_on_their_node_and_meet_over_the_links(nodes):
    before = nodes.traffic()
    with distlab.Ranks(2, nodes=nodes) as ranks:
        assert "nodes=2x2" in repr(ranks) and ranks.nprocs == 4
        got = ranks.exec(WHERE_AND_SUM)
        assert dict(got) == {0: ("node0", "0", 4, 6.0), 1: ("node0", "1", 4, 6.0),
                             2: ("node1", "0", 4, 6.0), 3: ("node1", "1", 4, 6.0)}
        sent = nodes.traffic()[1]["sent_bytes"] - before[1]["sent_bytes"]
        assert sent > 4 << 20, f"node1 sent {sent} bytes: the all-reduce did not cross its link"
        pids = list(ranks.pids)
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_warm_ranks_refuse_closed_nodes_before_starting():
    closed = distlab.Nodes(1)
    closed.close()
    with pytest.raises(LaunchArgumentError, match="closed"):
        distlab.Ranks(1, nodes=closed)
    with pytest.raises(LaunchArgumentError, match="Nodes"):
        distlab.Ranks(1, nodes=2)


@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_warm_ranks_on_nodes_forked_or_fresh_are_on_their_node_and_leave_nothing(nodes, start):
    """Forked from the forkserver (they enter the node with setns) or fresh interpreters started
    inside it: the same host name, /etc/hosts, working directory and PATH, and nothing left after close."""
    with distlab.Ranks(1, nodes=nodes, start=start) as ranks:
        got = ranks.exec("import os, socket; t = torch.ones(1); dist.all_reduce(t); "
                         "(socket.gethostname(), socket.gethostbyname('node1'), os.getcwd(), "
                         "'/usr/sbin' in os.environ['PATH'].split(':'), t.item())")
    assert dict(got) == {0: ("node0", "10.77.0.2", os.getcwd(), True, 2.0),
                         1: ("node1", "10.77.0.2", os.getcwd(), True, 2.0)}
    assert nothing_on(nodes)
