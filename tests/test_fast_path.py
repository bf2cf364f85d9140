"""The launch's fast path (#28): the agent woken by its ranks, destroyed gloo groups kept until
the rank exits, the kernel's logger levels set in one go. Pure rules first, then real runs."""
import os
import threading
from types import SimpleNamespace

import pytest
from fake_kernel import run_cells

import distlab
from distlab.forkserver import agent_wait
from distlab.rendezvous import retired_groups


class _Queue:
    def __init__(self, reader):
        self._reader = reader


def _pcontext(sentinels=(), readers=(), read=()):
    return SimpleNamespace(_pc=SimpleNamespace(sentinels={s: i for i, s in enumerate(sentinels)}),
                           _ret_vals={i: _Queue(r) for i, r in enumerate(readers)},
                           _return_values={i: None for i in read})


def test_the_agent_watches_unjoined_ranks_and_unread_return_values():
    assert agent_wait.watched(_pcontext(sentinels=[10, 11], readers=[20, 21])) == [10, 11, 20, 21]
    assert agent_wait.watched(_pcontext(sentinels=[11], readers=[20, 21], read=[0])) == [11, 21]


def test_a_process_context_it_does_not_know_is_watched_by_the_clock():
    assert agent_wait.watched(SimpleNamespace()) == []
    assert agent_wait.watched(SimpleNamespace(_pc=None, _ret_vals={}, _return_values={})) == []
    assert agent_wait.watched(_pcontext(sentinels=[3], readers=[None])) == []
    assert agent_wait.wait_for_change(SimpleNamespace()) == frozenset()


def test_the_agent_wakes_when_a_rank_writes_its_return_value(monkeypatch):
    monkeypatch.setattr(agent_wait, "MAX_WAIT_S", 30)
    r, w = os.pipe()
    quiet_r, quiet_w = os.pipe()
    try:
        timer = threading.Timer(0.05, os.write, (w, b"x"))
        timer.start()
        ready = agent_wait.wait_for_change(_pcontext(sentinels=[quiet_r], readers=[r]))
        timer.join()
        assert ready == frozenset({id(r)})
        monkeypatch.setattr(agent_wait, "MAX_WAIT_S", 0.01)
        assert agent_wait.wait_for_change(_pcontext(sentinels=[quiet_r], readers=[])) == frozenset()
    finally:
        for fd in (r, w, quiet_r, quiet_w):
            os.close(fd)


def test_a_ready_object_nobody_consumed_does_not_make_the_agent_spin(monkeypatch):
    slept = []
    monkeypatch.setattr(agent_wait.time, "sleep", slept.append)
    r, w = os.pipe()
    try:
        os.write(w, b"x")
        first = agent_wait.wait_for_change(_pcontext(sentinels=[r]))
        assert slept == []
        assert agent_wait.wait_for_change(_pcontext(sentinels=[r]), first) == first
        assert slept == [agent_wait.FALLBACK_S]
    finally:
        os.close(r), os.close(w)


def test_kept_groups_are_bounded():
    saved = list(retired_groups._KEPT)
    try:
        retired_groups._KEPT.clear()
        retired_groups.keep(list(range(retired_groups.KEEP - 1)))
        retired_groups.keep(["a", "b", "c"])
        assert len(retired_groups._KEPT) == retired_groups.KEEP
        assert retired_groups._KEPT[-3:] == ["a", "b", "c"] and retired_groups._KEPT[0] == 2
    finally:
        retired_groups._KEPT[:] = saved


def test_destroy_still_destroys_and_keeps_only_gloo_groups(monkeypatch):
    """In this process: a one-rank gloo group, destroyed through the wrapper."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    monkeypatch.setattr(c10d, "destroy_process_group", c10d.destroy_process_group)
    monkeypatch.setattr(dist, "destroy_process_group", dist.destroy_process_group)
    monkeypatch.setattr(retired_groups, "_KEPT", [])
    retired_groups.install()
    retired_groups.install()  # a second install does not wrap twice
    assert dist.destroy_process_group.__wrapped__.__name__ == "destroy_process_group"
    assert not hasattr(dist.destroy_process_group.__wrapped__, "__wrapped__")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    world = dist.group.WORLD
    dist.destroy_process_group()
    assert not dist.is_initialized()
    assert retired_groups._KEPT == [world]
    assert retired_groups._gloo_groups(SimpleNamespace()) == []  # not a group torch knows


@pytest.mark.slow
@pytest.mark.usefixtures("start_mode")
def test_a_rank_can_destroy_and_make_groups_again_and_keeps_what_it_destroyed():
    ns = run_cells("""
    import torch
    import torch.distributed as dist
    def twice(rank, world):
        from distlab.rendezvous import retired_groups
        sums = []
        for _ in range(2):
            dist.init_process_group("gloo", rank=rank, world_size=world)
            t = torch.ones(1)
            dist.all_reduce(t)
            sums.append(t.item())
            dist.destroy_process_group()
        return sums, dist.is_initialized(), len(retired_groups._KEPT)
    """)
    run = distlab.spawn(ns["twice"], args=(2,), nprocs=2, view=None)
    assert run.returns == {0: ([2.0, 2.0], False, 2), 1: ([2.0, 2.0], False, 2)}


@pytest.mark.slow
def test_the_agent_of_a_forked_run_looks_at_its_ranks_when_they_change(monkeypatch):
    """A run of 0.4 s: the agent waits on its ranks, so it looks a handful of times (about one per
    rank event, and one per MAX_WAIT_S); polled at its 0.1 ms interval it would look hundreds of
    times. The bound leaves room for a slow, loaded machine."""
    looks = []
    wait = agent_wait.wait_for_change
    monkeypatch.setattr(agent_wait, "wait_for_change", lambda *a: looks.append(1) or wait(*a))
    ns = run_cells("""
    import time
    def nap(rank):
        time.sleep(0.4)
        return rank
    """)
    run = distlab.spawn(ns["nap"], nprocs=2, view=None, start="forkserver")
    assert run.returns == {0: 0, 1: 1}
    assert 1 <= len(looks) <= 60, len(looks)


def test_quieting_torchelastic_sets_and_restores_every_level_at_once():
    import logging

    import torch.distributed.elastic.agent.server.api  # noqa: F401  (torchelastic sets its level at import)

    from distlab.launch import engine

    name = "torch.distributed.elastic.agent.server.api"
    logging.getLogger(name).setLevel(logging.INFO)
    logging.getLogger(name).isEnabledFor(logging.INFO)  # fills the logger's cache
    with engine.quiet_torchelastic():
        assert not logging.getLogger(name).isEnabledFor(logging.ERROR)  # the cache was flushed
    assert logging.getLogger(name).level == logging.INFO
    assert logging.getLogger(name).isEnabledFor(logging.INFO)
    logging.getLogger(name).setLevel(logging.NOTSET)


def _prompt_file_store(tmp_path, seconds: float):
    from datetime import timedelta

    import torch.distributed as dist

    from distlab.rendezvous.prompt_store import prompt_store

    inner = dist.FileStore(str(tmp_path / "store"), 1)
    inner.set_timeout(timedelta(seconds=seconds))
    return prompt_store(inner), inner


def test_the_prompt_store_is_the_file_store_underneath(tmp_path):
    store, inner = _prompt_file_store(tmp_path, 5)
    store.set("a", b"1")
    assert inner.get("a") == b"1" and store.get("a") == b"1"
    assert store.add("n", 2) == 2 and inner.add("n", 1) == 3
    assert store.check(["a", "n"]) and not store.check(["missing"])
    assert store.compare_set("a", b"1", b"2") == b"2" and inner.get("a") == b"2"
    assert store.num_keys() == inner.num_keys()
    assert store.delete_key("a") and not inner.check(["a"])
    assert store.timeout == inner.timeout


def test_the_prompt_store_returns_a_key_written_later_by_someone_else(tmp_path):
    store, inner = _prompt_file_store(tmp_path, 30)
    timer = threading.Timer(0.05, inner.set, ("late", b"here"))
    timer.start()
    assert store.get("late") == b"here"
    timer.join()
    threading.Timer(0.05, inner.set, ("later", b"x")).start()
    store.wait(["late", "later"])
    assert inner.get("later") == b"x"


def test_a_key_that_never_comes_gives_torchs_own_timeout_error(tmp_path):
    store, _ = _prompt_file_store(tmp_path, 0.3)
    with pytest.raises(RuntimeError, match="Timeout waiting for key: never after 300 ms"):
        store.get("never")


@pytest.mark.slow
def test_cpu_ranks_meet_in_the_prompt_store_even_when_they_arrive_far_apart():
    ns = run_cells("""
    import os
    import sys
    import time
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    def late(rank, world):
        rdzv = sys.modules["torch.distributed.rendezvous"]  # what init_process_group asks for its store
        store = rdzv._create_c10d_store("127.0.0.1", int(os.environ["MASTER_PORT"]), rank, world,
                                        timedelta(seconds=60))
        time.sleep(0.3 * rank)
        dist.init_process_group("gloo", rank=rank, world_size=world)
        t = torch.ones(1)
        dist.all_reduce(t)
        dist.destroy_process_group()
        return type(store).__name__, t.item()
    """)
    run = distlab.spawn(ns["late"], args=(2,), nprocs=2, view=None, start="forkserver")
    assert run.returns == {0: ("PromptStore", 2.0), 1: ("PromptStore", 2.0)}


@pytest.mark.slow
def test_fresh_interpreters_end_cleanly_with_groups_left_up_or_destroyed():
    """A fresh interpreter tears its gloo groups (and their Python store) down at exit while it is
    whole: left to finalization, the run aborted with SIGABRT about one time in two."""
    ns = run_cells("""
    import torch
    import torch.distributed as dist
    def up(rank, world, destroy):
        dist.init_process_group("gloo", rank=rank, world_size=world)
        t = torch.ones(1)
        dist.all_reduce(t)
        if destroy:
            dist.destroy_process_group()
        return t.item()
    """)
    for destroy in (False, True, False, True, False, True):
        run = distlab.spawn(ns["up"], args=(2, destroy), nprocs=2, view=None, start="spawn")
        assert run.returns == {0: 2.0, 1: 2.0}


def test_a_cpu_build_of_torch_is_seen_as_one_without_accelerators():
    """The CPU wheel (this suite's) takes the fast paths: CPU-only reseeding and the PromptStore."""
    import torch

    from distlab import worker
    from distlab.forkserver import child
    cpu_wheel = torch.version.cuda is None and torch.version.hip is None and not torch.backends.mps.is_built()
    assert child.accelerator_built() is not cpu_wheel
    assert worker._cuda_built() is (torch.version.cuda is not None or torch.version.hip is not None)


@pytest.mark.slow
@pytest.mark.usefixtures("start_mode")
def test_groups_made_after_init_use_the_store_torch_kept():
    """torch keeps the ranks' store only in C++: the Python store behind it must live on (it was
    collected after init_process_group, and every new_group then failed)."""
    ns = run_cells("""
    import gc
    import torch
    import torch.distributed as dist
    def later_groups(rank, world):
        dist.init_process_group("gloo", rank=rank, world_size=world)
        gc.collect()
        sums = []
        for _ in range(2):
            group = dist.new_group(backend="gloo")
            t = torch.ones(1)
            dist.all_reduce(t, group=group)
            sums.append(t.item())
        dist.barrier()
        dist.destroy_process_group()
        return sums
    """)
    run = distlab.spawn(ns["later_groups"], args=(2,), nprocs=2, view=None)
    assert run.returns == {0: [2.0, 2.0], 1: [2.0, 2.0]}


def test_torchelastic_events_are_serialised_only_for_a_logger_that_listens():
    import logging

    from torch.distributed.elastic import events

    from distlab.launch import engine

    class Event:
        made = 0

        def serialize(self):
            Event.made += 1
            return "event"

    with engine.quiet_torchelastic():
        events.record(Event())
        assert Event.made == 0  # the quiet logger drops it: nothing was serialised
    logger = events._get_or_create_logger("null")
    saved = logger.level
    try:
        logger.setLevel(logging.INFO)
        events.record(Event())
        assert Event.made == 1
    finally:
        logger.setLevel(saved)
    from torch.distributed.elastic.agent.server import api as agent_api

    assert agent_api.record is events.record


FRESH_MODULE = """
import os, sys
import distlab
sys.path.insert(0, {tests!r})
from fake_kernel import run_cells
cells = run_cells('''
def use(rank):
    import fresh_module
    return fresh_module.VALUE
def nothing(rank):
    return rank
''')
distlab.spawn(cells["nothing"], nprocs=1, view=None, start="forkserver")  # the server runs
os.mkdir({folder!r})  # on PYTHONPATH, missing when the server started: it remembered "no such folder"
with open(os.path.join({folder!r}, "fresh_module.py"), "w") as f:
    f.write("VALUE = 42\\n")
print("RESULT", distlab.spawn(cells["use"], nprocs=2, view=None, start="forkserver").returns, flush=True)
"""


@pytest.mark.slow
def test_a_module_written_after_the_server_started_is_found_by_its_ranks(tmp_path):
    """The server's import caches are invalidated before each fork: a folder on PYTHONPATH that did
    not exist when the server started (a user site-packages a later pip install --user makes) is
    cached there as absent, and a rank would inherit that."""
    import subprocess
    import sys
    from pathlib import Path

    folder = tmp_path / "later"
    script = FRESH_MODULE.format(folder=str(folder), tests=str(Path(__file__).parent))
    pythonpath = os.pathsep.join(p for p in [str(folder), os.environ.get("PYTHONPATH", "")] if p)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "DISTLAB_RUNS": str(tmp_path / "runs"), "PYTHONPATH": pythonpath})
    assert "RESULT {0: 42, 1: 42}" in out.stdout, out.stdout[-2000:] + out.stderr[-3000:]


def test_torchelastic_asks_for_the_host_name_once_per_kernel(monkeypatch):
    from torch.distributed.elastic.agent.server import api as agent_api

    from distlab.launch import engine

    engine._events_ask_first()
    asked = []
    monkeypatch.setattr(agent_api.socket, "getfqdn", lambda *a: asked.append(1) or "host.example")
    agent_api._get_fq_hostname.cache_clear()
    assert agent_api._get_fq_hostname() == agent_api._get_fq_hostname() == "host.example"
    assert len(asked) == 1


def test_setting_levels_empties_only_the_caches_of_the_loggers_it_sets():
    import logging

    from distlab.launch import engine

    quiet, other = logging.getLogger("distlab-test.quiet"), logging.getLogger("distlab-test.other")
    quiet.setLevel(logging.WARNING)
    assert quiet.isEnabledFor(logging.WARNING) and other.isEnabledFor(logging.WARNING)
    engine._set_levels({"distlab-test.quiet": logging.CRITICAL})
    assert not quiet.isEnabledFor(logging.WARNING)  # its cached answer was dropped
    assert other._cache  # another logger's cache was left alone
    engine._set_levels({"distlab-test.quiet": logging.WARNING})
    assert quiet.isEnabledFor(logging.WARNING)
