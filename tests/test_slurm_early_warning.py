"""distlab.slurm.early_warning without processes: which signals a /proc status says are pending, which ranks
missed a warning that came before they existed, and what the starter takes and sends (stubbed)."""
import signal
from types import SimpleNamespace

import pytest

from distlab.slurm import early_warning

STATUS = """Name:\tpython
SigQ:\t2/96367
SigPnd:\t{thread}
ShdPnd:\t{process}
SigBlk:\t0000000000000a00
SigIgn:\t0000000001001000
SigCgt:\t0000000100000002
"""


def status(thread: int = 0, process: int = 0) -> str:
    return STATUS.format(thread=f"{thread:016x}", process=f"{process:016x}")


@pytest.mark.parametrize(("thread", "process", "pending"), [
    (0, 0, set()),
    (0, 1 << 9, {signal.SIGUSR1}),                      # kill(pid, SIGUSR1): the process's
    (1 << 11, 0, {signal.SIGUSR2}),                     # to the main thread
    (1 << 9, 1 << 11, {signal.SIGUSR1, signal.SIGUSR2}),  # both fields count
    (1, 1 << 63, {1, 64}),                              # the lowest and the highest bit
])
def test_pending_in_reads_the_thread_and_the_process_masks(thread, process, pending):
    assert early_warning.pending_in(status(thread, process)) == pending


def test_pending_in_ignores_the_blocked_ignored_and_caught_masks():
    text = "SigBlk:\tffffffffffffffff\nSigIgn:\tffffffffffffffff\nSigCgt:\tffffffffffffffff\nNoSigPnd:\t1\n"
    assert early_warning.pending_in(text) == set()


def test_missed_is_each_rank_that_does_not_hold_each_taken_warning_in_pid_order():
    held = {30: {signal.SIGUSR1}, 10: set(), 20: {signal.SIGUSR2, signal.SIGUSR1}}
    taken = [signal.SIGUSR2, signal.SIGUSR1]
    assert early_warning.missed(taken, held) == [(10, signal.SIGUSR2), (10, signal.SIGUSR1),
                                                 (30, signal.SIGUSR2)]
    assert early_warning.missed([], held) == []
    assert early_warning.missed(taken, {}) == []


def test_take_pending_takes_until_none_is_left_without_waiting():
    queue, asked = [signal.SIGUSR2, signal.SIGUSR1], []

    def wait(signals, timeout):
        asked.append((tuple(signals), timeout))
        return SimpleNamespace(si_signo=queue.pop(0)) if queue else None

    assert early_warning.take_pending((signal.SIGUSR1, signal.SIGUSR2), wait) == [signal.SIGUSR2, signal.SIGUSR1]
    assert asked == [((signal.SIGUSR1, signal.SIGUSR2), 0)] * 3


def test_the_warning_signals_are_usr1_and_usr2():
    assert early_warning.WARNING_SIGNALS == (signal.SIGUSR1, signal.SIGUSR2)


def test_take_pending_really_takes_a_blocked_pending_signal():
    """In this process: SIGUSR2 blocked and raised is pending, and taken once (none is left after)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
    try:
        signal.raise_signal(signal.SIGUSR2)
        assert early_warning.take_pending((signal.SIGUSR2,)) == [signal.SIGUSR2]
        assert early_warning.take_pending((signal.SIGUSR2,)) == []
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@pytest.fixture
def starter(monkeypatch):
    """pass_on with what it takes, what each pid holds and what os.kill does stubbed: (sent, set taken, set held)."""
    sent, state = [], {"taken": [], "held": {}, "asked": []}

    def take(signals):
        state["asked"].append(tuple(signals))
        return list(state["taken"])

    monkeypatch.setattr(early_warning, "take_pending", take)
    monkeypatch.setattr(early_warning, "_held_by", lambda pid: state["held"].get(pid))

    def kill(pid, sig):
        if pid == 99:
            raise ProcessLookupError(pid)
        sent.append((pid, sig))

    monkeypatch.setattr(early_warning.os, "kill", kill)
    return sent, state


def test_pass_on_sends_the_taken_warnings_to_the_ranks_that_missed_them(starter):
    sent, state = starter
    state["taken"] = [signal.SIGUSR1]
    state["held"] = {1: set(), 2: {signal.SIGUSR1}, 3: {signal.SIGUSR2}}
    assert early_warning.pass_on([3, 1, 2, 4]) == [(1, signal.SIGUSR1), (3, signal.SIGUSR1)]  # 4 has ended
    assert sent == [(1, signal.SIGUSR1), (3, signal.SIGUSR1)]
    assert state["asked"] == [(signal.SIGUSR1, signal.SIGUSR2)]  # the warning signals, by default
    assert early_warning.pass_on([1], (signal.SIGUSR2,)) == [(1, signal.SIGUSR1)]
    assert state["asked"][-1] == (signal.SIGUSR2,)


def test_pass_on_sends_nothing_when_nothing_was_pending_or_a_rank_ended_meanwhile(starter):
    sent, state = starter
    state["held"] = {1: set()}
    assert early_warning.pass_on([1]) == [] and sent == []
    state["taken"], state["held"] = [signal.SIGUSR2], {99: set(), 100: set()}
    assert early_warning.pass_on([99, 100]) == [(100, signal.SIGUSR2)]  # 99 ended between the look and the kill


def test_held_by_reads_a_live_process_and_is_none_for_an_ended_one(monkeypatch):
    import os

    assert early_warning._held_by(os.getpid()) == early_warning.pending_in(open("/proc/self/status").read())
    assert early_warning._held_by(2**22 + 1) is None  # above pid_max's highest value: no such process
