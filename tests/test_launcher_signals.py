"""Interrupting or killing the launching process (a kernel) never leaves workers behind."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import running

pytestmark = pytest.mark.slow
TESTS = Path(__file__).parent

DRIVER = f"""
import sys, time
sys.path.insert(0, {str(TESTS)!r})
from fake_kernel import run_cells
import distlab
ns = run_cells("import time\\ndef sleeper(rank):\\n    print('sleeping', flush=True)\\n    time.sleep(120)\\n",
               "def quick(rank):\\n    return rank * 2\\n")
try:
    distlab.spawn(ns["sleeper"], nprocs=2, view=None)
except KeyboardInterrupt as e:
    print("INTERRUPTED:", e, flush=True)
start = time.time()
res = distlab.spawn(ns["quick"], nprocs=2, view=None)
print("RELAUNCH:", res.returns, f"{{time.time() - start:.1f}}s", flush=True)
"""


def start_driver(tmp_path):
    env = {**os.environ, "DISTLAB_RUNS": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        ready = list(tmp_path.glob("*sleeper*/ready/rank*"))
        logs = [p.read_text() for p in tmp_path.glob("*sleeper*/logs/attempt0/rank*.out")]
        if len(ready) == 2 and sum("sleeping" in log for log in logs) == 2:
            return proc, [int(p.read_text()) for p in ready]
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("workers never became ready:\n" + proc.communicate()[0])


def alive(pids):
    return [p for p in pids if running(p)]


@pytest.mark.usefixtures("start_mode")
def test_interrupt_stops_workers_and_the_next_launch_works(tmp_path):
    proc, pids = start_driver(tmp_path)
    os.kill(proc.pid, signal.SIGINT)  # what Jupyter's "interrupt kernel" sends
    out, _ = proc.communicate(timeout=90)
    assert "INTERRUPTED: distlab: interrupted; all 2 worker processes were stopped." in out, out
    assert "RELAUNCH: {0: 0, 1: 2}" in out, out
    assert alive(pids) == []
    run_dir = next(tmp_path.glob("*sleeper*"))
    assert (run_dir / "sleeper.py").exists() and "sleeping" in (run_dir / "logs/attempt0/rank1.out").read_text()


@pytest.mark.usefixtures("start_mode")
def test_killed_kernel_leaves_no_orphans_even_stopped_ones(tmp_path):
    proc, pids = start_driver(tmp_path)
    os.kill(pids[0], signal.SIGSTOP)  # a stopped worker cannot run any watchdog of its own
    proc.kill()
    proc.wait()
    deadline = time.time() + 5
    while alive(pids) and time.time() < deadline:
        time.sleep(0.1)
    assert alive(pids) == [], "workers outlived their killed parent"
