"""The launcher end to end, with real worker processes (gloo, 2 ranks)."""
import os
import time

import pytest
import torch
from fake_kernel import run_cells
from procs import running

import distlab
from distlab import LaunchArgumentError, WorkerFailedError, WorkerTimeoutError

pytestmark = pytest.mark.slow

CELLS = run_cells(
    """
    import os
    import time
    import torch
    import torch.distributed as dist
    STEPS = 3
    """,
    """
    class Scale(torch.nn.Module):
        def __init__(self, k):
            super().__init__()
            self.k = k

        def forward(self, x):
            return x * self.k
    """,
    """
    def all_reduce_work(rank, world_size, base):
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        t = Scale(rank + 1)(base.clone())
        dist.all_reduce(t)
        for step in range(STEPS):
            distlab_report(step=step + 1, total=STEPS, loss=1.0 / (step + 1))
        print(f"rank {rank} done")
        store = dist.distributed_c10d._get_default_store()
        while hasattr(store, "underlying_store"):  # the PrefixStores init_process_group wraps it in
            store = store.underlying_store
        dist.destroy_process_group()
        return {"sum": t, "port": os.environ["MASTER_PORT"], "store": type(store).__name__}
    """,
    """
    def fail_on_rank_one(rank, world_size):
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        if rank == 1:
            time.sleep(0.5)
            print("rank 1 about to raise", flush=True)
            raise ValueError(f"boom at {time.time()!r}")
        dist.all_reduce(torch.ones(1))  # rank 0 waits here for a peer that never comes
        time.sleep(60)
    """,
    """
    def hang_on_rank_zero(rank, world_size):
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        if rank == 0:
            dist.all_reduce(torch.ones(1))
        time.sleep(60)
    """,
    """
    def sleeper(rank, seconds):
        print("sleeping", flush=True)
        time.sleep(seconds)
    """,
    """
    def listening_sockets(rank, world_size, launcher_pid):
        import psutil
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        dist.barrier()
        mine = [c.laddr.ip for c in psutil.Process().net_connections("inet") if c.status == "LISTEN"]
        parent = [c.laddr.ip for c in psutil.Process(launcher_pid).net_connections("inet") if c.status == "LISTEN"]
        dist.barrier()
        dist.destroy_process_group()
        return {"worker": mine, "parent": parent}
    """,
    """
    def group_info():
        return (dist.get_rank(), dist.get_world_size(), dist.get_backend())
    """,
    """
    def unsendable(rank):
        return lambda: rank
    """,
)
CELLS["distlab_report"] = distlab.report


def no_workers_left(run_dir) -> bool:
    pids = [int(p.read_text()) for p in (run_dir / "ready").glob("rank*")]
    return not any(running(p) for p in pids)


@pytest.mark.usefixtures("start_mode")
def test_spawn_runs_notebook_code_and_brings_everything_back():
    res = distlab.spawn(CELLS["all_reduce_work"], args=(2, torch.ones(2)), nprocs=2, view=None)
    assert torch.equal(res.returns[0]["sum"], torch.tensor([3.0, 3.0]))
    assert torch.equal(res.returns[1]["sum"], torch.tensor([3.0, 3.0]))
    assert "rank 1 done" in res.logs[1] and "rank 0 done" not in res.logs[1]
    assert res.series("loss", rank=1) == [1.0, 0.5, 1.0 / 3]
    assert (res.run_dir / "args.pt").exists()  # a tensor argument travels as data
    assert "class Scale(torch.nn.Module):" in res.script.read_text()
    assert res.returns[0]["port"] == res.returns[1]["port"]


@pytest.mark.usefixtures("start_mode")
def test_first_failing_rank_is_named_with_its_traceback_quickly():
    start = time.time()
    with pytest.raises(WorkerFailedError) as e:
        distlab.spawn(CELLS["fail_on_rank_one"], args=(2,), nprocs=2, view=None)
    err = e.value
    raised_at = float(err.remote_traceback.strip().splitlines()[-1].split("boom at ")[1])
    assert err.rank == 1 and err.exitcode == 1
    assert "ValueError: boom at" in err.remote_traceback and "in fail_on_rank_one" in err.remote_traceback
    assert "rank 1 about to raise" in str(err)
    assert time.time() - raised_at <= 5.0, f"reported {time.time() - raised_at:.1f}s after the raise"
    assert time.time() - start < 30
    assert no_workers_left(err.result.run_dir)


def test_hang_times_out_with_each_ranks_stack(start_mode):
    # The ranks must be running when the time runs out. A first launch starts the forkserver, and says
    # how long fresh interpreters take to start now (they import torch: seconds on a loaded machine).
    started = distlab.spawn(CELLS["sleeper"], args=(0,), nprocs=2, view=None).wall_s
    timeout = max(20.0, 3 * started)  # on a loaded 2-core machine `import torch` alone took > 6 s
    start = time.time()
    with pytest.raises(WorkerTimeoutError) as e:
        distlab.spawn(CELLS["hang_on_rank_zero"], args=(2,), nprocs=2, timeout=timeout, view=None)
    stacks = e.value.stacks
    assert "in all_reduce" in stacks[0] and "in hang_on_rank_zero" in stacks[0]
    assert "in all_reduce" not in stacks[1] and "in hang_on_rank_zero" in stacks[1]
    assert time.time() - start < timeout + 20
    assert no_workers_left(e.value.result.run_dir)


@pytest.mark.usefixtures("start_mode")
def test_launch_initialises_the_group_for_the_user():
    res = distlab.launch(CELLS["group_info"], world_size=2, view=None)
    assert res.returns == {0: (0, 2, "gloo"), 1: (1, 2, "gloo")}


def test_single_node_run_listens_on_loopback_only():
    res = distlab.spawn(CELLS["listening_sockets"], args=(2, os.getpid()), nprocs=2, view=None)
    for rank in (0, 1):
        addresses = res.returns[rank]["worker"] + res.returns[rank]["parent"]
        assert res.returns[rank]["parent"] == [], "the launcher hosts no store: the ranks meet in a private file"
        assert set(addresses) <= {"127.0.0.1"}, addresses


def test_concurrent_launches_do_not_clash():
    runs = [distlab.spawn(CELLS["all_reduce_work"], args=(2, torch.ones(2)), nprocs=2, join=False, view=None)
            for _ in range(3)]
    results = [r.join(timeout=120) for r in runs]
    assert all(torch.equal(r.returns[1]["sum"], torch.tensor([3.0, 3.0])) for r in results)
    assert len({r.run_dir for r in results}) == 3
    # each run's own file, in its own folder: a FileStore, inside distlab's PromptStore where torch has no CUDA
    expected = "FileStore" if torch.backends.cuda.is_built() else "PromptStore"
    assert {r.returns[0]["store"] for r in results} == {expected}


def test_bad_arguments_fail_before_any_process(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTLAB_RUNS", str(tmp_path))
    for kwargs in ({"nprocs": 0}, {"args": [2]}, {"timeout": -1}):
        with pytest.raises(LaunchArgumentError):
            distlab.spawn(CELLS["sleeper"], **{"args": (1,), **kwargs})
    with pytest.raises(LaunchArgumentError, match="NCCL needs one GPU per rank"):
        distlab.launch(CELLS["group_info"], world_size=64, backend="nccl")
    with pytest.raises(LaunchArgumentError, match="must be a Python function"):
        distlab.spawn(print, nprocs=2)
    assert list(tmp_path.iterdir()) == []  # no run folder, so no process was started


def test_unsendable_return_value_names_the_rank():
    with pytest.raises(WorkerFailedError, match=r"rank 0's return value \(function\).*Return plain Python data"):
        distlab.spawn(CELLS["unsendable"], nprocs=1, view=None)


def test_run_script_torchrun_and_python_modes(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text(
        "import os, sys\n"
        "import torch.multiprocessing as mp\n"
        "def work(rank):\n"
        "    print('spawned', rank, flush=True)\n"
        "if __name__ == '__main__':\n"
        "    if 'RANK' in os.environ:\n"
        "        print('torchrun rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], sys.argv[1:])\n"
        "    else:\n"
        "        mp.spawn(work, nprocs=2)\n"
    )
    res = distlab.run_script(script, nproc_per_node=2, args=["--epochs", 1], view=None)
    assert "torchrun rank 1 of 2 ['--epochs', '1']" in res.logs[1]
    os.environ.pop("RANK", None)
    res = distlab.run_script(script, mode="python", view=None)
    assert "spawned 0" in res.logs[0] and "spawned 1" in res.logs[0]


@pytest.mark.usefixtures("start_mode")
def test_max_restarts_reruns_every_rank_and_keeps_each_attempts_log():
    ns = run_cells("""
    import os
    import torch.distributed as dist
    def flaky(rank, world):
        attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        dist.init_process_group("gloo", rank=rank, world_size=world)
        print("attempt", attempt, flush=True)
        if attempt == 0 and rank == 1:
            raise RuntimeError("first attempt fails")
        dist.destroy_process_group()
        return attempt
    """)
    res = distlab.spawn(ns["flaky"], args=(2,), nprocs=2, max_restarts=1, view=None)
    assert res.returns == {0: 1, 1: 1}
    log = res.logs[1]
    assert log.index("--- attempt 0 ---") < log.index("RuntimeError: first attempt fails") < log.index(
        "--- attempt 1 ---") < log.index("attempt 1")


TWO_NODE_JOB = """import os, psutil, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print("rank", dist.get_rank(), "of", dist.get_world_size(), "sum", t.item())
kernel, port = psutil.Process(int(os.environ["KERNEL_PID"])), int(os.environ["RDZV_PORT"])
print("AGENT_IN_KERNEL", os.getppid() == kernel.pid)
print("KERNEL_LISTENS", any(c.laddr.port == port for c in kernel.net_connections("inet") if c.status == "LISTEN"))
dist.destroy_process_group()
"""
TWO_NODE_DRIVER = """import os, sys, distlab
os.environ.update(KERNEL_PID=str(os.getpid()), RDZV_PORT=sys.argv[3].rsplit(":", 1)[1])
res = distlab.run_script(sys.argv[1], nproc_per_node=1, nnodes=2, rdzv_endpoint=sys.argv[3], view=None,
                         timeout=90)  # the same call on each machine (argv[2], the machine, is for the reader)
print("LOGS", res.logs)
"""


def test_run_script_two_nodes_over_loopback_with_c10d_rendezvous(tmp_path):
    import subprocess
    import sys

    from ports import reserved_port

    job = tmp_path / "job.py"
    job.write_text(TWO_NODE_JOB)
    with reserved_port() as port:
        endpoint = f"127.0.0.1:{port}"
        nodes = [subprocess.Popen([sys.executable, "-c", TWO_NODE_DRIVER, str(job), str(k), endpoint],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for k in (0, 1)]
        outs = [p.communicate(timeout=150)[0] for p in nodes]
    assert all(p.returncode == 0 for p in nodes), outs
    joined = "".join(outs)
    assert "rank 0 of 2 sum 3.0" in joined and "rank 1 of 2 sum 3.0" in joined
    # torch's c10d rendezvous unpickles store data: its agent (and store) live outside the kernel
    assert joined.count("AGENT_IN_KERNEL False") == 2 and joined.count("KERNEL_LISTENS False") == 2, outs


def test_report_from_ranks_a_python_mode_script_spawns_itself(tmp_path):
    script = tmp_path / "own_ranks.py"
    script.write_text(
        "import os, torch.distributed as dist, torch.multiprocessing as mp\n"
        "import distlab\n"
        "def work(rank):\n"
        "    dist.init_process_group('gloo', rank=rank, world_size=2, init_method=os.environ['URL'])\n"
        "    distlab.report(step=1, who=rank)\n"
        "    dist.destroy_process_group()\n"
        "if __name__ == '__main__':\n"
        "    assert 'RANK' not in os.environ and 'MASTER_PORT' not in os.environ\n"
        f"    os.environ['URL'] = 'file://{tmp_path}/rdzv'\n"
        "    mp.spawn(work, nprocs=2)\n"
    )
    res = distlab.run_script(script, mode="python", view=None)
    assert res.series("who", rank=0) == [0] and res.series("who", rank=1) == [1]


class Arrivals:
    """A view that notes when each line reached the kernel (seconds after the run began)."""

    def __init__(self):
        self.t0, self.lines = time.monotonic(), []

    def line(self, rank, text):
        self.lines.append((time.monotonic() - self.t0, rank, text))

    def metric(self, rank, row):
        pass

    def close(self):
        pass


def test_a_python_mode_scripts_own_ranks_stream_live_under_the_scripts_name(tmp_path, monkeypatch, capsys):
    """#38 item 9: the lines of a script's own mp.spawn ranks arrived only when each rank ended (they
    wrote to a file, block-buffered), and the text view called the script's one process [rank0]."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # as in a kernel started without it
    script = tmp_path / "own_ranks.py"
    script.write_text(
        "import sys, time, torch.multiprocessing as mp\n"
        "def work(rank):\n"
        "    print('before the nap', rank)\n"
        "    time.sleep(float(sys.argv[1]))\n"
        "    print('after the nap', rank)\n"
        "if __name__ == '__main__':\n"
        "    mp.spawn(work, nprocs=1)\n"
    )
    seen = Arrivals()
    distlab.run_script(script, args=[2], mode="python", view=seen)
    at = {text: t for t, _, text in seen.lines}
    assert at["after the nap 0"] - at["before the nap 0"] >= 1.5, f"not live: {seen.lines}"
    distlab.run_script(script, args=[0], mode="python", view="text")
    assert capsys.readouterr().out.splitlines() == ["[own_ranks.py] before the nap 0", "[own_ranks.py] after the nap 0"]
