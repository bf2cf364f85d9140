"""Issue #52 item 5: a kernel that used distlab leaves nothing the learner did not ask to keep, once it ends.

A real kernel (jupyter_client) runs ``spawn``, ``Nodes(2)``, a spawn on those nodes and chapter 7's
``WORK`` cell, then ends as JupyterLab ends it: ``shutdown_kernel()`` sends a shutdown request and,
after ``shutdown_wait_time / 2`` (2.5 s), SIGTERM, then SIGKILL. Before: ipykernel's shutdown waited
for multiprocessing's resource tracker (which ignores SIGTERM) and for the forkserver's zombie, the
kernel got that SIGTERM and died without its ``atexit`` handlers, and its ``proc-<host>-<pid>-*``
folder, its nodes' process folders and ``<tmp>/ddp-train-*`` stayed. After a SIGKILL, which runs
nothing, the next kernel's start prunes what the killed one left.

Each kernel gets a runs root of its own (``DISTLAB_RUNS``): other work on the machine cannot touch it.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from procs import running

from distlab.folders import private

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not shutil.which("lsns"), reason="needs lsns (util-linux)")]
CHAPTER7 = Path(__file__).parents[1] / "book" / "07_two_gpu_training.ipynb"

USE = """
import json, os, sys
import distlab
def f(rank):
    return os.getpid()
local = distlab.spawn(f, nprocs=2).returns
nodes = distlab.Nodes(2)
on_nodes = distlab.spawn(f, nprocs=1, nodes=nodes).returns
from distlab.teach import training
stay = (f"{sys.executable} -c 'import time; from distlab.folders import privtmp; "
        "print(privtmp.process_dir(), flush=True); time.sleep(300)'")
staying = training.OnNodes(nodes, [stay] * 2, echo=False)  # what runs on the nodes when the kernel ends
staying.wait_for("proc-", node=0), staying.wait_for("proc-", node=1)
spaces = sorted({os.readlink(f"/proc/{p}/ns/net") for p in nodes.holder_pids()} - {os.readlink("/proc/self/ns/net")})
"""
REPORT = "print(json.dumps({'work': str(WORK), 'spaces': spaces, 'holders': sorted(nodes.holder_pids())}))"


def work_cell() -> str:
    """Chapter 7's first code cell, which makes ``WORK``, as the chapter has it."""
    cells = json.loads(CHAPTER7.read_text())["cells"]
    return next("".join(c["source"]) for c in cells if c["cell_type"] == "code" and "WORK =" in "".join(c["source"]))


def start_kernel(root: Path):
    from jupyter_client.manager import start_new_kernel

    return start_new_kernel(kernel_name="python3", startup_timeout=180, env={**os.environ, "DISTLAB_RUNS": str(root)})


def run(kc, code: str) -> str:
    out = []
    reply = kc.execute_interactive(code, timeout=300, output_hook=lambda m: out.append(m["content"].get("text", "")))
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(out)


def use_distlab(kc) -> dict:
    run(kc, work_cell())
    run(kc, USE)
    return json.loads(run(kc, REPORT).strip().splitlines()[-1])


def hosts_of(names: list[str]) -> list[str]:
    return sorted(private.owner_of(name)[0] for name in names)


def leaked(spaces: list[str], ended: float) -> set[str]:
    """Which of ``spaces`` (``net:[inode]``) ``lsns -t net`` still lists, held by a process that started
    before ``ended`` (a time). Other work on this machine makes namespaces too, and the kernel reuses a
    freed namespace's inode number: a namespace made since ours went is someone else's."""
    out = subprocess.run(["lsns", "-t", "net", "-n", "-o", "NS,PID"], capture_output=True, text=True).stdout
    found = set()
    for line in out.splitlines():
        ns, pid = line.split()
        try:
            if f"net:[{ns}]" in spaces and psutil.Process(int(pid)).create_time() <= ended:
                found.add(f"net:[{ns}]")
        except psutil.Error:
            continue
    return found


def leftovers(root: Path) -> list[str]:
    """Process folders in the root (run folders are kept on purpose, as the learner's record)."""
    return sorted(p.name for p in root.iterdir() if p.name.startswith("proc-"))


def wait_until(check, timeout: float = 15.0) -> bool:
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            return False
        time.sleep(0.2)
    return True


@pytest.fixture
def root(tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir(mode=0o700)
    return folder


def test_a_kernel_shut_down_as_jupyterlab_does_leaves_nothing_behind(root):
    km, kc = start_kernel(root)
    kernel = km.provisioner.process
    try:
        used = use_distlab(kc)
        assert Path(used["work"]).is_dir() and len(used["spaces"]) == 3  # the switch, 2 nodes
        assert hosts_of(leftovers(root)) == sorted([private.host_name(), "node0", "node1"])  # the kernel's, the nodes'
        assert Path(used["work"]).resolve().is_relative_to(root.resolve())  # in the private root, not <tmp>
    finally:
        kc.stop_channels()
        km.shutdown_kernel()  # a shutdown request, then SIGTERM and SIGKILL if the kernel is slow to go
    shutil.rmtree(used["work"], ignore_errors=True) if not Path(used["work"]).is_relative_to(root) else None
    # Before, the kernel never got past ipykernel's wait for its children (the resource tracker, the forkserver's
    # zombie) and died of jupyter_client's SIGTERM, 2.5 s after the request, without its exit handlers. On an idle
    # machine it now ends by itself (exit code 0, in ~0.7 s); on a loaded one the SIGTERM may still come, after
    # the cleanup: what must hold is that nothing is left.
    assert kernel.poll() is not None
    assert leftovers(root) == []  # the kernel's folder and those of the processes it ran on the nodes
    assert not Path(used["work"]).exists()  # chapter 7's WORK, with its script and checkpoints
    ended = time.time()
    assert wait_until(lambda: not leaked(used["spaces"], ended)), "a node's namespace outlived the kernel"
    assert not [p for p in used["holders"] if running(p)]


def test_what_a_killed_kernel_left_goes_when_the_next_kernel_starts(root):
    km, kc = start_kernel(root)
    try:
        used = use_distlab(kc)
        pid = km.provisioner.process.pid
        mine = leftovers(root)  # the kernel's, and those of the processes on its nodes
        assert len(mine) == 3 and Path(used["work"]).is_dir()
        os.kill(pid, signal.SIGKILL)  # the kernel alone, as the OOM killer would
        assert wait_until(lambda: km.provisioner.process.poll() is not None)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    ended = time.time()
    assert wait_until(lambda: not leaked(used["spaces"], ended))  # the holders' input closed with the kernel
    assert set(mine) <= set(leftovers(root))  # nothing ran at the SIGKILL
    km2, kc2 = start_kernel(root)
    try:
        run(kc2, "import distlab")  # its start prunes in the background, as a notebook's first cell does
        assert wait_until(lambda: not set(mine) & set(leftovers(root)), timeout=30), leftovers(root)
        assert not Path(used["work"]).exists()
    finally:
        kc2.stop_channels()
        km2.shutdown_kernel()


def test_a_resource_tracker_distlab_starts_is_not_in_the_kernels_process_group(tmp_path):
    """ipykernel's shutdown SIGTERMs its process group's children and waits for them; the tracker ignores SIGTERM."""
    code = ("import os, time\nfrom multiprocessing import resource_tracker\nfrom distlab.forkserver import client\n"
            "client.ensure_server()\npid = resource_tracker._resource_tracker._pid\n"
            "print(pid, os.getpgid(pid) != os.getpgrp(), flush=True)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "DISTLAB_RUNS": str(tmp_path)})
    pid, apart = out.stdout.split()
    assert apart == "True", out.stderr
    assert wait_until(lambda: not running(int(pid)), timeout=10)  # it still ends with the process that started it


def test_a_forkserver_that_ends_is_reaped_not_left_a_zombie(tmp_path):
    code = ("import os, signal, time, psutil\nfrom distlab.forkserver import client\nclient.ensure_server()\n"
            "pid = client._SERVER._forkserver_pid\nos.kill(pid, signal.SIGTERM)\ntime.sleep(2)\n"
            "print([c.status() for c in psutil.Process().children() if c.pid == pid])\n"
            "client.ensure_server()\nprint(client._SERVER._forkserver_pid != pid)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "DISTLAB_RUNS": str(tmp_path)})
    assert out.stdout.split("\n")[:2] == ["[]", "True"], out.stdout + out.stderr  # gone, and a new one starts
