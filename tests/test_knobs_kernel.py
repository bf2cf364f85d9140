"""A knob lab (distlab.teach.knobs) in a real kernel that believes JupyterLab started it: an
interrupted first run leaves no rank behind, and the cell runs again at once."""
import time

import pytest
from procs import running
from test_ranks_kernel import Kernel, ok, stdout

pytestmark = pytest.mark.slow

LAB = """
import os, time
import torch.distributed as dist
import distlab
from distlab.teach.knobs import knobs
started = []

def hold(pause):
    print('holding', flush=True)
    time.sleep(pause)
    return os.getpid()

def lab(world=2, pause={pause}):
    with distlab.Ranks(world) as lab_ranks:
        started.append(lab_ranks.pids)
        got = lab_ranks.run(hold, pause)
    return f'world={{world}} pids={{sorted(got.values())}}'

box = knobs(lab, world=(2, 4))
"""


def test_an_interrupted_lab_leaves_no_rank_and_runs_again():
    k = Kernel(live=True)
    try:
        msg_id = k.send(LAB.format(pause=120))
        k.wait_for_text(msg_id, "holding", 2)
        k.km.interrupt_kernel()
        cell = k.collect(msg_id)
        assert cell["error"][0] == "RanksInterrupted", cell["error"]
        pids = [int(p) for p in stdout(ok(k.run("print(*started[0])"))).split()]
        deadline = time.time() + 5
        while any(running(p) for p in pids) and time.time() < deadline:
            time.sleep(0.05)
        assert len(pids) == 2 and not any(running(p) for p in pids), "the lab's ranks outlived the interrupt"
        again = ok(k.run(LAB.format(pause=0)))
        drawn = [text for _, _, text in again["displays"]]
        assert any(text.startswith("'world=2 pids=") for text in drawn), drawn
        assert any("IntSlider" in text or "VBox" in text for text in drawn), drawn  # the controls
    finally:
        k.close()


def test_a_moved_knob_runs_on_the_main_thread_shows_its_own_record_and_stops_on_interrupt(tmp_path):
    """tests/platform_jupyter.py on the book's own Jupyter (tests/test_platform_jupyter.py runs it on
    the platforms'): a slider let go, as JupyterLab sends it, runs the lab on the kernel's main
    thread (pyplot's), the cell shows that run's record and run folder, and Kernel > Interrupt
    stops the run and its ranks."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo / "src"), "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
    done = subprocess.run([sys.executable, str(repo / "tests" / "platform_jupyter.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("all checks passed"), \
        done.stdout + done.stderr[-4000:]
