"""Fault handling that needs no worker processes: the watcher, join/cancel, logging levels,
torch's private function wrapper, the rendezvous handler, the torch feature check."""
import logging
import os
import signal
import stat
import subprocess
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import psutil
import pytest

from distlab import api, worker
from distlab.errors import DistlabError, RunCancelledError
from distlab.folders.runfolder import RunFolder
from distlab.launch import compat, engine
from distlab.launch.watch import Watcher
from distlab.view.display import TextView


class RaisingView(TextView):
    def __init__(self):
        super().__init__(1)
        self.calls = 0

    def line(self, rank, text):
        self.calls += 1
        raise RuntimeError("the view broke")


def make_folder(tmp_path):
    for sub in ("logs/attempt0", "ready", "stacks", "metrics"):
        (tmp_path / sub).mkdir(parents=True)
    return tmp_path


def test_a_view_that_raises_does_not_stop_the_watcher_or_the_timeout(tmp_path, capsys):
    folder = make_folder(tmp_path)
    (folder / "logs/attempt0/rank0.out").write_text("a line for the view\n")
    view = RaisingView()
    watcher = Watcher(folder, "no-such-run", 1, view, timeout=0.5)
    watcher.start()
    deadline = time.monotonic() + 20
    while not watcher.timed_out and time.monotonic() < deadline:
        time.sleep(0.05)
    watcher.finish()
    assert watcher.timed_out, "the timeout never fired"
    assert view.calls == 1  # switched off after its first error, not called again and again
    assert "the live view failed (RuntimeError: the view broke)" in capsys.readouterr().err


def test_a_view_whose_close_raises_does_not_break_finish(tmp_path):
    class BadClose(TextView):
        def close(self):
            raise RuntimeError("close broke")

    watcher = Watcher(make_folder(tmp_path), "rid", 1, BadClose(1), timeout=None)
    watcher.start()
    watcher.finish()
    watcher.finish()  # idempotent


def test_stack_dumps_signal_only_verified_workers_not_pids_from_files(tmp_path):
    folder = make_folder(tmp_path)
    bystander = subprocess.Popen(["sleep", "60"])  # a process a stale or planted ready file could name
    try:
        (folder / "ready" / "rank0").write_text(str(bystander.pid))
        stacks = Watcher(folder, "rid", 1, TextView(1), timeout=1).dump_stacks()
        time.sleep(0.2)
        assert bystander.poll() is None, "SIGUSR1 killed a process that is not a worker of this run"
        assert stacks == {0: "(not started yet: still importing, or already exited)"}
    finally:
        bystander.kill()
        bystander.wait()


def test_overlapping_runs_restore_torchelastic_logging_levels(monkeypatch):
    names = engine.quiet_torchelastic.names
    for n in names:
        monkeypatch.setattr(logging.getLogger(n), "level", logging.INFO)
    a, b = engine.quiet_torchelastic(), engine.quiet_torchelastic()
    a.__enter__()
    b.__enter__()
    assert all(logging.getLogger(n).level == logging.CRITICAL for n in names)
    a.__exit__(None, None, None)  # the first run ends while the second still runs
    assert all(logging.getLogger(n).level == logging.CRITICAL for n in names)
    b.__exit__(None, None, None)
    assert [logging.getLogger(n).level for n in names] == [logging.INFO] * len(names)


def fake_plan(tmp_path):
    return SimpleNamespace(run_dir=tmp_path, run_id="fake", cancel=threading.Event())


def test_pending_run_stays_joinable_after_a_ctrl_c_in_join(tmp_path, monkeypatch):
    def slow_execute(plan, view):
        time.sleep(1.5)
        return "the result"

    monkeypatch.setattr(api.engine, "execute", slow_execute)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        run = api.PendingRun(fake_plan(tmp_path), view=None)
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt, match="still running. Call join"):
            run.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert run.join(timeout=30) == "the result"


def test_join_with_a_timeout_says_the_run_still_runs_then_raises_the_runs_own_error(tmp_path, monkeypatch):
    release = threading.Event()

    def execute_then_fail(plan, view):
        release.wait(30)
        raise RuntimeError("rank 1 failed")

    monkeypatch.setattr(api.engine, "execute", execute_then_fail)
    run = api.PendingRun(fake_plan(tmp_path), view=None)
    with pytest.raises(TimeoutError, match=f"run {tmp_path} still running after 0.2s"):
        run.join(timeout=0.2)
    release.set()
    for _ in range(2):  # the error is kept: every later join raises it again
        with pytest.raises(RuntimeError, match="rank 1 failed"):
            run.join(timeout=30)


def test_cancel_asks_the_run_to_stop_and_waits_for_it(tmp_path, monkeypatch):
    def execute_until_cancelled(plan, view):
        plan.cancel.wait(30)
        raise RunCancelledError("cancelled")

    monkeypatch.setattr(api.engine, "execute", execute_until_cancelled)
    run = api.PendingRun(fake_plan(tmp_path), view=None)
    assert not run.done()
    assert run.cancel(timeout=10) is True and run.done()
    with pytest.raises(RunCancelledError, match="cancelled"):
        run.join()


def test_store_wrapper_forwards_arguments_it_does_not_know(monkeypatch):
    """A port the user chose: rank 1 joins rank 0's store through torch's own function, with every
    argument passed on (after checking that the port's listener is this user's)."""
    import sys

    import torch.distributed  # noqa: F401

    rdzv = sys.modules["torch.distributed.rendezvous"]  # the attribute of that name is a function
    seen = []
    monkeypatch.setattr(rdzv, "_create_c10d_store", lambda *a, **k: seen.append((a, k)) or "store")
    monkeypatch.setattr(worker, "_check_listener_is_ours", lambda port, rank: seen.append(("checked", port, rank)))
    worker._private_rendezvous(RunFolder("/nonexistent"), distlab_port=1)
    assert rdzv._create_c10d_store("h", 4000, 1, 2, 30, use_libuv=False, future_option=7) == "store"
    assert seen == [("checked", 4000, 1), (("127.0.0.1", 4000, 1, 2, 30), {"use_libuv": False, "future_option": 7})]


def test_distlabs_own_rendezvous_is_a_private_file_store_per_attempt_and_call(tmp_path, monkeypatch):
    import sys
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    folder = RunFolder.create("demo", root=tmp_path / "runs")
    rdzv = sys.modules["torch.distributed.rendezvous"]
    monkeypatch.setattr(rdzv, "_create_c10d_store", lambda *a, **k: pytest.fail("no TCP store for distlab's port"))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    worker._private_rendezvous(folder, distlab_port=1)
    first = rdzv._create_c10d_store("127.0.0.1", 1, 0, 1, timedelta(seconds=5))
    second = rdzv._create_c10d_store("127.0.0.1", 1, 0, 1, timedelta(seconds=5))
    if not torch.backends.cuda.is_built():  # a torch without CUDA: inside distlab's PromptStore (prompt_store.py)
        assert type(first).__name__ == type(second).__name__ == "PromptStore"
        first, second = first.inner, second.inner
    assert isinstance(first, dist.FileStore) and isinstance(second, dist.FileStore)
    first.set("k", "v")
    assert first.check(["k"]) and not second.check(["k"])  # a re-initialised group starts from an empty store
    files = sorted(p.name for p in (folder.path / "stores").iterdir())
    assert files == ["attempt2-0", "attempt2-1"]
    assert all(stat.S_IMODE((folder.path / "stores" / f).stat().st_mode) == 0o600 for f in files)
    assert "TORCHELASTIC_USE_AGENT_STORE" not in os.environ


def test_a_port_another_user_listens_on_is_refused_before_joining(monkeypatch):
    from distlab.errors import RendezvousError
    from distlab.rendezvous import loopback as rendezvous

    monkeypatch.setattr(rendezvous, "listener_uid", lambda port: os.geteuid() + 1)
    with pytest.raises(RendezvousError, match=r"rank 1 will not join the store on 127.0.0.1:4000: another user "
                                              rf"\(uid {os.geteuid() + 1}\) listens on that port"):
        worker._check_listener_is_ours(4000, 1)
    monkeypatch.setattr(rendezvous, "listener_uid", lambda port: os.geteuid())
    monkeypatch.setattr(rendezvous, "connected_uid", lambda port: os.geteuid())
    worker._check_listener_is_ours(4000, 1)  # yours: fine


def test_the_listener_uid_is_read_from_proc_net_tcp():
    from distlab.rendezvous.loopback import listening_uid

    rows = ["   0: 0100007F:0FA0 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 1 1 0",
            "   1: 0100007F:0FA1 0100007F:0FA0 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0"]
    assert listening_uid(rows, 4000) == 1001
    assert listening_uid(rows, 4001) is None  # an established connection, not a listener


def test_the_agents_rendezvous_is_in_process_with_a_fresh_store_each_attempt():
    from torch.distributed import HashStore
    from torch.distributed.elastic.rendezvous import RendezvousHandler
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

    from distlab.rendezvous import loopback as rendezvous

    before = {c.laddr for c in psutil.Process().net_connections("inet") if c.status == psutil.CONN_LISTEN}
    handler = rendezvous.create_handler(SimpleNamespace(run_id="unit-test-run"))
    try:
        assert isinstance(handler, RendezvousHandler) and not isinstance(handler, StaticTCPRendezvous)
        for _attempt in range(2):
            info = handler.next_rendezvous()
            assert info.bootstrap_store_info.master_port == rendezvous.PLACEHOLDER_PORT
            assert isinstance(info.store.underlying_store, HashStore)
            assert info.store.num_keys() == 0  # nothing of the previous attempt
            info.store.set("k", "v")
            assert info.store.get("k") == b"v"
            del info
        after = {c.laddr for c in psutil.Process().net_connections("inet") if c.status == psutil.CONN_LISTEN}
        assert after == before  # no socket was opened
    finally:
        rendezvous.close_handler("unit-test-run")
    assert "unit-test-run" not in rendezvous.HANDLERS


def test_loopback_store_on_a_fixed_port_listens_on_loopback_only():
    from distlab.rendezvous.loopback import bind_loopback, loopback_store

    with bind_loopback() as probe:
        port = probe.getsockname()[1]
    store = loopback_store(port, 1, timedelta(seconds=10), wait_for_workers=False)
    mine = [c.laddr for c in psutil.Process().net_connections("inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    assert [a.ip for a in mine] == ["127.0.0.1"]
    del store


def test_a_torch_without_a_needed_feature_is_a_clear_error_before_any_process(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTLAB_RUNS", str(tmp_path))
    monkeypatch.setattr(compat, "_checked", False)
    monkeypatch.setattr(compat, "launch_config_fields", lambda: {"logs_specs"})
    with pytest.raises(DistlabError, match=r"lacks what distlab's launcher uses: LaunchConfig.signals_to_handle\. "
                                           r"Install torch>=2\.9"):
        api.spawn(print_rank, nprocs=1, view=None)
    assert list(tmp_path.iterdir()) == []


def print_rank(rank):
    print(rank)


def test_this_torch_has_every_feature_distlab_needs():
    compat.check_torch()
    assert compat.missing_features(set(), "", {"m": {"X"}}) == [
        "LaunchConfig.logs_specs", "LaunchConfig.signals_to_handle", "TCPStore(master_listen_fd=...)", "m.X"]


def test_pyproject_floor_matches_the_checked_floor():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert f'"torch>={compat.TORCH_FLOOR}"' in text


def test_cleanup_runs_every_step_even_when_one_fails_and_can_run_again(monkeypatch):
    from distlab.launch import watch
    from distlab.rendezvous import loopback as rendezvous

    done = []

    def broken_finish():
        done.append("finish")
        raise RuntimeError("finish broke")

    class Handler:
        def shutdown(self):
            done.append("store")

    monkeypatch.setattr(watch, "stop_workers", lambda run_id: done.append(f"workers of {run_id}"))
    monkeypatch.setitem(rendezvous.HANDLERS, "rid", Handler())
    watcher = SimpleNamespace(finish=broken_finish, stop_agent=lambda: done.append("agent"))
    plan = SimpleNamespace(elastic_run_id="rid", run_id="rid")
    with pytest.raises(RuntimeError, match="finish broke"):
        engine.cleanup(plan, watcher)
    assert done == ["finish", "agent", "workers of rid", "store"]
    with pytest.raises(RuntimeError):
        engine.cleanup(plan, watcher)  # again: the store is already gone, nothing else breaks
    assert done[4:] == ["finish", "agent", "workers of rid"]


def test_ctrl_c_during_cleanup_is_held_back_and_the_kernel_handler_returns_after(monkeypatch):
    kernel_handler = signal.default_int_handler
    previous = signal.signal(signal.SIGINT, kernel_handler)
    try:
        signals = engine.KernelSignals()
        signal.signal(signal.SIGINT, lambda *a: None)  # torchelastic's handler while its agent runs
        signals.defer()
        os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C during cleanup: no KeyboardInterrupt here
        time.sleep(0.1)
        assert signal.getsignal(signal.SIGINT) is not kernel_handler
        assert signals.restore() is True  # ...it is reported once cleanup is over
        assert signal.getsignal(signal.SIGINT) is kernel_handler
    finally:
        signal.signal(signal.SIGINT, previous)
