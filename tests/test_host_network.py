"""Nothing distlab starts sends a packet to a node address from the host's own network (issue 45, item 6).

Nodes' addresses (``10.77.0.0/16``, :data:`distlab.nodes.plan.SUBNET`) exist only inside the nodes'
namespaces. From the host's namespace the same address would leave through its default route, onto
the site's real network, where anyone may answer. So a tour of the nodes runs in a stand-in for the
host: the first questions of ``local_cluster()`` and ``submit()`` with no slurm.conf (which Slurm
would put to the site's DNS), a spawn with agents and standbys, warm ranks, a command on a node, a
Slurm cluster on the nodes with ``sinfo`` typed on the host, and a job. The stand-in is a fresh
network namespace whose routes to ``10.77.0.0/16`` and to everywhere else go into two veth pairs
(this kernel has no dummy interfaces) that count what is sent into them. Neither may count a packet;
a last packet sent on purpose proves the counter counts.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TESTS = Path(__file__).parent

HOST_SH = ("set -e; ip link set lo up; sysctl -qw net.ipv6.conf.all.disable_ipv6=1 "
           "net.ipv6.conf.default.disable_ipv6=1; for dev in to-nodes elsewhere; do "
           "ip link add $dev type veth peer name $dev-p; ip link set $dev-p up; ip link set $dev up; done; "
           "ip route add 10.77.0.0/16 dev to-nodes; ip route add default dev elsewhere; "
           'exec "$@"')
TOUR = f"""
import os, socket, subprocess, sys
sys.path.insert(0, {str(TESTS)!r})
import distlab
from distlab import slurm
from fake_kernel import run_cells

def sent():
    rows = [line.split(":", 1) for line in open("/proc/net/dev").read().splitlines()[2:]]
    return {{dev.strip(): int(fields.split()[9]) for dev, fields in rows if dev.strip() in ("to-nodes", "elsewhere")}}

ns = run_cells("def where(rank):\\n    import socket\\n    return socket.gethostname()\\n")
print("BEFORE", sent(), flush=True)
from distlab.slurm import cluster as slurm_cluster, commands
if not any(os.path.isfile(p) for p in ("/etc/slurm/slurm.conf", "/run/slurm/conf/slurm.conf")):
    # no slurm.conf here: what local_cluster() and submit() ask first
    print("ANSWERS", slurm_cluster.controller_answers(), flush=True)
    try:
        commands.ping()
    except slurm.SlurmNotFoundError as e:
        print("PING", type(e).__name__, flush=True)
with distlab.Nodes(2) as nodes:
    print("RUN", nodes.run(1, "getent hosts node0").stdout.split(), flush=True)
    for attempt in ("agents", "standbys"):
        print("SPAWN", distlab.spawn(ns["where"], nprocs=1, nodes=nodes, view=None, timeout=180).returns, flush=True)
    with distlab.Ranks(1, nodes=nodes) as ranks:
        print("RANKS", ranks.exec("import socket; socket.gethostname()"), flush=True)
    cluster = slurm.local_cluster(nodes=nodes)
    try:
        print("SINFO", subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True).stdout.split())
        work = cluster.workdir()
        (work / "hello.py").write_text("import socket\\nprint('on', socket.gethostname())\\n")
        res = slurm.submit(work / "hello.py", nodes=2, ranks_per_node=1, mode="tasks", view=None, workdir=work)
        print("JOB", res.state, flush=True)
    finally:
        cluster.stop()
print("AFTER", sent(), flush=True)
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("10.77.0.9", 9))  # the one packet on purpose
print("PROBE", sent(), flush=True)
"""


def _said(out: str, tag: str):
    return eval(next(line for line in out.splitlines() if line.startswith(tag + " ")).split(" ", 1)[1])


def test_no_packet_reaches_a_node_address_or_leaves_from_the_host_s_namespace(tmp_path):
    from distlab.errors import NodesError
    from distlab.nodes import namespaces

    if os.geteuid() != 0:
        pytest.skip("the stand-in for the host's network and the Slurm cluster need root")
    try:
        namespaces.check_possible()
    except NodesError as e:
        pytest.skip(str(e))
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    env = {**{k: v for k, v in os.environ.items() if k not in ("SLURM_CONF",)}, "DISTLAB_RUNS": str(runs)}
    done = subprocess.run(["unshare", "--net", "--", "sh", "-c", HOST_SH, "sh", sys.executable, "-c", TOUR],
                          env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    out = done.stdout
    assert _said(out, "RUN")[-1] == "node0" and _said(out, "SINFO") == ["node0", "node1"]
    assert _said(out, "SPAWN") == {0: "node0", 1: "node1"} and "JOB COMPLETED" in out, out
    before, after, probe = _said(out, "BEFORE"), _said(out, "AFTER"), _said(out, "PROBE")
    assert after == before, f"packets left the host's namespace: {before} -> {after}"
    assert probe["to-nodes"] > after["to-nodes"]  # the counter does count (an ARP request, or the packet)
