"""distlab.Nodes with real namespaces: names, addresses, links, counters, privacy, nothing left."""
import os
import pwd
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from second_user import as_other, other_python, other_user, readable_src, shared_tmp  # noqa: F401  (fixtures)

from distlab.errors import LaunchArgumentError, NodesError
from distlab.folders import private
from distlab.nodes import held, namespaces
from distlab.nodes.cluster import Nodes

SRC = os.path.join(os.path.dirname(__file__), "..", "src")


def holders(nodes: Nodes) -> list[int]:
    return [nodes._switch.pid, *nodes.pids]


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone(pids, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(running(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def nodes():
    with Nodes(2) as made:
        yield made


def test_each_node_has_its_name_and_address_and_resolves_the_others(nodes):
    for k in (0, 1):
        out = nodes.run(k, "hostname; getent hosts node0 node1; ip -4 -o addr show eth0").stdout.split("\n")
        assert out[0] == f"node{k}"
        assert "10.77.0.1" in out[1] and "node0" in out[1] and "10.77.0.2" in out[2] and "node1" in out[2]
        assert f"inet 10.77.0.{k + 1}/24" in out[3]
    assert nodes.hosts == ["node0", "node1"] and nodes.addresses == ["10.77.0.1", "10.77.0.2"]
    assert socket.gethostname() not in ("node0", "node1")  # the host keeps its own name


def test_a_node_names_one_address_for_itself_as_a_real_host_does(nodes):
    """``hostname --ip-address`` (what batch scripts paste into ``--rdzv_endpoint``) prints one address;
    node0 resolves to its IPv4 address first; a peer's IPv4-mapped address still has a name (c10d asks)."""
    out = nodes.run(0, "hostname --ip-address; getent hosts node0 | head -1; getent hosts ::ffff:10.77.0.2").stdout
    lines = out.split("\n")
    assert lines[0].strip() == "10.77.0.1", out
    assert lines[1].split() == ["10.77.0.1", "node0"], out
    assert lines[2].split()[1:] == ["node1-v4mapped"], out


def test_nodes_talk_over_their_links_and_the_kernel_counts_it(nodes):
    before = nodes.traffic()
    server = nodes.popen(1, [sys.executable, "-c", textwrap.dedent("""
        import socket
        s = socket.socket(); s.bind(("0.0.0.0", 29601)); s.listen(1); print("ready", flush=True)
        c, addr = s.accept(); data = b""
        while chunk := c.recv(65536): data += chunk
        print(addr[0], len(data), flush=True)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        send = "import socket; socket.create_connection(('node1', 29601)).sendall(b'x' * 300000)"
        nodes.run(0, f'{sys.executable} -c "{send}"')
        assert server.stdout.readline().split() == ["10.77.0.1", "300000"]
    finally:
        server.kill()
        server.wait()
    after = nodes.traffic()
    assert after[0]["sent_bytes"] - before[0]["sent_bytes"] >= 300000
    assert after[1]["received_bytes"] - before[1]["received_bytes"] >= 300000
    assert after[1]["sent_bytes"] - before[1]["sent_bytes"] < 100000  # acks only


def test_a_link_rate_is_set_and_changed_while_nodes_run(nodes):
    nodes.link(1, rate="100mbit")
    try:
        assert "rate 100Mbit" in nodes.run(1, "tc qdisc show dev eth0").stdout
        assert nodes.rates[1] == 10**8 and "100 Mbit/s" in repr(nodes)
    finally:
        nodes.link("node1", None)
    assert "tbf" not in nodes.run(1, "tc qdisc show dev eth0").stdout
    with pytest.raises(LaunchArgumentError, match="rate="):
        nodes.link(1, rate="fast")
    with pytest.raises(LaunchArgumentError, match="there are nodes 0 to 1"):
        nodes.link(2, rate="1gbit")


def test_a_failing_command_names_its_node(nodes):
    with pytest.raises(NodesError, match=r"node 1 \(node1\): `echo oops; exit 3` failed \(exit code 3\):\noops"):
        nodes.run(1, "echo oops; exit 3")
    assert nodes.run(1, "exit 3", check=False).returncode == 3


def test_a_nodes_port_is_not_on_the_host(nodes):
    server = nodes.popen(0, [sys.executable, "-c", "import socket, time; s = socket.socket(); "
                             "s.bind(('0.0.0.0', 29602)); s.listen(1); print('ready', flush=True); time.sleep(60)"],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", 29602), timeout=5)
        assert "10.77.0." not in subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    finally:
        server.kill()
        server.wait()


def test_another_user_cannot_enter_the_nodes(nodes, other_user):  # noqa: F811
    entered = as_other(f"nsenter -t {nodes.pids[0]} -n -U ip addr")
    assert entered.returncode != 0 and "10.77.0." not in entered.stdout


def test_close_leaves_no_process_and_no_file():
    root_before = set(os.listdir(private.private_root()))
    nodes = Nodes(3, link="1gbit")
    pids = holders(nodes)
    assert set(os.listdir(private.private_root())) == root_before  # the hosts file is gone once bound
    nodes.close()
    assert gone(pids, within=5)
    assert nodes.closed and repr(nodes) == "Nodes(3: closed)"
    with pytest.raises(NodesError, match="closed"):
        nodes.run(0, "true")
    nodes.close()  # twice is fine


def host_network() -> tuple[list[str], str]:
    """The names of the host's interfaces, and its named network namespaces, as ``ip`` lists them."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return sorted(re.findall(r"^\d+: ([^:@\s]+)", links, re.M)), names


def test_a_killed_kernel_leaves_no_node():
    network_before = host_network()
    kernel = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from distlab.nodes.cluster import Nodes
        nodes = Nodes(2)
        print(nodes._switch.pid, *nodes.pids, flush=True)
        time.sleep(120)
        """)], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": SRC})
    try:
        pids = [int(p) for p in kernel.stdout.readline().split()]
        assert len(pids) == 3 and not gone(pids, within=0.2)
        assert host_network() == network_before  # nothing of the nodes is named on the host, even while they run
        kernel.send_signal(signal.SIGKILL)
        assert gone(pids, within=10), "a node outlived the process that made it"
    finally:
        kernel.kill()
        kernel.wait()
    assert host_network() == network_before


def test_bad_arguments_start_nothing(monkeypatch):
    def no(*args):
        raise AssertionError("a process was started")

    monkeypatch.setattr(namespaces, "start_switch", no)
    monkeypatch.setattr(namespaces, "check_possible", no)
    for args in ((0,), (2, "fast"), (2, "-1gbit"), (65,)):
        with pytest.raises(LaunchArgumentError):
            Nodes(*args)


def test_an_ordinary_user_gets_nodes_too(other_user, readable_src, shared_tmp):  # noqa: F811
    probe = (  # distlab's nodes with a system Python (no torch needed), as an unprivileged user
        "import sys, types\n"
        f"pkg = types.ModuleType('distlab'); pkg.__path__ = [{str(readable_src / 'distlab')!r}]; "
        "sys.modules['distlab'] = pkg\n"
        "from distlab.nodes.cluster import Nodes\n"
        "n = Nodes(2, link='100mbit')\n"
        "print(n.run(1, 'id -u; hostname; getent hosts node0').stdout, end='')\n"
        "print('RATE', 'rate 100Mbit' in n.run(0, 'tc qdisc show dev eth0').stdout)\n"
        "pids = [n._switch.pid, *n.pids]\n"
        "n.close()\n"
        "print('PIDS', *pids)\n"
    )
    made = as_other(f"{other_python()} -c \"$PROBE\"", env={"PROBE": probe, "TMPDIR": shared_tmp})
    assert made.returncode == 0, made.stderr
    lines = made.stdout.split("\n")
    assert lines[0] == "0" and lines[1] == "node1" and "10.77.0.1" in lines[2]  # root only inside its namespace
    assert lines[3] == "RATE True"
    assert gone([int(p) for p in lines[4].split()[1:]])


def _net_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def test_popen_returns_once_its_command_runs_on_the_node(nodes):
    """nsenter joins the node's namespaces after it starts: had popen returned before, a kill_processes or
    close right after it would not find the command on the node (on a busy machine it then ran on)."""
    node1 = os.readlink(f"/proc/{nodes.pids[1]}/ns/net")
    for _ in range(3):
        proc = nodes.popen(1, ["sleep", "60"])
        try:
            assert _net_of(proc.pid) == node1, "popen returned before nsenter entered node 1"
        finally:
            proc.kill()
            proc.wait()


def test_kill_processes_ends_whatever_runs_on_a_node_and_keeps_the_node(nodes):
    sleepers = [nodes.popen(1, ["sleep", "60"]) for _ in range(2)]
    elsewhere = nodes.popen(0, ["sleep", "60"])
    try:
        node1 = os.readlink(f"/proc/{nodes.pids[1]}/ns/net")
        assert [_net_of(p.pid) for p in sleepers] == [node1, node1], "popen returned before nsenter entered node 1"
        killed = nodes.kill_processes(1)
        assert {p.pid for p in sleepers} <= set(killed) and elsewhere.pid not in killed
        assert [p.wait(timeout=10) for p in sleepers] == [-9, -9] and elsewhere.poll() is None
        assert nodes.run(1, "hostname").stdout.strip() == "node1"  # the node itself is still there
    finally:
        elsewhere.kill()
        elsewhere.wait()


def test_as_root_a_nodes_processes_are_who_they_are_on_the_host(nodes):
    """No user namespace for root: a daemon on a node can switch to another user (slurmd must)."""
    assert os.geteuid() == 0  # CI runs as root; test_an_ordinary_user_gets_nodes_too covers the other path
    assert nodes.run(0, "cat /proc/self/uid_map").stdout.split() == ["0", "0", "4294967295"]
    assert nodes.run(0, "runuser -u nobody -- id -u").stdout.strip() == str(pwd.getpwnam("nobody").pw_uid)
    assert namespaces.with_user_namespace(0) is False and namespaces.with_user_namespace(1000) is True


def test_what_runs_on_a_node_goes_with_the_nodes_also_when_the_kernel_is_killed():
    """A process a cell left on a node would keep its namespace alive; the holders end it."""
    kernel = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import time
        from distlab.nodes.cluster import Nodes
        nodes = Nodes(2)
        left = nodes.popen(1, ["sleep", "120"])
        print(left.pid, nodes.pids[1], flush=True)
        time.sleep(120)
        """)], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": SRC})
    try:
        pids = [int(p) for p in kernel.stdout.readline().split()]
        assert not gone(pids, within=0.2)
        kernel.send_signal(signal.SIGKILL)
        assert gone(pids, within=10), "a process on a node outlived the kernel that made the nodes"
    finally:
        kernel.kill()
        kernel.wait()
    with Nodes(1) as nodes:
        left = nodes.popen(0, ["sleep", "120"])
        pids = [left.pid, *nodes.pids]
    assert left.wait(timeout=10) == -9 and gone(pids)


def test_two_sets_of_nodes_at_once_do_not_collide():
    """Each set is its own network: both have a node0 at 10.77.0.1 with a server on the same port."""
    with Nodes(2) as first, Nodes(2) as second:
        servers = [nodes.popen(0, [sys.executable, "-c", textwrap.dedent(f"""
            import socket
            s = socket.socket(); s.bind(("0.0.0.0", 29603)); s.listen(1); print("ready", flush=True)
            c, _ = s.accept(); c.sendall(b"{name}"); c.close()
            """)], stdout=subprocess.PIPE, text=True) for nodes, name in ((first, "first"), (second, "second"))]
        try:
            assert [server.stdout.readline().strip() for server in servers] == ["ready", "ready"]
            ask = "import socket; print(socket.create_connection(('node0', 29603)).recv(16).decode())"
            assert first.run(1, f'{sys.executable} -c "{ask}"').stdout.strip() == "first"
            assert second.run(1, f'{sys.executable} -c "{ask}"').stdout.strip() == "second"
        finally:
            for server in servers:
                server.kill()
                server.wait()


# --- a node is its namespaces, held open; never a pid (issue #45, item 1) ----------------------------


def test_a_node_whose_holder_died_runs_nothing_anywhere(tmp_path):
    """Holder SIGKILLed: its pid is free for anyone. Every way in raises 'node 1 is gone' and starts nothing."""
    marker = tmp_path / "ran"
    with Nodes(2) as nodes:
        holder = nodes.pids[1]
        os.kill(holder, signal.SIGKILL)
        assert gone([holder])
        assert not nodes.alive(1) and nodes.alive(0)
        for attempt in (lambda: nodes.run(1, f"touch {marker}"), lambda: nodes.popen(1, ["touch", str(marker)]),
                        lambda: nodes.command(1, ["true"]), lambda: nodes.kill_processes(1),
                        lambda: nodes.netns(1)):
            with pytest.raises(NodesError, match=r"^distlab: node 1 is gone: the process that holds its namespaces"):
                attempt()
        assert nodes.run(0, "hostname").stdout.strip() == "node0"  # the other node is unaffected
        time.sleep(0.2)
        assert not marker.exists()


def test_commands_enter_through_held_namespace_files_not_pids():
    with Nodes(1) as nodes:
        argv = nodes.command(0, ["true"])
        assert "-t" not in argv and str(nodes.pids[0]) not in " ".join(argv)
        held_paths = [a.split("=", 1)[1] for a in argv if a.startswith(("--net=", "--uts=", "--mount="))]
        assert len(held_paths) == 3 and all(p.startswith(f"/proc/{os.getpid()}/fd/") for p in held_paths)
        assert os.readlink(held_paths[0]) == os.readlink(f"/proc/{nodes.pids[0]}/ns/net")


def test_kill_processes_leaves_the_node_standing_also_its_holder(nodes):
    """It used to kill the holder's own ``cat``: the node then died while Nodes believed it open."""
    holder = nodes.pids[1]
    nodes.kill_processes(1)
    time.sleep(0.3)
    assert psutil.pid_exists(holder) and nodes.alive(1)
    assert nodes.run(1, "hostname").stdout.strip() == "node1"


def test_kill_processes_ends_a_process_that_keeps_forking(nodes):
    forker = nodes.popen(1, ["sh", "-c", "while :; do sleep 100 & sleep 0.01; done"])
    try:
        time.sleep(0.5)
        nodes.kill_processes(1)
        assert forker.wait(timeout=10) == -9
        time.sleep(0.2)
        net = nodes._nodes[1].inode("net")
        assert held.members(net, {nodes._nodes[1].pid, nodes._nodes[1].starter_pid}) == []
    finally:
        forker.kill()
        forker.wait()


def test_kill_inside_refuses_the_callers_own_namespace():
    own = held.Held("the host", pid=os.getpid(), starter_pid=os.getppid(), pidfd=os.pidfd_open(os.getpid()))
    own.fds["net"] = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        with pytest.raises(NodesError, match="refusing to kill the processes of the host"):
            namespaces.kill_inside(own)
    finally:
        own.close()


def test_hold_refuses_a_pid_that_is_not_the_starters_child():
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(NodesError, match="is not the holder distlab started"):
            held.hold("node 0", stranger.pid, starter_pid=1, kinds=("net",))
    finally:
        stranger.kill()
        stranger.wait()


def test_an_interrupt_of_the_kernels_process_group_leaves_the_nodes_standing():
    """Issue #52 item 1: Jupyter interrupts with killpg(SIGINT); the holders were in the kernel's group and
    died of it, while Nodes still looked open."""
    kernel = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import signal, sys
        from distlab.nodes.cluster import Nodes
        signal.signal(signal.SIGINT, lambda *a: print("interrupted", flush=True))
        nodes = Nodes(2)
        print(nodes._switch.pid, *nodes.pids, flush=True)
        sys.stdin.readline()
        print(nodes.alive(0), nodes.alive(1), nodes.run(1, "hostname").stdout.strip(), flush=True)
        nodes.close()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": SRC},
        start_new_session=True)
    try:
        pids = [int(p) for p in kernel.stdout.readline().split()]
        os.killpg(kernel.pid, signal.SIGINT)
        assert kernel.stdout.readline().strip() == "interrupted"
        time.sleep(0.3)
        assert all(running(p) for p in pids), "an interrupt ended the nodes"
        kernel.stdin.write("\n")
        kernel.stdin.flush()
        assert kernel.stdout.readline().split() == ["True", "True", "node1"]
        assert kernel.wait(timeout=20) == 0 and gone(pids)
    finally:
        kernel.kill()
        kernel.wait()


def test_a_nodes_commands_keep_the_callers_path_and_find_the_system_tools(nodes):
    """An ordinary Debian user's PATH lacks /usr/sbin (ip, tc); a node's commands get it appended, and
    keep whatever PATH the caller gave first (a launcher puts its own Python's folder there)."""
    argv = nodes.command(0, ["sh", "-c", 'echo "$PATH"; command -v ip; command -v tc'])
    done = subprocess.run(argv, env={"PATH": "/opt/first:/usr/local/bin:/usr/bin:/bin"}, capture_output=True,
                          text=True, check=True)
    path, ip, tc = done.stdout.split("\n")[:3]
    assert path.startswith("/opt/first:/usr/local/bin:/usr/bin:/bin:") and "/usr/sbin" in path.split(":")
    assert ip.endswith("/ip") and tc.endswith("/tc")
    assert namespaces.missing_tools(path="/usr/local/bin:/usr/bin:/bin") == []  # found where Debian keeps them
