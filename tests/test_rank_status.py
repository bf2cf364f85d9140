"""A %%ranks cell's status line, and how the kernel knows at once that an interrupted rank is stuck.
No processes: a fake clock, a fake display, a fake ``torch.distributed`` and a thread standing
in for a rank's main thread blocked in C code."""
import signal
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from distlab.view.display import live_frontend
from distlab.warm import status as rs
from distlab.warm import watch as rank_watch
from distlab.warm.group import Conversation


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Shower:
    """What IPython's display would have shown: every (action, text, display id)."""

    def __init__(self):
        self.calls = []

    def show(self, bundle, display_id):
        self.calls.append(("show", bundle["text/plain"], display_id))

    def replace(self, bundle, display_id):
        self.calls.append(("replace", bundle["text/plain"], display_id))

    def texts(self):
        return [text for _, text, _ in self.calls]


def live(ranks=(0, 1), limit=2.0):
    clock, shower = Clock(), Shower()
    return rs.LiveStatus(rs.CallStatus(list(ranks), limit, clock), shower), clock, shower


def test_the_line_appears_at_once_with_the_ranks_and_the_limit():
    _, _, shower = live()
    assert shower.calls == [("show", "distlab: ranks 0, 1 · limit 2 s · 0.0 s · rank 0 running · rank 1 running",
                             shower.calls[0][2])]
    _, _, shower = live(ranks=[1], limit=None)
    assert shower.texts() == ["distlab: rank 1 · limit none · 0.0 s · rank 1 running"]


def test_the_clock_and_each_ranks_state_are_redrawn_in_place_at_most_every_refresh():
    status, clock, shower = live()
    clock.now += 0.1
    status.finished(1, "done")
    status.tick()
    assert len(shower.calls) == 1  # too soon: no redraw for every reply or every wait slice
    clock.now += rs.REFRESH_S
    status.tick()
    assert shower.calls[-1][:2] == ("replace", "distlab: ranks 0, 1 · limit 2 s · 0.3 s · rank 0 running · "
                                               "rank 1 done in 0.10 s")
    assert {call[2] for call in shower.calls} == {shower.calls[0][2]}  # one output, updated in place
    status.tick()
    assert len(shower.calls) == 2  # nothing changed, nothing sent


def test_after_the_limit_each_step_is_shown_at_once_and_the_end_stays():
    status, clock, shower = live()
    clock.now = 100.01
    status.finished(1, "done")
    clock.now = 102.0
    status.phase("limit reached: collecting where each rank is…")
    assert shower.texts()[-1] == ("distlab: ranks 0, 1 · limit 2 s · 2.0 s · limit reached: collecting where each "
                                  "rank is… · rank 0 running · rank 1 done in 0.01 s")
    status.blocked(0, "all_reduce")
    clock.now = 102.05
    status.phase("restarting the ranks…")
    clock.now = 102.1
    status.end("timed out")
    assert shower.texts()[-1] == ("distlab: ranks 0, 1 · limit 2 s · timed out at 2.10 s · rank 0 blocked in "
                                  "all_reduce · rank 1 done in 0.01 s")


def test_an_interrupted_rank_is_stopped_not_raised_and_a_success_empties_the_line():
    status, clock, shower = live()
    clock.now += 0.5
    status.finished(1, "error")
    status.phase("interrupted: collecting where each rank is…")
    status.finished(0, "error")
    status.end("interrupted")
    assert shower.texts()[-1].endswith("interrupted at 0.50 s · rank 0 stopped at 0.50 s · rank 1 raised at 0.50 s")
    status, clock, shower = live()
    status.end(None)
    assert shower.calls[-1][:2] == ("replace", "")  # the cell looks as it did before the status line existed


def test_only_a_kernel_of_a_jupyter_server_gets_the_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipykernel", SimpleNamespace())
    assert live_frontend({"JPY_SESSION_NAME": "nb.ipynb"})  # JupyterLab / Notebook
    assert not live_frontend({})  # nbclient (CI, the book build) keeps every state it is sent
    monkeypatch.delitem(sys.modules, "ipykernel")
    assert not live_frontend({"JPY_SESSION_NAME": "x"})  # a terminal prints every update


def test_colab_and_an_interactive_kaggle_session_are_watched_live():
    """Colab's server, like Notebook 6's, sets no JPY_SESSION_NAME: its kernel has imported
    google.colab. Kaggle says how its notebook runs: edited (Interactive) or saved (Batch, alone)."""
    kernel = {"ipykernel": SimpleNamespace()}
    assert live_frontend({}, {**kernel, "google.colab": SimpleNamespace()})
    assert live_frontend({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, kernel)
    assert not live_frontend({"KAGGLE_KERNEL_RUN_TYPE": "Batch"}, kernel)
    assert not live_frontend({}, kernel)
    assert not live_frontend({}, {"google.colab": SimpleNamespace()})  # a script on Colab: no kernel


# ------------------------------------------------------------------------------------------ stuck ranks
def conversation(pending, blocked):
    conv = Conversation(SimpleNamespace(conns=[None] * 3), 7, [0, 1, 2], {}, SimpleNamespace(raised=False))
    conv.pending = set(pending)
    conv.blocked = blocked
    return conv


def test_a_rank_waiting_for_a_rank_that_left_the_call_is_stuck_for_good():
    assert conversation({0}, {0: ("all_reduce", [0, 1, 2])}).stuck()  # 1 and 2 replied: they will not join
    assert conversation({0, 2}, {0: ("recv", [1]), 2: ("barrier", [0, 1, 2])}).stuck()


def test_ranks_that_may_still_meet_or_did_not_say_are_waited_for():
    assert not conversation({0, 1}, {0: ("all_reduce", [0, 1]), 1: ("all_reduce", [0, 1])}).stuck()
    assert not conversation({0, 1}, {0: ("all_reduce", [0, 1, 2])}).stuck()  # rank 1 may still come back
    assert not conversation(set(), {}).stuck()


def fake_dist(monkeypatch, groups):
    dist = SimpleNamespace(get_process_group_ranks=lambda group: groups[group])
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)


def test_waited_for_reads_the_group_or_the_peer(monkeypatch):
    fake_dist(monkeypatch, {None: [0, 1, 2, 3], "evens": [0, 2]})
    assert rank_watch.waited_for("all_reduce", {"group": None}) == [0, 1, 2, 3]
    assert rank_watch.waited_for("broadcast", {"group": "evens", "src": 2}) == [0, 2]  # a collective: its group
    assert rank_watch.waited_for("recv", {"group": None, "src": 3, "group_src": None}) == [3]
    assert rank_watch.waited_for("send", {"group": "evens", "dst": None, "group_dst": 1}) == [2]
    assert rank_watch.waited_for("recv", {"group": None, "src": None, "group_src": None}) == [0, 1, 2, 3]
    assert rank_watch.waited_for("all_reduce", {"group": "unknown"}) is None  # the kernel waits as before


C10D = "/x/site-packages/torch/distributed/distributed_c10d.py"


def blocked_thread(code_file):
    """A thread stopped inside a function compiled as if it were torch.distributed's; acquiring a
    held lock stands for gloo's wait: C code, where no Python instruction runs."""
    import _thread

    ns = {}
    exec(compile("def all_reduce(lock, group=None):\n    lock.acquire()\n", code_file, "exec"), ns)
    lock, entered = _thread.allocate_lock(), threading.Event()
    lock.acquire()
    thread = threading.Thread(target=lambda: (entered.set(), ns["all_reduce"](lock)), daemon=True)
    thread.start()
    entered.wait()
    time.sleep(0.05)  # inside lock.acquire()
    return thread, lock


@pytest.mark.parametrize("code_file, reported", [(C10D, True), ("/x/my_cell.py", False)])
def test_an_interrupt_that_finds_the_main_thread_in_a_collective_is_reported(monkeypatch, code_file, reported):
    fake_dist(monkeypatch, {None: [0, 1]})
    sent = []
    thread, release = blocked_thread(code_file)
    try:
        rank_watch.report_if_blocked(SimpleNamespace(send=sent.append), {"req": 9}, thread.ident)
    finally:
        release.release()
    assert sent == ([("blocked", 9, "all_reduce", [0, 1])] if reported else [])


def test_the_watch_hears_sigint_through_the_wakeup_fd(monkeypatch):
    heard = threading.Event()
    monkeypatch.setattr(rank_watch, "report_if_blocked", lambda *args: heard.set())
    previous = signal.signal(signal.SIGINT, lambda *_: None)
    old_fd = signal.set_wakeup_fd(-1)
    try:
        rank_watch.start(SimpleNamespace(send=None), {"req": None})
        signal.raise_signal(signal.SIGINT)
        assert heard.wait(5), "the watch thread never heard the SIGINT"
    finally:
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGINT, previous)


def test_a_rank_that_sits_in_a_collective_says_so_while_it_waits():
    """A hang said "rank 1 running" for the whole limit and only at the end "blocked in recv"."""
    status, clock, shower = live(limit=None)
    clock.now += 4.0
    status.waiting(1, "recv", [0])
    assert shower.texts()[-1] == ("distlab: ranks 0, 1 · limit none · 4.0 s · rank 0 running · "
                                  "rank 1 waiting in recv for rank 0")
    status.waiting(0, "all_reduce", [0, 1])
    assert shower.texts()[-1].endswith("rank 0 waiting in all_reduce for rank 1 · rank 1 waiting in recv for rank 0")
    status.blocked(1, "recv")  # then an interrupt finds it there
    status.finished(0, "done")
    assert status.status.line().endswith("rank 0 done in 4.00 s · rank 1 blocked in recv")


@pytest.mark.parametrize("code_file, reported", [(C10D, True), ("/x/my_cell.py", False)])
def test_the_watch_reports_a_wait_once_after_two_looks_at_the_same_place(monkeypatch, code_file, reported):
    fake_dist(monkeypatch, {None: [0, 1]})
    sent, seen = [], {}
    thread, release = blocked_thread(code_file)
    try:
        for _ in range(3):  # first look: noted; second: the same place, reported; third: already said
            rank_watch.report_if_waiting(SimpleNamespace(send=sent.append), {"req": 9}, thread.ident, seen)
    finally:
        release.release()
    assert sent == ([("waiting", 9, "all_reduce", [0, 1])] if reported else [])



def test_the_line_wraps_only_between_its_parts_in_a_narrow_column():
    """A narrow JupyterLab column broke the plain-text line mid-word."""
    shown = rs.bundle("distlab: ranks 0, 1 · limit 2 s · 1.3 s · rank 0 running · rank 1 <done>")
    assert shown["text/plain"] == "distlab: ranks 0, 1 · limit 2 s · 1.3 s · rank 0 running · rank 1 <done>"
    html = shown["text/html"]
    assert html.count('<span style="white-space: nowrap">') == 5 and "rank 1 &lt;done&gt;" in html
    assert '<span style="white-space: nowrap">rank 0 running</span><span> · </span>' in html


# --- what the mutation run (bench/mutation.py) found untested in distlab.warm.status ------------------------
def test_each_state_moves_on_only_from_the_states_that_may_change():
    status = rs.CallStatus([0, 1, 2, 3], 2.0, Clock())
    status.waiting(0, "recv", [0, 1])
    status.waiting(0, "all_reduce", [0, 1, 2])  # waiting again, in another call: for other ranks
    status.blocked(1, "barrier")
    status.finished(1, "error")  # blocked, then the interrupt stopped it
    status.finished(2, "died")
    status.waiting(3, "barrier", [3])  # waits for no other rank: no "for" part
    line = status.line()
    assert line.endswith("rank 0 waiting in all_reduce for ranks 1, 2 · rank 1 raised at 0.00 s · rank 2 died · "
                         "rank 3 waiting in barrier"), line
    status.blocked(0, "all_reduce")
    status.blocked(1, "recv")  # finished: stays finished
    status.waiting(1, "recv", [0])
    assert status.line().endswith("rank 0 blocked in all_reduce · rank 1 raised at 0.00 s · rank 2 died · "
                                  "rank 3 waiting in barrier")
    for rank in (7, 8, 9):  # a rank outside the call (a late reply): nothing to change, nothing raised
        status.finished(rank, "done")
        status.blocked(rank, "recv")
        status.waiting(rank, "recv", [0])
    assert sorted(status.states) == [0, 1, 2, 3]


def test_at_the_end_a_rank_still_running_says_so_and_the_phase_is_gone():
    status = rs.CallStatus([0, 1], None, Clock())
    status.finished(1, "done")
    status.set_phase("collecting where each rank is…")
    status.end("timed out")
    assert status.line() == ("distlab: ranks 0, 1 · limit none · timed out at 0.00 s · rank 0 still running · "
                             "rank 1 done in 0.00 s")


def test_the_line_is_one_display_redrawn_at_exactly_the_refresh_and_at_once_for_a_phase():
    status, clock, shower = live()
    (display_id,) = {call[2] for call in shower.calls}
    assert isinstance(display_id, str) and len(display_id) == 32
    clock.now += rs.REFRESH_S  # exactly the refresh interval: redrawn
    status.tick()
    assert shower.texts()[-1].startswith("distlab: ranks 0, 1 · limit 2 s · 0.2 s")  # 0.25 s shown as 0.2
    clock.now += 0.01
    status.phase("limit reached")  # sooner than REFRESH_S after the last draw: drawn at once all the same
    assert "limit reached" in shower.texts()[-1]
    status.tick(force=True)
    assert len(shower.calls) == 3  # the same line again: not sent again
    status.end(None)
    assert shower.calls[-1] == ("replace", "", display_id)
