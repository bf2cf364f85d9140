"""The blocking send/recv model of chapter 4: pure, no processes."""
import pytest

from distlab.teach.p2p import (
    check_exchange,
    check_ring_shift,
    ring_neighbours,
    ring_token,
    simulate,
)


def test_two_receives_first_deadlock_with_both_ranks_in_recv():
    out = simulate({0: [("recv", 1), ("send", 1)], 1: [("recv", 0), ("send", 0)]})
    assert not out.completed
    assert out.stuck == {0: ("recv", 1), 1: ("recv", 0)}
    assert str(out) == "deadlock: rank 0 in recv(src=1), rank 1 in recv(src=0)"


def test_two_sends_first_deadlock_too_under_rendezvous():
    out = simulate({0: [("send", 1), ("recv", 1)], 1: [("send", 0), ("recv", 0)]})
    assert out.stuck == {0: ("send", 1), 1: ("send", 0)}


def test_opposite_orders_complete_in_message_order():
    out = simulate({0: [("send", 1), ("recv", 1)], 1: [("recv", 0), ("send", 0)]})
    assert out.completed and out.messages == [(0, 1), (1, 0)] and out.stuck == {}
    assert str(out) == "completes: 2 messages"


def test_blocking_ring_pass_serialises_around_the_ring():
    n = 4
    progs = {0: [("send", 1), ("recv", 3)]}
    progs.update({r: [("recv", r - 1), ("send", (r + 1) % n)] for r in range(1, n)})
    out = simulate(progs)
    assert out.completed and out.messages == [(0, 1), (1, 2), (2, 3), (3, 0)]


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_parity_ring_shift_completes_for_any_size(n):
    progs = {}
    for r in range(n):
        left, right = ring_neighbours(r, n)
        send, recv = ("send", right), ("recv", left)
        progs[r] = [send, recv] if r % 2 == 0 else [recv, send]
    assert simulate(progs).completed


def test_bad_steps_are_rejected_with_a_hint():
    with pytest.raises(ValueError, match="bad step"):
        simulate({0: [("recv", 0)], 1: []})
    with pytest.raises(ValueError, match="bad step"):
        simulate({0: [("bcast", 1)], 1: []})


def test_ring_helpers():
    assert ring_neighbours(0, 4) == (3, 1) and ring_neighbours(3, 4) == (2, 0)
    assert ring_token(4) == 6 and ring_token(3, start=10) == 13


def test_check_exchange_accepts_a_fix_and_explains_a_deadlock(capsys):
    check_exchange({0: [("send", 1), ("recv", 1)], 1: [("recv", 0), ("send", 0)]})
    assert "correct" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="deadlock: rank 0 in recv"):
        check_exchange({0: [("recv", 1), ("send", 1)], 1: [("recv", 0), ("send", 0)]})
    with pytest.raises(AssertionError, match="must send once"):
        check_exchange({0: [("send", 1)], 1: [("recv", 0)]})


def test_check_ring_shift(capsys):
    good = {0: [("send", 1), ("recv", 3)], 1: [("recv", 0), ("send", 2)],
            2: [("send", 3), ("recv", 1)], 3: [("recv", 2), ("send", 0)]}
    check_ring_shift(good)
    assert "correct" in capsys.readouterr().out
    everyone_sends = {r: [("send", (r + 1) % 4), ("recv", (r - 1) % 4)] for r in range(4)}
    with pytest.raises(AssertionError, match="even ranks send first"):
        check_ring_shift(everyone_sends)
    with pytest.raises(AssertionError, match="Give a program"):
        check_ring_shift({0: []})


def test_check_shift_right_on_real_ranks_results(capsys):
    from distlab.teach.p2p import check_shift_right

    check_shift_right({0: 3.0, 1: 0.0, 2: 1.0, 3: 2.0})
    assert "correct" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="Rank 0 returned 0.0"):
        check_shift_right({0: 0.0, 1: 0.0, 2: 1.0, 3: 2.0})
    with pytest.raises(AssertionError, match="Run it on 4 ranks"):
        check_shift_right({0: 1.0, 1: 0.0})
