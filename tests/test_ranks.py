"""Warm ranks with real processes: exec, run, subsets, output, failures, timeouts, interrupts, close."""
import os
import signal
import stat
import subprocess
import sys
import threading
import time

import psutil
import pytest
from fake_kernel import as_main, run_cells
from procs import running

import distlab
from distlab.warm import errors as err
from distlab.warm import group as rank_group
from distlab.warm.proto import RankValues, Shown

pytestmark = pytest.mark.slow
ALL_REDUCE = "t = torch.ones(1); dist.all_reduce(t); t.item()"


@pytest.fixture(scope="module")
def ranks():
    with distlab.Ranks(2) as r:
        yield r


def alive(pids):
    return [p for p in pids if running(p)]


def gone_soon(pids, seconds=5.0):
    deadline = time.time() + seconds
    while alive(pids) and time.time() < deadline:
        time.sleep(0.05)
    return alive(pids) == []


def test_exec_keeps_each_ranks_state_and_returns_its_last_expression(ranks):
    assert ranks.exec("x = rank * 10") == {0: None, 1: None}
    values = ranks.exec("x + 1")
    assert isinstance(values, RankValues) and values == {0: 1, 1: 11}
    assert ranks.exec(ALL_REDUCE) == {0: 2.0, 1: 2.0}
    assert ranks.exec("world_size, dist.get_world_size(), str(device)") == {0: (2, 2, "cpu"), 1: (2, 2, "cpu")}


def test_each_rank_prints_into_the_call_with_its_prefix(ranks, capsys):
    ranks.exec("import sys\nprint('hello from', rank)\nprint('careful', file=sys.stderr)\nprint('no newline', end='')")
    out, errs = capsys.readouterr()
    assert sorted(out.splitlines()) == ["[rank0] hello from 0", "[rank0] no newline",
                                        "[rank1] hello from 1", "[rank1] no newline"]
    assert sorted(errs.splitlines()) == ["[rank0] careful", "[rank1] careful"]


def test_a_subset_of_ranks_runs_alone(ranks):
    assert ranks.exec("only = 'here'", ranks=[1]) == {1: None}
    assert ranks.exec("'only' in globals()") == {0: False, 1: True}
    assert ranks.exec("rank", ranks=0) == {0: 0}


def test_push_gives_every_rank_the_same_value_and_scatter_one_value_each(ranks):
    import torch

    t = torch.arange(3.0)
    assert ranks.push(t=t, lr=0.5) is None
    t.add_(100)  # each rank holds its own copy, taken when push was called
    assert ranks.exec("t.tolist(), lr") == {0: ([0.0, 1.0, 2.0], 0.5), 1: ([0.0, 1.0, 2.0], 0.5)}
    ranks.scatter(piece=[torch.ones(2), torch.zeros(2)], tag={0: "a", 1: "b"})
    assert ranks.exec("piece.tolist(), tag") == {0: ([1.0, 1.0], "a"), 1: ([0.0, 0.0], "b")}
    ranks.push({"ranks": "a name push's own option has"}, ranks=[1])
    assert ranks.exec("globals().get('ranks')") == {0: None, 1: "a name push's own option has"}


def test_pull_and_gather_bring_each_ranks_value_back(ranks):
    ranks.exec("s = torch.full((2,), float(rank)); dist.all_reduce(s); mine = rank * 10")
    pulled = ranks.pull("s")
    assert isinstance(pulled, RankValues) and sorted(pulled) == [0, 1]
    assert all(v.tolist() == [1.0, 1.0] for v in pulled.values())
    assert ranks.pull("mine", "s", ranks=[1])[1][0] == 10
    assert ranks.gather("mine") == [0, 10]


def test_pull_of_a_missing_name_names_the_rank_and_keeps_the_ranks(ranks):
    ranks.exec("only_on_0 = 1", ranks=[0])
    with pytest.raises(err.RankError) as info:
        ranks.pull("only_on_0")
    assert (info.value.rank, info.value.name, info.value.usable) == (1, "NameError", True)
    assert "distlab: rank 1 raised NameError in ranks.pull('only_on_0')." in str(info.value)
    assert "name 'only_on_0' is not defined on this rank" in str(info.value)
    assert "proto.py" not in str(info.value)  # the rank's answer, not the learner's code: no frame of it
    assert ranks.exec(ALL_REDUCE) == {0: 2.0, 1: 2.0}


def test_bad_push_and_scatter_arguments_fail_before_anything_is_sent(ranks):
    ranks.push(guard=1)
    with pytest.raises(distlab.LaunchArgumentError, match="one value per selected rank: 2 values, not 3"):
        ranks.scatter(guard=[5, 6, 7])
    with pytest.raises(distlab.CaptureError, match="the value of 'bad'"):
        ranks.push(guard=2, bad=threading.Lock())
    with pytest.raises(distlab.LaunchArgumentError, match="predefined"):
        ranks.push(rank=3)
    assert ranks.pull("guard") == {0: 1, 1: 1}  # nothing of the refused calls arrived


def test_run_captures_helpers_classes_imports_and_values_like_spawn(ranks, monkeypatch):
    ns = run_cells(
        "import torch\nimport torch.distributed as dist\nSCALE = 3\nOFFSET = torch.tensor([0.5])\n",
        "class Box:\n    def __init__(self, v):\n        self.v = v\n",
        "def helper(t):\n    return t * SCALE + OFFSET\n",
        "def summed(box):\n    t = helper(torch.ones(1) * (dist.get_rank() + box.v))\n"
        "    dist.all_reduce(t)\n    return t.item(), type(box).__name__\n",
    )
    as_main(monkeypatch, ns)  # the kernel's __main__ is the notebook: its classes pickle by name
    # rank 0: (0+1)*3+0.5 = 3.5, rank 1: (1+1)*3+0.5 = 6.5 -> 10.0 on both
    assert ranks.run(ns["summed"], ns["Box"](1)) == {0: (10.0, "Box"), 1: (10.0, "Box")}
    assert ranks.exec("helper(torch.zeros(1)).item()") == {0: 0.5, 1: 0.5}  # defined on the ranks now


def test_a_rank_that_raises_names_itself_and_its_line_and_the_ranks_stay_usable(ranks):
    with pytest.raises(err.RankError) as info:
        ranks.exec("z = 1\nif rank == 1:\n    raise ValueError('bad input on ' + str(rank))\n")
    e = info.value
    assert (e.rank, e.name, e.usable) == (1, "ValueError", True)
    assert "distlab: rank 1 raised ValueError in ranks.exec.\n" in str(e)
    assert '", line 3, in <module>\n    raise ValueError' in str(e) and "ValueError: bad input on 1" in str(e)
    assert str(e).endswith(err.STATE_USABLE)
    assert ranks.exec("z") == {0: 1, 1: 1}
    assert ranks.exec(ALL_REDUCE) == {0: 2.0, 1: 2.0}


def test_run_traceback_points_into_the_cell_that_defined_the_function(ranks):
    ns = run_cells("import math\n\n\ndef broken(x):\n    y = x - 10\n    return math.sqrt(y)\n")
    with pytest.raises(err.RankError) as info:
        ranks.run(ns["broken"], 1)
    assert info.value.rank == 0 and "(rank 1 raised too)" in str(info.value)
    filename = ns["broken"].__code__.co_filename
    assert f'File "{filename}", line 6, in broken\n    return math.sqrt(y)' in str(info.value)


def test_syntax_errors_never_reach_the_ranks(ranks):
    with pytest.raises(SyntaxError) as info:
        ranks.exec("x = (\n")
    assert info.value.filename.startswith("<ranks.exec #")


def test_timeout_in_python_code_interrupts_it_and_keeps_every_variable(ranks):
    ranks.exec("w = 7")
    with pytest.raises(err.RanksTimeoutError) as info:
        ranks.exec("import time\nif rank == 0:\n    time.sleep(120)\n", timeout=5)
    e = info.value
    assert e.usable and e.stacks[1] == "(finished this call)"
    assert '", line 3 in <module>' in e.stacks[0] and "<ranks.exec #" in e.stacks[0]
    assert "did not finish within timeout=5.0s on rank 0." in str(e) and str(e).endswith(err.STATE_USABLE)
    assert ranks.exec("w") == {0: 7, 1: 7}


def test_an_interrupt_stops_the_call_with_stacks_and_keeps_the_ranks(ranks):
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))  # what Kernel > Interrupt sends
    timer.start()
    with pytest.raises(KeyboardInterrupt) as info:
        ranks.exec("import time\nq = 3\ntime.sleep(120)\n")
    assert "ranks.exec was interrupted on ranks 0, 1." in str(info.value)
    assert str(info.value).count('", line 3 in <module>') == 2 and str(info.value).endswith(err.STATE_USABLE)
    assert ranks.exec("q") == {0: 3, 1: 3}


def test_output_of_a_thread_that_outlives_its_call_stays_out_of_later_calls(ranks, capsys):
    ranks.exec("import threading, time\n"
               "th = threading.Thread(target=lambda: (time.sleep(0.5), print('late', rank)))\n"
               "th.start()\nprint('first')")
    ranks.exec("th.join()  # the late line is printed while this call runs\nprint('second')")
    out, _ = capsys.readouterr()
    assert sorted(out.splitlines()) == ["[rank0] first", "[rank0] second", "[rank1] first", "[rank1] second"]
    assert ranks.late_output[0] == "late 0\n" and ranks.late_output[1] == "late 1\n"


def test_a_thread_that_prints_during_its_own_call_shows_in_that_call(ranks, capsys):
    ranks.exec("import threading\nth = threading.Thread(target=lambda: print('from a thread', rank))\n"
               "th.start()\nth.join()")
    assert sorted(capsys.readouterr().out.splitlines()) == ["[rank0] from a thread 0", "[rank1] from a thread 1"]


def test_values_that_cannot_travel_come_back_as_their_repr(ranks):
    values = ranks.exec("class Local:\n    def __repr__(self):\n        return 'Local on ' + str(rank)\nLocal()")
    assert values == {0: Shown("Local on 0"), 1: Shown("Local on 1")}
    assert repr(ranks.exec("(lambda: 1)", ranks=[0])[0]).startswith("<only shown: <function <lambda> at")


def test_a_function_pulled_from_the_ranks_says_it_stays_there(ranks):
    """Issue #48: ``ranks.pull("f")`` gave a stand-in whose repr was the function's own, and calling it
    raised ``TypeError: 'Shown' object is not callable``."""
    ranks.exec("def on_rank():\n    return rank")
    pulled = ranks.pull("on_rank")[1]
    assert repr(pulled).startswith("<only shown: <function on_rank at") and "stays there" in repr(pulled)
    with pytest.raises(TypeError, match="cannot be called here. Call it on the ranks"):
        pulled()


def test_push_ships_a_notebook_function_as_run_and_spawn_do(ranks):
    """Issue #48: ``ranks.push(f=<notebook function>)`` was refused, while ``ranks.run`` sent the same function."""
    ns = run_cells("SCALE = 2\n", "def helper(x):\n    return x * SCALE\n",
                   "def doubled(x):\n    return helper(x) + rank\n")
    ranks.push(g=ns["doubled"], n=3)
    assert ranks.exec("g(n), doubled(n)") == {0: (6, 6), 1: (7, 7)}


def test_sockets_stay_on_loopback_and_ranks_are_never_forks_of_this_process(ranks):
    from distlab.forkserver import client as forkserver

    addresses = set()
    for pid in ranks.pids:
        proc = psutil.Process(pid)
        if ranks.start == "forkserver":  # forked from the server, never from the kernel
            assert proc.ppid() == forkserver.server_pid() != os.getpid()
        else:  # DISTLAB_START=spawn: fresh interpreters
            assert proc.cmdline()[1] == "-c" and proc.ppid() == os.getpid()
        for c in proc.net_connections(kind="inet"):
            addresses.add(c.laddr.ip.removeprefix("::ffff:"))  # gloo's IPv4-mapped IPv6 loopback
    assert addresses == {"127.0.0.1"}, addresses  # the group's store is a private file: gloo's sockets only


def test_calls_from_two_threads_do_not_overlap(ranks):
    done = {}
    worker = threading.Thread(target=lambda: done.update(v=ranks.exec("import time\ntime.sleep(2)\nrank")))
    worker.start()
    time.sleep(0.5)
    with pytest.raises(err.RanksBusyError, match="busy with another call"):
        ranks.exec("1")
    worker.join()
    assert done["v"] == {0: 0, 1: 1} and ranks.exec("1") == {0: 1, 1: 1}


def test_bad_call_arguments_fail_before_anything_is_sent(ranks):
    for kwargs, name in [({"ranks": [2]}, "ranks"), ({"ranks": [0, 0]}, "ranks"), ({"ranks": []}, "ranks"),
                         ({"timeout": 0}, "timeout")]:
        with pytest.raises(distlab.LaunchArgumentError) as info:
            ranks.exec("1", **kwargs)
        assert info.value.name == name
    with pytest.raises(distlab.LaunchArgumentError):
        ranks.exec(b"1")
    with pytest.raises(distlab.CaptureError):
        ranks.run(lambda: 1)


@pytest.fixture(scope="module")
def fragile():
    r = distlab.Ranks(2)
    yield r
    r.close()


def test_a_blocked_collective_times_out_with_stacks_and_the_ranks_restart(fragile):
    fragile.exec("v = 1")
    before = fragile.pids
    began = time.monotonic()
    with pytest.raises(err.RanksTimeoutError) as info:
        fragile.exec("if rank == 0:\n    dist.all_reduce(torch.ones(1))\n", timeout=5)
    took = time.monotonic() - began
    assert took <= 5 + 1.0 + fragile.start_s, f"rank 0, stuck for good, was waited for: {took:.2f} s"
    e = info.value
    assert not e.usable and e.stacks[1] == "(finished this call)"
    assert "in all_reduce" in e.stacks[0] and '", line 2 in <module>' in e.stacks[0]
    assert "so the ranks were restarted: every variable on them is lost" in str(e)
    assert fragile.state == "ready" and set(fragile.pids).isdisjoint(before) and gone_soon(before)
    assert fragile.exec("'v' in globals()") == {0: False, 1: False}
    assert fragile.exec(ALL_REDUCE) == {0: 2.0, 1: 2.0}


def test_a_failure_that_leaves_a_rank_blocked_restarts_the_ranks_and_says_what_to_rerun(fragile):
    """The likeliest mistake of chapter 4 (a typo on one rank while the other waits in recv) used to
    stop the ranks until ranks.restart(); a timeout restarted them. One rule now: restart, and list
    the calls that set the old ranks up."""
    fragile.exec("v = 1")
    fragile.push(w=2)
    before = fragile.pids
    with pytest.raises(err.RankError) as info:
        fragile.exec("if rank == 1:\n    raise RuntimeError('rank 1 gives up')\ndist.all_reduce(torch.ones(1))\n")
    e = info.value
    assert (e.rank, e.usable) == (1, False)
    assert "Ranks still running after that failure, and where they were:\n--- rank 0 ---" in str(e)
    assert "rank 0 stayed blocked after rank 1 failed" in str(e) and "so the ranks were restarted" in str(e)
    assert "re-run, in this order: ranks.exec, ranks.push(w)." in str(e)
    assert fragile.state == "ready" and set(fragile.pids).isdisjoint(before) and gone_soon(before)
    assert fragile.exec(ALL_REDUCE) == {0: 2.0, 1: 2.0}  # the fixed cell runs at once


def test_a_failure_that_broke_the_group_is_caught_by_the_health_check(fragile):
    with pytest.raises(err.RankError) as info:
        fragile.exec("if rank == 1:\n    dist.destroy_process_group()\n    raise RuntimeError('left the group')\n")
    assert (info.value.rank, info.value.usable) == (1, False)
    assert "(the health check, one all_reduce on every rank, failed)" in str(info.value)
    assert fragile.state == "ready"
    assert fragile.exec(ALL_REDUCE) == {0: 2.0, 1: 2.0}


def test_a_rank_that_dies_is_reported_with_its_exit_code(fragile):
    before = fragile.pids
    with pytest.raises(err.RankError) as info:
        fragile.exec("import os\nif rank == 1:\n    os._exit(3)\n")
    assert (info.value.rank, info.value.name) == (1, "died")
    assert "distlab: rank 1 died (exit code 3) in ranks.exec." in str(info.value)
    assert fragile.state == "ready" and gone_soon(before)


def test_close_and_the_end_of_a_with_block_leave_no_rank():
    with distlab.Ranks(2) as r:
        pids, folder = r.pids, r._group.folder  # stack dumps and C-level logs live here
        assert len(alive(pids)) == 2
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == os.getuid()
    assert gone_soon(pids) and r.state == "closed" and not folder.exists()
    r.close()  # twice is fine
    with pytest.raises(err.RanksStoppedError, match="these ranks are closed"):
        r.exec("1")


def test_a_rank_that_cannot_start_is_named_with_its_output_and_nothing_is_left(monkeypatch):
    started, real = [], rank_group.start_rank_process

    def second_rank_fails(cfg, conn, log, start):
        if cfg["rank"] != 1:
            proc = real(cfg, conn, log, start)
        else:
            with open(log, "wb") as out:
                proc = subprocess.Popen([sys.executable, "-c", "print('no torch here'); raise SystemExit(3)"],
                                        stdout=out, stderr=subprocess.STDOUT, pass_fds=[conn.fileno()])
        started.append(proc.pid)
        return proc

    monkeypatch.setattr(rank_group, "start_rank_process", second_rank_fails)
    with pytest.raises(err.RanksStartError) as info:
        distlab.Ranks(2)
    assert str(info.value) == ("distlab: rank 1 could not start (exited with code 3).\nno torch here\n"
                               "Nothing is left running.")
    assert len(started) == 2 and gone_soon(started)


def test_a_notebook_rank_never_replaces_each_ranks_own(ranks, monkeypatch):
    """The tutorials' code sets ``rank = 0`` in the notebook; shipped with a function, it made
    every rank rank 0 until a restart (and a following ``if rank == 0: send`` cell deadlocked)."""
    ns = run_cells("import torch\nrank = 0\nworld_size = 1\ndevice = torch.device('cpu')\n",
                   "def whoami():\n    return rank, world_size, str(device)\n")
    as_main(monkeypatch, ns)
    with pytest.warns(UserWarning, match=r"ranks.run\(whoami\): the notebook's rank, world_size, device stay"):
        assert ranks.run(ns["whoami"]) == {0: (0, 2, "cpu"), 1: (1, 2, "cpu")}
    assert ranks.exec("rank, world_size") == {0: (0, 2), 1: (1, 2)}  # later cells still see their own


def test_a_name_only_the_notebook_has_gets_a_hint_not_a_bare_name_error(ranks, monkeypatch):
    ns = run_cells("def only_here(r):\n    return r\n")
    as_main(monkeypatch, ns)
    with pytest.raises(distlab.RankError) as e:
        ranks.exec("only_here(rank)")
    assert "NameError: name 'only_here' is not defined" in str(e.value)
    assert "`only_here` is defined in this notebook, not on the ranks" in str(e.value)
    assert ranks.exec("rank") == {0: 0, 1: 1}  # still usable


def test_a_rank_waiting_in_recv_says_so_in_the_status_line_while_it_waits(ranks, monkeypatch):
    from distlab.warm import ranks as ranks_module
    from distlab.warm import status as rs

    lines = []
    shower = type("Shower", (), {"show": lambda self, b, i: lines.append(b["text/plain"]),
                                 "replace": lambda self, b, i: lines.append(b["text/plain"])})()
    monkeypatch.setattr(ranks_module, "live_status", lambda sel, lim: rs.LiveStatus(rs.CallStatus(sel, lim), shower))
    ranks._exec("import time\nt = torch.zeros(1)\nif rank == 0:\n    time.sleep(3)\n    dist.send(t, dst=1)\n"
                "elif rank == 1:\n    dist.recv(t, src=0)\n", "<waiting test>", "Cell In[99]", [0, 1], 30, live=True)
    assert any("rank 0 running · rank 1 waiting in recv for rank 0" in line for line in lines), lines


SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
REPLACING = """\
import json, time
from IPython.core.interactiveshell import InteractiveShell
from procs import running

shell = InteractiveShell.instance()
ns = shell.user_ns

def cell(source):
    result = shell.run_cell(source, store_history=True)
    assert result.success, result.error_in_exec or result.error_before_exec

def alive(pids, seconds=5.0):
    deadline = time.time() + seconds
    while [p for p in pids if running(p)] and time.time() < deadline:
        time.sleep(0.05)
    return [p for p in pids if running(p)]

cell("import distlab\\nranks = distlab.Ranks(2)")
cell("ranks")  # shown: IPython's Out, _ and _2 now hold it
first = ns["ranks"].pids
cell("ranks = distlab.Ranks(2)")
first_left = alive(first)
cell("ranks")
cell("kept = ranks")
second = ns["ranks"].pids
cell("ranks = distlab.Ranks(2)")  # the second group is still named `kept`: it stays
second_left = alive(second, seconds=0.5)
values = ns["ranks"].exec("rank")
cell("kept.close()\\nranks.close()")
print(json.dumps({"first_left": first_left, "second_left": second_left, "values": dict(values)}))
"""


def test_re_running_ranks_in_a_notebook_ends_the_group_it_replaced_although_out_holds_it(tmp_path):
    """#38 item 8: the old groups stayed up through IPython's Out (three re-runs of Ranks(4): 12 idle ranks)."""
    import json

    tests = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-c", REPLACING], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "DISTLAB_PRESTART": "0", "PYTHONPATH": os.pathsep.join([SRC, tests])})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["first_left"] == [], "the replaced ranks outlived the cell that replaced them"
    assert len(report["second_left"]) == 2, "ranks still held by a notebook variable (kept) were ended"
    assert report["values"] == {"0": 0, "1": 1}
