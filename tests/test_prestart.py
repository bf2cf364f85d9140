"""The forkserver starts in the background when a notebook imports distlab (issue #28), and warm
ranks are forked from it."""
import os
import stat
import subprocess
import sys
import textwrap

import psutil
import pytest

import distlab
from distlab.folders import privtmp
from distlab.forkserver import client as forkserver
from distlab.forkserver import prestart


def test_the_rule_for_starting_the_server_in_the_background():
    assert prestart.wanted({}, interactive=True, start="forkserver")
    assert not prestart.wanted({}, interactive=False, start="forkserver")  # a script, a rank, a server
    assert not prestart.wanted({}, interactive=True, start="spawn")  # no server where ranks start fresh
    for off in ("0", "false", "No", " off "):
        assert not prestart.wanted({"DISTLAB_PRESTART": off}, interactive=True, start="forkserver")
    assert prestart.wanted({"DISTLAB_PRESTART": "1"}, interactive=True, start="forkserver")


SHELL = """
import time
from IPython.core.interactiveshell import InteractiveShell
InteractiveShell.instance()                      # as in a notebook: an IPython shell runs the import
began = time.perf_counter()
import distlab
print("IMPORT", time.perf_counter() - began, "torch" in __import__("sys").modules, flush=True)
from distlab.forkserver import client as forkserver
deadline = time.monotonic() + {wait}
while forkserver.server_pid() is None and time.monotonic() < deadline:
    time.sleep(0.05)
print("SERVER", forkserver.server_pid(), flush=True)
"""


def run_shell(wait: float, **env) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(SHELL.format(wait=wait))], capture_output=True,
                         text=True, timeout=180, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()}


def test_importing_distlab_in_a_notebook_starts_the_server_without_waiting_for_it():
    seen = run_shell(wait=120)
    assert seen["IMPORT"][1] == "False"  # the import did not import torch: the server does that
    assert seen["SERVER"][0] != "None"


def test_old_runs_are_pruned_in_the_background_not_by_the_first_launch(tmp_path):
    """The first prune of a process reads every run folder of the root (a day of work leaves
    thousands): in a notebook it runs in the prestart thread, before any launch."""
    from distlab.folders.private import private_root
    from distlab.folders.runfolder import KEEP_NEWEST

    root = private_root(tmp_path / "runs")
    for i in range(KEEP_NEWEST):  # the newest runs are kept whatever their age
        (root / f"20260101-0000{i:02d}-young-x").mkdir()
    old = root / "20250101-000000-old-x"
    (old / "logs").mkdir(parents=True)
    for p in (old / "logs", old):
        os.utime(p, (0, 0))
    script = ("from IPython.core.interactiveshell import InteractiveShell\n"
              "InteractiveShell.instance()\n"
              "import distlab\n"
              "from distlab.forkserver import prestart\n"
              "prestart.wait(120)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                         env={**os.environ, "DISTLAB_RUNS": str(root)})
    assert out.returncode == 0, out.stderr
    assert not old.exists()
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("2025")) == []


def test_distlab_prestart_0_opts_out():
    seen = run_shell(wait=3, DISTLAB_PRESTART="0")
    assert seen["SERVER"] == ["None"]


@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_warm_ranks_fork_from_the_server_or_start_fresh(start):
    with distlab.Ranks(2, start=start) as ranks:
        assert ranks.start == start
        parents = {psutil.Process(pid).ppid() for pid in ranks.pids}
        if start == "forkserver":
            assert parents == {forkserver.server_pid()}
        else:
            assert parents == {os.getpid()}
        assert ranks.exec("t = torch.ones(1) * (rank + 1); dist.all_reduce(t); t.item()") == {0: 3.0, 1: 3.0}
        assert ranks.exec("import os; os.getsid(0) == os.getpid()") == {0: True, 1: True}  # own session
        assert ranks.exec("torch.rand(1).item()")[0] != ranks.exec("torch.rand(1).item()")[1]  # own random state
        folder = ranks._group.folder  # in this process's private temporary folder, every file 0600
        assert folder.parent == privtmp.process_dir()
        assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()} == {
            name: 0o600 for name in ("store", "rank0.log", "rank1.log", "rank0.stacks", "rank1.stacks")}
        ranks.restart()
        assert ranks.exec("rank") == {0: 0, 1: 1}
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in ranks.pids)


def test_a_failed_run_prints_no_torch_log_line(capfd):
    from fake_kernel import run_cells

    cells = run_cells("import time\n", "def boom(rank):\n    if rank == 1:\n        raise ValueError('boom')\n"
                      "    time.sleep(60)  # torch terminates this rank once rank 1 failed\n")
    with pytest.raises(distlab.WorkerFailedError):
        distlab.spawn(cells["boom"], nprocs=2, view=None)
    err = capfd.readouterr().err
    assert "Terminating process" not in err and "torch/multiprocessing" not in err, err
