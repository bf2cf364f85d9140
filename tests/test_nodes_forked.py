"""Ranks and agents on distlab.Nodes forked from the forkserver (#46): they enter their node through the
namespace descriptors the nodes hold open, as root and as an ordinary user (a user namespace), and
leave nothing after an interrupt or the kernel's SIGKILL."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from second_user import as_other, other_python, other_user, readable_src, shared_tmp  # noqa: F401  (fixtures)

import distlab
from distlab.nodes import namespaces

pytestmark = pytest.mark.slow
SRC = os.path.join(os.path.dirname(__file__), "..", "src")


def where(rank):
    import os
    import socket

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return socket.gethostname(), os.getcwd(), t.item()


def test_an_ordinary_user_forks_a_child_into_its_nodes(other_user, readable_src, shared_tmp):  # noqa: F811
    """The user namespace first (an ordinary user's nodes live in one), then network, host name and
    mounts: a child forked by the user's own process lands on the node, through the held descriptors.
    (A system Python without torch: the forkserver path itself runs as root below.)"""
    probe = textwrap.dedent(f"""
        import os, socket, sys, types
        pkg = types.ModuleType("distlab"); pkg.__path__ = [{str(readable_src / "distlab")!r}]
        sys.modules["distlab"] = pkg
        from distlab.forkserver import enter
        from distlab.nodes.cluster import Nodes
        n = Nodes(2)
        door = n.entry(1)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                enter.enter(enter.Entry(door["fds"], os.getcwd(), door["env"]))
                addr = os.popen("ip -o -4 addr show eth0").read().split()[3]
                os.write(w, f"{{socket.gethostname()}} {{os.getuid()}} {{addr}} {{os.getcwd()}}".encode())
            finally:
                os._exit(0)
        os.close(w)
        print(os.read(r, 1000).decode(), sorted(door["fds"]))
        os.waitpid(pid, 0)
        n.close()
    """)
    made = as_other(f"cd {shared_tmp} && {other_python()} -c \"$PROBE\"", env={"PROBE": probe, "TMPDIR": shared_tmp})
    assert made.returncode == 0, made.stderr
    assert made.stdout.split() == ["node1", "0", "10.77.0.2/24", str(shared_tmp), "['mnt',", "'net',", "'user',",
                                   "'uts']"], made.stdout


def test_ranks_and_a_spawn_in_a_user_namespace_are_forked_into_it(monkeypatch):
    """As root, nodes made the ordinary user's way (one user namespace owns them): forked ranks and
    agents join the user namespace before the others, and everything runs there."""
    monkeypatch.setattr(namespaces, "with_user_namespace", lambda euid=None: True)
    with distlab.Nodes(2) as nodes:
        assert "user" in nodes.entry(0)["fds"]
        with distlab.Ranks(1, nodes=nodes) as ranks:
            assert dict(ranks.exec("import socket, os; (socket.gethostname(), os.getuid(), "
                                   "os.readlink('/proc/self/ns/user'))")) == {
                0: ("node0", 0, os.readlink(f"/proc/{nodes.pids[0]}/ns/user")),
                1: ("node1", 0, os.readlink(f"/proc/{nodes.pids[1]}/ns/user"))}
        res = distlab.spawn(where, nprocs=1, nodes=nodes, view=None, timeout=120)
        assert res.returns == {0: ("node0", os.getcwd(), 2.0), 1: ("node1", os.getcwd(), 2.0)}


KERNEL = textwrap.dedent("""
    import os, signal, sys, time
    import distlab, distlab.errors
    def sleeper(rank, mark):
        import pathlib, time
        print("sleeping", flush=True)
        pathlib.Path(mark).touch()  # the test interrupts once the rank is in its sleep
        time.sleep(300)
    def seven(rank):
        return 7
    nodes = distlab.Nodes(2)
    ranks = distlab.Ranks(1, nodes=nodes)
    mode, mark = sys.argv[1], sys.argv[2]
    if mode == "interrupt":
        try:
            distlab.spawn(sleeper, args=(mark,), nprocs=1, nodes=nodes, view=None, timeout=300)
        except distlab.errors.RunInterrupted:
            print("INTERRUPTED", flush=True)
        res = distlab.spawn(seven, nprocs=1, nodes=nodes, view=None, timeout=120)
        print("AGAIN", res.returns, dict(ranks.exec("1 + 1")), flush=True)
        ranks.close()
        nodes.close()
        print("CLOSED", flush=True)
    else:
        run = distlab.spawn(sleeper, args=(mark,), nprocs=1, nodes=nodes, view=None, timeout=300,
                            join=False)
        print("STARTED", flush=True)
        time.sleep(300)
""")


def tree(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def gone(pids, within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids
                   if psutil.pid_exists(p)):
            return True
        time.sleep(0.1)
    return False


def start_kernel(folder, mode: str) -> subprocess.Popen:
    """A kernel stand-in: a script file (distlab captures a function from its source)."""
    script = folder / "kernel.py"
    script.write_text(KERNEL)
    env = {**os.environ, "PYTHONPATH": os.path.abspath(SRC)}
    command = [sys.executable, str(script), mode, str(folder / "sleeping")]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)


def wait_for_ranks(kernel: subprocess.Popen, at_least: int, timeout: float = 120) -> set[int]:
    """The kernel's processes once ``at_least`` of them run (server, spares, ranks, agents, holders)
    and the sleeping rank has said so (its mark file): on a loaded machine a count alone was reached
    while the run was still starting, and the interrupt landed outside the cell's ``try``."""
    deadline = time.monotonic() + timeout
    mark = Path(kernel.args[3])
    while len(tree(kernel.pid)) < at_least or not mark.exists():
        assert time.monotonic() < deadline and kernel.poll() is None, kernel.stderr.read() if kernel.poll() else ""
        time.sleep(0.1)
    time.sleep(0.2)
    return tree(kernel.pid)


def test_a_sigkilled_kernel_leaves_no_forked_rank_agent_or_node(tmp_path):
    kernel = start_kernel(tmp_path, "sigkill")
    try:
        assert kernel.stdout.readline().strip() == "STARTED", kernel.stderr.read()
        pids = wait_for_ranks(kernel, 12)  # 3 holders x 2, server, spares, 2 warm ranks, 2 agents, 2 ranks
        os.kill(kernel.pid, signal.SIGKILL)
        kernel.wait(10)
        assert gone(pids), [p for p in pids if psutil.pid_exists(p)]
    finally:
        if kernel.poll() is None:
            kernel.kill()
            kernel.wait()


def test_an_interrupt_stops_a_run_on_forked_nodes_and_the_nodes_go_on(tmp_path):
    kernel = start_kernel(tmp_path, "interrupt")
    try:
        pids = wait_for_ranks(kernel, 12)
        os.killpg(kernel.pid, signal.SIGINT)  # as Jupyter and a terminal interrupt: the whole group
        out, err = kernel.communicate(timeout=120)
        assert kernel.returncode == 0, err
        assert "INTERRUPTED" in out and "AGAIN {0: 7, 1: 7} {0: 2, 1: 2}" in out and "CLOSED" in out, out + err
        assert gone(pids), [p for p in pids if psutil.pid_exists(p)]
    finally:
        if kernel.poll() is None:
            kernel.kill()
            kernel.wait()
