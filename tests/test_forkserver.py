"""Ranks forked from distlab's forkserver (start="forkserver") and the fresh-interpreter fallback.

Pure rules first (no processes), then a kernel in a subprocess that starts the server, changes
its own state, launches, and is finally killed with SIGKILL mid-run.
"""
import ast
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from fake_kernel import run_cells
from procs import running

import distlab
from distlab import LaunchArgumentError
from distlab.forkserver import elastic as forklaunch
from distlab.forkserver import mode as launchmode
from distlab.view.display import TextView

TESTS = Path(__file__).parent


def test_auto_is_the_forkserver_where_it_works_else_fresh_interpreters():
    assert launchmode.resolve_start("auto", env={}, platform="linux") == "forkserver"
    assert launchmode.resolve_start("auto", env={}, platform="darwin") == "forkserver"
    assert launchmode.resolve_start("auto", env={}, platform="win32") == "spawn"
    assert launchmode.resolve_start("auto", env={}, platform="linux", forkserver_works=False) == "spawn"
    assert launchmode.resolve_start("forkserver", env={}, platform="win32") == "spawn"
    assert launchmode.resolve_start("spawn", env={}, platform="linux") == "spawn"


def test_distlab_start_overrides_only_auto():
    env = {"DISTLAB_START": "spawn"}
    assert launchmode.resolve_start("auto", env=env, platform="linux") == "spawn"
    assert launchmode.resolve_start("forkserver", env=env, platform="linux") == "forkserver"
    with pytest.raises(LaunchArgumentError, match="DISTLAB_START='fork'"):
        launchmode.resolve_start("auto", env={"DISTLAB_START": "fork"}, platform="linux")


def test_a_bad_start_fails_before_any_process(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTLAB_RUNS", str(tmp_path))
    ns = run_cells("def f(rank):\n    return rank\n")
    with pytest.raises(LaunchArgumentError, match=r"invalid argument start='fork': unknown start method"):
        distlab.spawn(ns["f"], nprocs=2, start="fork")
    assert list(tmp_path.iterdir()) == []


def test_a_forked_rank_gets_the_kernels_environment_plus_torchelastics():
    kernel = {"HOME": "/home/me", "MASTER_PORT": "12355", "ADDED_AFTER_SERVER": "yes"}
    forked = {"HOME": "/home/me", "STALE_FROM_SERVER": "x", "MASTER_PORT": "4000", "RANK": "1",
              "DISTLAB_RANK_STDOUT": "/r/rank1.out", "DISTLAB_AGENT_VARS": "DISTLAB_RANK_STDOUT,MASTER_PORT,RANK"}
    assert launchmode.rank_environment(kernel, forked) == {
        "HOME": "/home/me", "ADDED_AFTER_SERVER": "yes", "MASTER_PORT": "4000", "RANK": "1"}


def _failure_file(folder: Path, rank: int, when: float, message: str) -> str:
    path = folder / f"rank{rank}.error.json"
    path.write_text(json.dumps({"message": {"message": message, "extraInfo": {
        "py_callstack": f"tb {rank}", "timestamp": str(int(when)), "time": when}}}))
    return str(path)


def test_the_umask_is_read_from_proc_status_without_changing_it():
    assert launchmode.umask_from_status("Name:\tpython\nUmask:\t0077\nState:\tR (running)\n") == 0o077
    assert launchmode.umask_from_status("Name:\tpython\n") is None  # Linux < 4.7, or not Linux
    old = os.umask(0o027)
    try:
        assert launchmode.current_umask() == 0o027 and launchmode.current_umask() == 0o027
    finally:
        os.umask(old)


def test_failures_torchelastic_did_not_report_are_added(tmp_path):
    """torchelastic names one failed rank of a function entrypoint; the root cause may be another."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    files = {0: _failure_file(tmp_path, 0, 1000.5, "RuntimeError: Connection closed by peer"),
             1: _failure_file(tmp_path, 1, 1000.2, "ValueError: boom")}
    reported = ProcessFailure(local_rank=0, pid=10, exitcode=1, error_file=files[0])
    exc = SimpleNamespace(failures={0: reported})
    procs = [SimpleNamespace(_args=(None, i, (), ""), exitcode=code, pid=10 + i)
             for i, code in enumerate((1, 1, -6, -15, 0))]
    forklaunch.add_unreported_failures(exc, procs, files)
    assert exc.failures[0] is reported
    assert exc.failures[1].message["extraInfo"]["py_callstack"] == "tb 1" and exc.failures[1].exitcode == 1
    assert exc.failures[2].exitcode == -6 and exc.failures[3].exitcode == -15  # died without an error file
    assert 4 not in exc.failures  # exited cleanly


def test_no_forkserver_means_fresh_interpreters_with_a_warning(monkeypatch):
    from distlab.forkserver import client as forkserver

    def broken():
        raise OSError("no room for a server")

    monkeypatch.setattr(forkserver, "ensure_server", broken)
    ns = run_cells("import os\ndef parent(rank):\n    return os.getppid()\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = distlab.spawn(ns["parent"], nprocs=1, view=None, start="forkserver")
    assert res.returns == {0: os.getpid()}  # a fresh interpreter started by this process
    assert any("could not start the forkserver (no room for a server)" in str(w.message) for w in caught)


CELLS = '''
import os
import sys
import time
import torch
import torch.distributed as dist

def state(rank, port):
    fresh = "edited_mod" not in sys.modules
    preloaded = "distlab.forkserver.preload" in sys.modules  # imported (with torch) by the server only
    import edited_mod
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)  # the user's own port
    dist.init_process_group("gloo", rank=rank, world_size=2)
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return {"gone": os.environ.get("DISTLAB_GONE"), "new": os.environ.get("DISTLAB_NEW"), "cwd": os.getcwd(),
            "on_path": any(p.endswith("mods") for p in sys.path), "version": edited_mod.VERSION,
            "fresh_import": fresh, "sum": t.item(), "parent": os.getppid(), "threads": torch.get_num_threads(),
            "preloaded": preloaded}

def sleeper(rank):
    print("sleeping", flush=True)
    time.sleep(120)
'''
DRIVER = f"""
import json, os, socket, sys
sys.path.insert(0, {str(TESTS)!r})
from fake_kernel import run_cells
import distlab
from distlab.forkserver import client as forkserver

work = sys.argv[1]
mods = os.path.join(work, "mods")
os.makedirs(mods)
with open(os.path.join(mods, "edited_mod.py"), "w") as f:
    f.write("VERSION = 1\\n")
sys.path.append(mods)
import edited_mod  # the kernel imported it before the server started; the server never does
os.environ["DISTLAB_GONE"] = "set when the server started"
server = forkserver.ensure_server()
del os.environ["DISTLAB_GONE"]
os.environ["DISTLAB_NEW"] = "set after"
os.chdir(work)
ns = run_cells({CELLS!r})

from ports import reserved_port

def free_port():  # held until the driver exits (tests/ports.py): no one else can take it meanwhile
    return reserved_port().__enter__()

first = distlab.spawn(ns["state"], args=(free_port(),), nprocs=2, view=None)
with open(os.path.join(mods, "edited_mod.py"), "w") as f:
    f.write("VERSION = 22  # edited after the first launch\\n")
second = distlab.spawn(ns["state"], args=(free_port(),), nprocs=2, view=None)
fresh = distlab.spawn(ns["state"], args=(free_port(),), nprocs=2, view=None, start="spawn")
import multiprocessing
print("STATE", json.dumps({{"server": server, "kernel": os.getpid(), "first": first.returns,
                           "default_start_method": multiprocessing.get_start_method(allow_none=True),
                           "second": second.returns, "spawn": fresh.returns}}), flush=True)
distlab.spawn(ns["sleeper"], nprocs=2, view=None)
"""


def wait_for_spares(server: int) -> list[int]:
    """The spare ranks the server forks while a long run goes on (SETTLE_S after its requests)."""
    deadline = time.time() + 30
    while time.time() < deadline:
        found = [p.pid for p in psutil.Process(server).children() if p.name() == "distlab-spare"]
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("the server forked no spare rank while the run went on")


def alive(pids):
    return [p for p in pids if running(p)]


def wait_for_sleepers(runs: Path, proc) -> list[int]:
    deadline = time.time() + 120
    while time.time() < deadline:
        ready = list(runs.glob("*sleeper*/ready/rank*"))
        logs = [p.read_text() for p in runs.glob("*sleeper*/logs/attempt0/rank*.out")]
        if len(ready) == 2 and sum("sleeping" in log for log in logs) == 2:
            return [int(p.read_text()) for p in ready]
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the sleepers never started:\n" + proc.communicate()[0])


@pytest.mark.slow
def test_ranks_see_the_kernel_at_launch_and_die_with_it_and_so_does_the_server(tmp_path):
    runs, work = tmp_path / "runs", tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if k != "DISTLAB_START"}
    env["DISTLAB_RUNS"] = str(runs)
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(work)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    pids = wait_for_sleepers(runs, proc)
    server = psutil.Process(pids[0]).ppid()
    spares = wait_for_spares(server) if sys.platform.startswith("linux") else []
    proc.kill()  # SIGKILL: the kernel can clean nothing up itself
    out = proc.communicate()[0]
    deadline = time.time() + 5
    while alive([*pids, *spares, server]) and time.time() < deadline:
        time.sleep(0.1)
    assert alive([*pids, *spares, server]) == [], "ranks, spare ranks or the forkserver outlived the killed kernel"

    state = json.loads(out.split("STATE ", 1)[1].splitlines()[0])
    assert state["server"] == server
    assert state["default_start_method"] is None  # still the user's to choose
    for name, version in (("first", 1), ("second", 22), ("spawn", 22)):
        for rank in ("0", "1"):
            seen = state[name][rank]
            assert seen["gone"] is None and seen["new"] == "set after", (name, seen)
            assert seen["cwd"] == str(work) and seen["on_path"], (name, seen)
            assert seen["fresh_import"] and seen["version"] == version, (name, seen)
            assert seen["sum"] == 2.0 and seen["threads"] == 1, (name, seen)
            assert seen["preloaded"] == (name != "spawn"), (name, seen)
    assert {s["parent"] for s in (*state["first"].values(), *state["second"].values())} == {server}
    assert {s["parent"] for s in state["spawn"].values()} == {state["kernel"]}


class _Reader(TextView):
    """Touches ``flag`` when it receives the line ``ping``: proof that output arrives live."""

    def __init__(self, flag: Path):
        super().__init__(1)
        self.flag, self.lines = flag, []

    def line(self, rank, text):
        self.lines.append(text)
        if text == "ping":
            self.flag.touch()


@pytest.mark.slow
@pytest.mark.usefixtures("start_mode")
def test_a_ranks_output_reaches_the_notebook_while_it_runs(tmp_path):
    ns = run_cells("""
    import os
    import time
    def wait_for_reader(rank, flag):
        print("ping")  # no flush: ranks write unbuffered, as `python -u` does
        deadline = time.time() + 60
        while not os.path.exists(flag):
            if time.time() > deadline:
                raise TimeoutError("nobody read 'ping' while this rank was running")
            time.sleep(0.05)
        print("seen")
    """)
    reader = _Reader(tmp_path / "seen")
    res = distlab.spawn(ns["wait_for_reader"], args=(str(tmp_path / "seen"),), nprocs=1, view=reader)
    assert reader.lines == ["ping", "seen"]
    assert res.logs[0] == "ping\nseen\n"
    assert (res.run_dir / "logs/attempt0/rank0.err").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("start_mode")
def test_exit_handlers_of_a_rank_run_when_it_ends(tmp_path):
    ns = run_cells("""
    import atexit
    def register_goodbye(rank, folder):
        atexit.register(lambda: open(f"{folder}/goodbye{rank}", "w").close())
    """)
    distlab.spawn(ns["register_goodbye"], args=(str(tmp_path),), nprocs=2, view=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["goodbye0", "goodbye1"]


@pytest.mark.slow
@pytest.mark.usefixtures("start_mode")
def test_every_rank_draws_its_own_random_numbers_as_a_fresh_process_would():
    """Unseeded data differs per rank (chapter 6 shows the article's DummyDataset does)."""
    ns = run_cells("""
    import random
    import numpy
    import torch
    def draw(rank):
        return torch.randn(4).tolist(), random.random(), numpy.random.rand()
    """)
    draws = [d for _ in range(2) for d in distlab.spawn(ns["draw"], nprocs=2, view=None).returns.values()]
    for kind in range(3):
        values = [repr(d[kind]) for d in draws]
        assert len(set(values)) == 4, f"generator {kind}: two ranks or two launches drew the same: {values}"


@pytest.mark.slow
def test_the_watcher_finds_forked_ranks_by_rank(tmp_path):
    """A forked rank's /proc environment is the server's: the watcher asks distlab's registry."""
    from distlab.launch import watch
    from distlab.teach import failures as lab

    ns = run_cells("""
    import os
    import time
    def wait_for(rank, flag):
        while not os.path.exists(flag):
            time.sleep(0.05)
    """)
    flag = tmp_path / "go"
    run = distlab.spawn(ns["wait_for"], args=(str(flag),), nprocs=2, join=False, view=None, start="forkserver")
    run_id, ready_dir = run.plan.elastic_run_id, run.plan.run_dir / "ready"
    deadline = time.time() + 60
    while len(list(ready_dir.glob("rank*"))) < 2 and time.time() < deadline:
        time.sleep(0.05)
    ready = {int(p.name[4:]): int(p.read_text()) for p in ready_dir.glob("rank*")}
    found = launchmode.forked_ranks(run_id)
    assert {rank: p.pid for rank, p in found.items()} == ready and len(ready) == 2
    assert {p.pid for p in watch.our_workers(run_id)} == set(ready.values())
    left = {p.pid for p in lab.worker_processes()}  # chapter 9's leftover check: ranks count, the server not
    assert set(ready.values()) <= left and launchmode.forkserver_pid() not in left
    flag.touch()
    run.join(timeout=60)
    assert launchmode.forked_ranks(run_id) == {}
    assert launchmode.forkserver_pid() is not None and lab.no_workers_left()


SYS_PATH_DRIVER = f"""
import json, os, sys
sys.path.insert(0, {str(TESTS)!r})
sys.path.insert(0, sys.argv[1])  # this checkout of distlab, found only through the kernel's sys.path
from fake_kernel import run_cells
import distlab
ns = run_cells("import os\\nimport distlab\\n"
               "def where(rank):\\n    return distlab.__file__, os.environ.get('PYTHONPATH')\\n")
res = distlab.spawn(ns["where"], nprocs=1, view=None, start="forkserver")
print("WHERE", json.dumps({{"kernel": distlab.__file__, "rank": res.returns[0][0], "rank_pythonpath": res.returns[0][1],
                           "kernel_pythonpath": os.environ.get("PYTHONPATH")}}), flush=True)
"""


@pytest.mark.slow
def test_the_server_imports_the_kernels_distlab_even_one_found_through_sys_path(tmp_path):
    src = Path(distlab.__file__).parent.parent
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DISTLAB_START")}
    env["DISTLAB_RUNS"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", SYS_PATH_DRIVER, str(src)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    where = json.loads(done.stdout.split("WHERE ", 1)[1].splitlines()[0])
    assert where["rank"] == where["kernel"] == str(src / "distlab" / "__init__.py")
    assert where["rank_pythonpath"] is None and where["kernel_pythonpath"] is None


def test_a_torn_error_file_is_reported_by_the_exit_code(tmp_path):
    """A rank aborted while writing its error file (seen with gloo's abort): the failure is still
    reported, by its exit code, instead of torchelastic's ProcessFailure failing to parse the file."""
    from types import SimpleNamespace

    from distlab.forkserver import elastic as forklaunch

    torn = tmp_path / "rank1.error.json"
    torn.write_text("")
    exc = SimpleNamespace(failures={})  # what torchelastic reported (here: nothing)
    proc = SimpleNamespace(exitcode=-6, pid=12345, _args=(None, 1))
    forklaunch.add_unreported_failures(exc, [SimpleNamespace(exitcode=0, pid=1, _args=(None, 0)), proc],
                                       {1: str(torn)})
    assert list(exc.failures) == [1] and exc.failures[1].exitcode == -6 and exc.failures[1].error_file == "<N/A>"


@pytest.mark.slow
def test_forked_ranks_create_files_with_the_kernels_umask_at_launch(tmp_path):
    """Before: a forked rank kept the umask the server started with (a file 0644 after the kernel
    set 077). Ranks of a launch and warm ranks get the kernel's umask at launch."""
    from distlab.forkserver import client as forkserver

    ns = run_cells("""
    import os
    def make(rank, folder):
        path = os.path.join(folder, f"launched{rank}")
        open(path, "w").close()
        return oct(os.stat(path).st_mode & 0o777)
    """)
    old = os.umask(0o022)
    try:
        forkserver.ensure_server()  # running with 022 (or whatever it started with): not what ranks get
        os.umask(0o077)
        res = distlab.spawn(ns["make"], args=(str(tmp_path),), nprocs=2, view=None, start="forkserver")
        with distlab.Ranks(1, start="forkserver") as ranks:
            warm = ranks.exec(f"import os; p = {str(tmp_path / 'warm')!r}; open(p, 'w').close(); "
                              "oct(os.stat(p).st_mode & 0o777)")
        os.umask(0o002)
        looser = distlab.spawn(ns["make"], args=(str(tmp_path / "sub"),), nprocs=1, view=None, start="forkserver") \
            if (tmp_path / "sub").mkdir() is None else None
    finally:
        os.umask(old)
    assert res.returns == {0: "0o600", 1: "0o600"}
    assert warm == {0: "0o600"}
    assert looser.returns == {0: "0o664"}  # each launch: the umask of that moment


PLANTED = "open({mark!r}, 'a').write(__name__ + '\\n')\nraise ImportError('planted in the working directory')\n"
SAFE_PATH_KERNEL = f"""
import os, sys
sys.path.insert(0, {str(TESTS)!r})
import torch
import distlab
from fake_kernel import run_cells
os.chdir(sys.argv[1])  # a folder with a planted torch.py and multiprocessing.py (a shared project folder)
ns = run_cells("def one(rank):\\n    return rank + 1\\n")
print("LAUNCH", distlab.spawn(ns["one"], nprocs=2, view=None, start="forkserver").returns, flush=True)
with distlab.Ranks(1, start="spawn") as ranks:
    print("WARM", ranks.exec("rank + 1"), flush=True)
"""


@pytest.mark.slow
def test_distlabs_own_interpreters_never_import_from_the_working_directory(tmp_path):
    """Before: the forkserver, multiprocessing's resource tracker and a warm rank (``python -c``)
    had the kernel's working directory first on ``sys.path`` and imported a planted module."""
    trap, mark = tmp_path / "trap", tmp_path / "planted-code-ran"
    trap.mkdir()
    for name in ("torch", "multiprocessing"):
        (trap / f"{name}.py").write_text(PLANTED.format(mark=str(mark)))
    env = {k: v for k, v in os.environ.items() if k not in ("DISTLAB_START", "PYTHONSAFEPATH")}
    env["DISTLAB_RUNS"] = str(tmp_path / "runs")
    done = subprocess.run([sys.executable, "-c", SAFE_PATH_KERNEL, str(trap)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert not mark.exists(), f"a planted module ran: {mark.read_text()}\n{done.stdout}{done.stderr}"
    assert done.returncode == 0, done.stdout + done.stderr
    assert "LAUNCH {0: 1, 1: 2}" in done.stdout and "WARM [rank0] 1" in done.stdout
    assert "not using a forkserver" not in done.stderr and "Warning" not in done.stderr, done.stderr


def test_internal_interpreters_leave_the_working_directory_off_sys_path():
    assert launchmode.safe_path_flags((3, 11)) == ["-P"] and launchmode.safe_path_flags((3, 10, 9)) == []
    out = subprocess.run([sys.executable, "-c", launchmode.SAFE_PATH_CODE + "print(sys.path)"],
                         capture_output=True, text=True, check=True).stdout
    assert "''" not in out


def test_the_server_socket_has_a_short_name_in_the_private_folder(tmp_path):
    from distlab.forkserver import client as forkserver

    assert forkserver.socket_path(str(tmp_path)) == str(tmp_path / "fs0")
    (tmp_path / "fs0").touch()  # a previous server's
    assert forkserver.socket_path(str(tmp_path)) == str(tmp_path / "fs1")


@pytest.mark.slow
def test_a_long_runs_root_still_gets_a_forkserver(tmp_path):
    # a DISTLAB_RUNS of 72 characters (pytest's tmp_path is often 60-70): the socket path still fits 107 bytes
    runs = tmp_path / ("r" * max(1, 72 - len(str(tmp_path)) - 1))
    script = tmp_path / "long_root.py"
    script.write_text("import warnings, distlab\nwarnings.simplefilter('error')\n"
                      "def f(rank):\n    return rank\n"
                      "print(distlab.spawn(f, nprocs=2, view=None, start='forkserver').returns)\n")
    done = subprocess.run([sys.executable, str(script)], env={**os.environ, "DISTLAB_RUNS": str(runs)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "{0: 0, 1: 1}" in done.stdout, done.stderr[-2000:]


PRELOAD_THEN_DDP = """
import os, sys, tempfile, threading
import distlab.forkserver.preload
import torch
import torch.distributed as dist
import distlab.worker
assert not torch.cuda.is_initialized(), "the server initialised CUDA"
assert threading.active_count() == 1, threading.enumerate()
pid = os.fork()
if pid == 0:  # a rank forked from the server: it may use the GPU, and its first DDP(...) imports ~nothing
    code = 0
    try:
        if torch.cuda.is_available():
            torch.ones(1, device="cuda").sum().item()
        os.environ["GLOO_SOCKET_IFNAME"] = distlab.worker.loopback_interface()
        store = os.path.join(tempfile.mkdtemp(), "store")
        dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
        before = set(sys.modules)
        torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
        print("NEW", sorted(set(sys.modules) - before), flush=True)
        dist.destroy_process_group()
    except BaseException as e:
        print("FAILED", repr(e), flush=True)
        code = 1
    os._exit(code)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the forkserver forks")
def test_the_server_preloads_what_ddp_needs_without_touching_cuda():
    """DDP's constructor reads torch._dynamo (~800 modules imported lazily, 1-6 s): the server imports
    it, so a forked rank's first DDP(...) imports next to nothing, and a forked rank may still use CUDA."""
    done = subprocess.run([sys.executable, "-c", PRELOAD_THEN_DDP], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    new = ast.literal_eval(done.stdout.split("NEW ", 1)[1].splitlines()[0])
    assert len(new) < 20, new
