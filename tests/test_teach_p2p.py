"""The blocking send/recv model of chapter 4: pure, no processes."""
import signal

import pytest

from distlab.teach.p2p import (
    check_exchange,
    check_ring_shift,
    ring_neighbours,
    ring_token,
    simulate,
)


@pytest.fixture(autouse=True)
def quick():
    """Fail any test here whose simulation does not end within 2 s: a model that never stops finding progress
    would hang the chapter's cell instead of naming the deadlock."""
    def too_slow(signum, frame):
        raise TimeoutError("simulate did not end")

    old = signal.signal(signal.SIGALRM, too_slow)
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


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


# --- word for word, and the edges (issue #60) --------------------------------------------------

def test_simulate_ends_on_a_deadlock_and_after_the_last_message():
    stuck = simulate({0: [("recv", 1), ("send", 1)], 1: [("recv", 0), ("send", 0)]})
    assert stuck.stuck == {0: ("recv", 1), 1: ("recv", 0)} and stuck.messages == []
    done = simulate({0: [("send", 1), ("recv", 1)], 1: [("recv", 0), ("send", 0)]})
    assert done.completed and done.messages == [(0, 1), (1, 0)]


def raised(check, *args) -> str:
    with pytest.raises(AssertionError) as caught:
        check(*args)
    return str(caught.value)


def test_a_bad_step_names_the_rank_the_step_and_the_peers():
    with pytest.raises(ValueError) as caught:
        simulate({0: [("recv", 0)], 1: []})
    assert str(caught.value) == ("rank 0: bad step ('recv', 0); use ('send', peer) or ('recv', peer) with a peer "
                                 "among ranks [0, 1] other than 0")
    for step in [("send",), ("send", 1, 0), ("send", 2), ("Send", 1)]:
        with pytest.raises(ValueError, match=r"^rank 0: bad step"):
            simulate({0: [step], 1: []})
    assert simulate({0: [("send", 1)], 1: [("recv", 0)]}).completed


def test_a_rank_that_finished_leaves_its_peer_waiting():
    out = simulate({0: [("send", 1), ("send", 1)], 1: [("recv", 0)], 2: [("recv", 1)]})
    assert out.messages == [(0, 1)] and out.stuck == {0: ("send", 1), 2: ("recv", 1)}
    assert str(out) == "deadlock: rank 0 in send(dst=1), rank 2 in recv(src=1)"
    assert not out.completed


def test_messages_are_matched_in_rank_order_each_round():
    out = simulate({0: [("recv", 2)], 1: [("send", 2)], 2: [("recv", 1), ("send", 0)]})
    assert out.completed and out.messages == [(1, 2), (2, 0)]
    assert simulate({}).completed and str(simulate({0: []})) == "completes: 0 messages"


def test_ring_helpers_at_the_edges():
    assert ring_neighbours(1, 2) == (0, 0) and ring_neighbours(2, 5) == (1, 3)
    assert ring_token(1) == 0 and ring_token(5, 1) == 11


def test_check_exchange_word_for_word(capsys):
    check_exchange({0: [("send", 1), ("recv", 1)], 1: [("recv", 0), ("send", 0)]})
    assert capsys.readouterr().out == "correct: the exchange completes, completes: 2 messages\n"
    assert raised(check_exchange, {0: [("recv", 1), ("send", 1)], 1: [("recv", 0), ("send", 0)]}) == (
        "This deadlock: rank 0 in recv(src=1), rank 1 in recv(src=0). One rank has to send while the other receives.")
    assert raised(check_exchange, {0: [("send", 1)], 1: [("recv", 0)]}) == (
        "Rank 0 must send once to 1 and receive once from 1.")
    assert raised(check_exchange, {0: [("send", 1), ("recv", 1)], 1: [("recv", 0)]}) == (
        "Rank 1 must send once to 0 and receive once from 0.")
    assert raised(check_exchange, {0: []}) == "Give a program for rank 0 and for rank 1: {0: [...], 1: [...]}."


def test_check_ring_shift_word_for_word(capsys):
    good = {0: [("send", 1), ("recv", 3)], 1: [("recv", 0), ("send", 2)],
            2: [("send", 3), ("recv", 1)], 3: [("recv", 2), ("send", 0)]}
    check_ring_shift(good)
    assert capsys.readouterr().out == "correct: every rank passed its tensor to the right, completes: 4 messages\n"
    everyone_sends = {r: [("send", (r + 1) % 4), ("recv", (r - 1) % 4)] for r in range(4)}
    assert raised(check_ring_shift, everyone_sends) == (
        "This deadlock: rank 0 in send(dst=1), rank 1 in send(dst=2), rank 2 in send(dst=3), rank 3 in send(dst=0). "
        "Hint: let the even ranks send first and the odd ranks receive first.")
    assert raised(check_ring_shift, {0: []}) == "Give a program for each of the ranks 0..3."
    assert raised(check_ring_shift, {**good, 3: [("recv", 2), ("send", 1)]}) == (
        "Rank 3 must send once to 0 (its right) and receive once from 2 (its left).")
    three = {0: [("send", 1), ("recv", 2)], 1: [("recv", 0), ("send", 2)], 2: [("recv", 1), ("send", 0)]}
    check_ring_shift(three, 3)
    assert capsys.readouterr().out == "correct: every rank passed its tensor to the right, completes: 3 messages\n"


def test_check_shift_right_word_for_word(capsys):
    from distlab.teach.p2p import check_shift_right

    check_shift_right({3: 2.0, 0: 3.0, 1: 0.0, 2: 1.0})
    assert capsys.readouterr().out == "correct: every one of the 4 ranks received its left neighbour's tensor.\n"
    assert raised(check_shift_right, {0: 3.0, 1: 0.0, 2: 1.0, 3: 3.0}) == (
        "Rank 3 returned 3.0; it should have received 2.0 from its left neighbour, rank 2.")
    assert raised(check_shift_right, {0: 1.0, 1: 0.0}) == "Run it on 4 ranks: ranks 0..3."
    check_shift_right({0: 1.0, 1: 0.0}, 2)
    assert capsys.readouterr().out == "correct: every one of the 2 ranks received its left neighbour's tensor.\n"
