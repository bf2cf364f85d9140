"""Error messages word for word, first-failure choice, log tailing and stack cleaning. No processes."""
import json
from types import SimpleNamespace

from distlab.errors import WorkerFailedError, WorkerTimeoutError
from distlab.launch.engine import first_failure_error, lines_before_traceback
from distlab.launch.watch import Watcher, rank_stack
from distlab.view.display import TextView


def test_worker_failed_message():
    e = WorkerFailedError(1, 1, "Traceback ...\nValueError: boom\n", "step 3\n", "/runs/x")
    assert str(e) == (
        "distlab: rank 1 failed first (exit code 1); the other ranks were stopped.\n"
        "Traceback ...\nValueError: boom\n"
        "--- last lines rank 1 printed ---\nstep 3\n"
        "Run folder (script and every rank's log): /runs/x"
    )
    assert e.rank == 1 and e.remote_traceback.endswith("boom\n")


def test_timeout_message_lists_every_rank():
    e = WorkerTimeoutError(5.0, {1: "File x.py, line 9 in hang", 0: "File x.py, line 3 in work"}, "/runs/y")
    text = str(e)
    assert text.startswith("distlab: the run did not finish within timeout=5.0s; all ranks were stopped.")
    assert text.index("--- rank 0 ---\nFile x.py, line 3 in work") < text.index("--- rank 1 ---")
    assert "another rank never called it" in text


def _failure(tmp_path, rank, when, exitcode=1):
    path = tmp_path / f"rank{rank}.error.json"
    if when is not None:
        msg = {"message": f"E{rank}", "extraInfo": {"py_callstack": f"tb of rank {rank}", "timestamp": str(int(when)),
                                                   "time": when}}
        path.write_text(json.dumps({"message": msg}))
        return SimpleNamespace(error_file=str(path), exitcode=exitcode, message=msg, timestamp=int(when))
    return SimpleNamespace(error_file="<N/A>", exitcode=exitcode, message="", timestamp=1000)


def test_first_failure_uses_subsecond_time_not_rank_order(tmp_path):
    (tmp_path / "logs").mkdir()
    exc = SimpleNamespace(failures={0: _failure(tmp_path, 0, 1000.9), 1: _failure(tmp_path, 1, 1000.2)})
    err = first_failure_error(exc, tmp_path, result=None)
    assert err.rank == 1 and err.remote_traceback == "tb of rank 1"


def test_a_rank_killed_by_a_signal_is_named(tmp_path):
    (tmp_path / "logs").mkdir()
    exc = SimpleNamespace(failures={3: _failure(tmp_path, 3, None, exitcode=-9)})
    err = first_failure_error(exc, tmp_path, result=None)
    assert "rank 3 wrote no Python traceback: it was killed by signal SIGKILL" in str(err)


def test_lines_before_traceback():
    log = "a\nb\nTraceback (most recent call last):\n  File x\nValueError: v\n"
    assert lines_before_traceback(log) == ["a", "b"]
    assert lines_before_traceback("a\nb\n") == ["a", "b"]


DUMP = """Thread 0x00007f (most recent call first):
  File "/x/distlab/worker.py", line 54 in _exit_with_parent
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007e (most recent call first):
  File "/venv/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/runs/hang.py", line 18 in hang
  File "/x/distlab/worker.py", line 124 in main
  File "<frozen runpy>", line 88 in _run_code
"""


def test_clean_stack_keeps_only_user_frames():
    assert rank_stack(DUMP) == (
        "Current thread 0x00007e (most recent call first):\n"
        '  File "/venv/torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n'
        '  File "/runs/hang.py", line 18 in hang'
    )


class Recorder(TextView):
    def __init__(self):
        super().__init__(2)
        self.lines, self.rows = [], []

    def line(self, rank, text):
        self.lines.append((rank, text))

    def metric(self, rank, row):
        self.rows.append((rank, row))


def test_watcher_streams_whole_lines_and_metrics_once(tmp_path):
    (tmp_path / "logs" / "attempt0").mkdir(parents=True)
    (tmp_path / "metrics").mkdir()
    out = tmp_path / "logs" / "attempt0" / "rank1.out"
    view = Recorder()
    w = Watcher(tmp_path, "rid", 2, view, timeout=None)
    out.write_text("hello\npart")
    w.poll()
    assert view.lines == [(1, "hello")]  # the unfinished line waits
    with open(out, "a") as f:
        f.write("ial\n")
    (tmp_path / "metrics" / "rank0.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    w.poll()
    w.poll(final=True)
    assert view.lines == [(1, "hello"), (1, "partial")]
    assert view.rows == [(0, {"step": 1, "loss": 0.5})]


def test_the_live_view_only_where_a_jupyter_server_started_the_kernel(monkeypatch):
    import sys

    from distlab.view.display import live_frontend

    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    assert not live_frontend({"JPY_SESSION_NAME": "x"})  # a terminal
    monkeypatch.setitem(sys.modules, "ipykernel", object())
    assert live_frontend({"JPY_SESSION_NAME": "nb.ipynb"})  # JupyterLab / Notebook
    assert not live_frontend({})  # nbclient (CI, the book build)


def test_a_rank_that_died_in_c_code_is_named_not_the_survivor_reporting_it(tmp_path):
    (tmp_path / "logs").mkdir()
    survivor = _failure(tmp_path, 0, 1000.05)
    survivor.message["extraInfo"]["py_callstack"] = "RuntimeError: Connection closed by peer [127.0.0.1]:4000"
    died = _failure(tmp_path, 1, None, exitcode=-6)  # SIGABRT from gloo, no error file, observed later
    died.timestamp = 1001
    err = first_failure_error(SimpleNamespace(failures={0: survivor, 1: died}), tmp_path, result=None)
    assert err.rank == 1 and "killed by signal SIGABRT" in str(err)


def test_ranks_stopped_by_sigterm_are_never_the_root_cause(tmp_path):
    (tmp_path / "logs").mkdir()
    stopped = _failure(tmp_path, 0, None, exitcode=-15)
    stopped.timestamp = 900
    err = first_failure_error(SimpleNamespace(failures={0: stopped, 2: _failure(tmp_path, 2, 1000.0)}), tmp_path, None)
    assert err.rank == 2


def test_a_rank_reporting_a_lost_peer_is_named_before_one_that_was_only_stopped(tmp_path):
    """Seen in chapter 5: gloo's connectFullMesh failed on rank 1 while rank 0, still silent, was stopped;
    the stopped rank's whole-second timestamp is earlier than rank 1's error time, yet says nothing."""
    (tmp_path / "logs").mkdir()
    stopped = _failure(tmp_path, 0, None, exitcode=-15)
    stopped.timestamp = 1000
    peer = _failure(tmp_path, 1, 1000.7)
    peer.message["extraInfo"]["py_callstack"] = "RuntimeError: Gloo connectFullMesh failed: Connection closed by peer"
    err = first_failure_error(SimpleNamespace(failures={0: stopped, 1: peer}), tmp_path, None)
    assert err.rank == 1 and "connectFullMesh" in str(err)


def test_descendants_from_proc_are_psutils_children():
    """The /proc children walk finds what psutil's full scan finds: a child and its grandchild."""
    import os
    import subprocess
    import sys
    import time

    import psutil

    from distlab.launch import watch

    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while len(psutil.Process(child.pid).children()) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watch._children_from_proc(os.getpid()) is not None  # Linux: the /proc way is the one used
        grandchild = psutil.Process(child.pid).children()[0].pid
        assert {child.pid, grandchild} <= {p.pid for p in watch.descendants()}
        assert [p.pid for p in watch.descendants(child.pid)] == [grandchild]
    finally:
        for p in psutil.Process(child.pid).children(recursive=True) + [psutil.Process(child.pid)]:
            p.kill()
        child.wait()


def test_the_environment_search_skips_the_forkserver_and_what_it_forked_but_not_their_children(monkeypatch):
    import os

    import psutil

    from distlab.launch import watch

    me = os.getpid()
    tree = [(101, me), (102, 101), (103, 101), (104, 103), (105, me)]  # 101: the server; 102, 103: its forks
    monkeypatch.setattr(watch, "_tree_from_proc", lambda pid: tree if pid == me else None)
    monkeypatch.setattr(psutil, "Process", lambda pid: pid)
    assert watch._environ_candidates(101) == [104, 105]  # a rank's own child, a process of the kernel
    assert watch._environ_candidates(None) == [101, 102, 103, 104, 105]  # no server: everything below the kernel


def test_a_warning_signal_held_at_start_reaches_the_handler_installed_later():
    """Issue #51: Slurm's warning (SIGUSR1) that reaches a rank still importing torch killed it (exit 138).
    distlab's Slurm wrapper starts ranks with it blocked; the runtime delivers it once the job's handler is
    installed. The child here gets the signal long before its handler exists."""
    import signal
    import subprocess
    import sys
    import textwrap

    child = textwrap.dedent("""
        import os, signal, sys, time
        from distlab import worker
        held = worker.held_warning_signals()
        worker.release_on_handler(held)
        print("held", *sorted(int(s) for s in held), flush=True)
        sys.stdin.readline()          # the warning arrives meanwhile ("still importing torch")
        got = []
        signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
        time.sleep(0.2)
        print("handled", got == [signal.SIGUSR1], "now", signal.signal is signal.__dict__["signal"], flush=True)
        """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1]))
    try:
        assert proc.stdout.readline().split() == ["held", str(int(signal.SIGUSR1))]
        proc.send_signal(signal.SIGUSR1)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().split() == ["handled", "True", "now", "True"]
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()


def test_held_warning_signals_are_held_again_at_exit_and_none_held_registers_nothing():
    """Python resets a handled signal to its default action at exit: a Slurm warning then killed a rank that had
    finished (exit 138). The runtime blocks the held ones again first, at ``atexit``."""
    import signal

    from distlab import worker

    calls = []
    worker.hold_again_at_exit({signal.SIGUSR2, signal.SIGUSR1}, register=lambda *a: calls.append(a))
    assert calls == [(signal.pthread_sigmask, signal.SIG_BLOCK, [signal.SIGUSR1, signal.SIGUSR2])]
    worker.hold_again_at_exit(set(), register=lambda *a: calls.append(a))
    assert len(calls) == 1


def test_without_a_held_signal_the_runtime_changes_nothing():
    import signal

    from distlab import worker

    before = signal.signal
    worker.release_on_handler(set())
    assert signal.signal is before
