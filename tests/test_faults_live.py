"""Faults and network exposure with real worker processes (gloo, CPU)."""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from fake_kernel import run_cells
from ports import reserved_port
from procs import running

import distlab
from distlab.errors import RunCancelledError, WorkerFailedError

pytestmark = pytest.mark.slow
TESTS = Path(__file__).parent

CELLS = run_cells(
    """
    import os
    import time
    import torch.distributed as dist
    """,
    """
    def setup(rank, world_size, port):  # the article's setup(): its own MASTER_ADDR/MASTER_PORT
        os.environ["MASTER_ADDR"] = "localhost"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    """,
    """
    def user_port_job(rank, world_size, port, flag):
        setup(rank, world_size, port)
        dist.barrier()
        print("group is up", flush=True)
        while not os.path.exists(flag):
            time.sleep(0.05)
        dist.barrier()
        dist.destroy_process_group()
        return {"nccl": os.environ.get("NCCL_SOCKET_IFNAME"), "gloo": os.environ.get("GLOO_SOCKET_IFNAME")}
    """,
    """
    def fail_fast(rank):
        raise ValueError(f"rank {rank} fails")
    """,
    """
    def sleeper(rank, seconds):
        print("sleeping", flush=True)
        time.sleep(seconds)
    """,
)


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.time() + seconds
    while not condition():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def rank_logs(run_dir: Path) -> list[str]:
    return [p.read_text() for p in run_dir.glob("logs/attempt0/rank*.out")]


def listening(procs) -> set[tuple[str, int]]:
    found = set()
    for p in procs:
        try:
            found |= {(c.laddr.ip, c.laddr.port) for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN}
        except psutil.NoSuchProcess:
            pass
    return found


def alive(pids) -> list[int]:
    return [p for p in pids if running(p)]


def test_a_user_chosen_master_port_is_served_on_loopback_only(tmp_path, start_mode):
    flag = tmp_path / "flag"
    with reserved_port() as port:
        run = distlab.spawn(CELLS["user_port_job"], args=(2, port, str(flag)), nprocs=2, join=False, view=None)
        try:
            wait_for(lambda: sum("group is up" in log for log in rank_logs(run.plan.run_dir)) == 2, 180, "the group")
            sockets = listening(psutil.Process().children(recursive=True))  # ranks, agent, forkserver: all ours
        finally:
            flag.write_text("go")
            res = run.join(timeout=180)
    assert ("127.0.0.1", port) in sockets  # rank 0 hosts the store on the user's port...
    assert {ip for ip, _ in sockets} == {"127.0.0.1"}, sockets  # ...and nothing listens beyond loopback
    assert res.returns[0]["nccl"] == res.returns[0]["gloo"] == "lo"


def test_a_failed_run_does_not_keep_its_store_alive():
    before = listening([psutil.Process()])
    with pytest.raises(WorkerFailedError, match="rank . fails") as e:
        distlab.spawn(CELLS["fail_fast"], nprocs=2, view=None)
    held = (e.value, e.value.__traceback__)  # IPython keeps sys.last_value and its traceback like this
    assert listening([psutil.Process()]) <= before
    assert held


def test_cancel_stops_every_rank_of_a_pending_run():
    run = distlab.spawn(CELLS["sleeper"], args=(120,), nprocs=2, join=False, view=None)
    ready = run.plan.run_dir / "ready"
    wait_for(lambda: len(list(ready.glob("rank*"))) == 2 and
             sum("sleeping" in log for log in rank_logs(run.plan.run_dir)) == 2, 180, "the ranks")
    pids = [int(p.read_text()) for p in ready.glob("rank*")]
    assert run.cancel(timeout=60)
    with pytest.raises(RunCancelledError, match="run cancelled; all 2 worker processes were stopped"):
        run.join()
    assert alive(pids) == []


CTRL_C_DRIVER = f"""
import signal, sys, time
sys.path.insert(0, {str(TESTS)!r})
from fake_kernel import run_cells
from ports import reserved_port
import distlab
ns = run_cells("import signal, time\\n"
               "def stubborn(rank):\\n"
               "    signal.signal(signal.SIGINT, signal.SIG_IGN)\\n"
               "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
               "    print('stubborn', flush=True)\\n"
               "    time.sleep(300)\\n")
in_spawn = True
def kernel_handler(signum, frame):  # as IPython's: a Ctrl-C raises KeyboardInterrupt
    if in_spawn:
        raise KeyboardInterrupt
signal.signal(signal.SIGINT, kernel_handler)
try:
    distlab.spawn(ns["stubborn"], nprocs=2, view=None)
except KeyboardInterrupt:
    in_spawn = False
in_spawn = False
print("AFTER", flush=True)
time.sleep(300)
"""


def test_a_second_ctrl_c_during_cleanup_leaves_no_worker_and_no_store(tmp_path):
    env = {**os.environ, "DISTLAB_RUNS": str(tmp_path)}
    driver = subprocess.Popen([sys.executable, "-c", CTRL_C_DRIVER], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out: list[str] = []
    threading.Thread(target=lambda: out.extend(driver.stdout), daemon=True).start()
    try:
        wait_for(lambda: len(list(tmp_path.glob("*/ready/rank*"))) == 2 and
                 sum("stubborn" in p.read_text() for p in tmp_path.glob("*/logs/attempt0/rank*.out")) == 2,
                 180, "the ranks")
        pids = [int(p.read_text()) for p in tmp_path.glob("*/ready/rank*")]
        os.kill(driver.pid, signal.SIGINT)  # the first Ctrl-C starts the cleanup...
        presses = 1
        deadline = time.time() + 30
        while alive(pids) and time.time() < deadline:
            time.sleep(0.2)
            if alive(pids):
                os.kill(driver.pid, signal.SIGINT)  # ...and the impatient user presses again and again
                presses += 1
        wait_for(lambda: "AFTER\n" in out, 60, "the driver to carry on")
        assert driver.poll() is None
        assert presses >= 2
        assert alive(pids) == [], "a worker outlived the cleanup"
        assert listening([psutil.Process(driver.pid)]) == set(), "the store is still listening"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()


RENDEZVOUS_DRIVER = """
import sys, time
import torch, distlab
start = time.time()
try:
    distlab.run_script(sys.argv[1], nproc_per_node=1, nnodes=2, rdzv_endpoint=sys.argv[2],
                       timeout=5, view=None)
except distlab.WorkerTimeoutError as e:
    print(f"TIMEOUT after {time.time() - start:.1f} s:", e, flush=True)
"""


def test_timeout_bounds_a_rendezvous_whose_other_node_never_comes(tmp_path):
    job = tmp_path / "job.py"
    job.write_text("print('never runs: the other node never comes')\n")
    with reserved_port() as port:
        driver = subprocess.Popen([sys.executable, "-c", RENDEZVOUS_DRIVER, str(job), f"127.0.0.1:{port}"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out = driver.communicate(timeout=120)[0]
        except subprocess.TimeoutExpired:
            os.killpg(driver.pid, signal.SIGKILL)
            raise AssertionError("run_script(nnodes=2, timeout=5) was still waiting after 120 s") from None
    assert "TIMEOUT after" in out, out
    seconds = float(out.split("TIMEOUT after ")[1].split()[0])
    assert 5 <= seconds < 40, out  # ~timeout; generous for a loaded 2-core machine
    assert "the agent was still waiting for the other nodes at 127.0.0.1:" in out
