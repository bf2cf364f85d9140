"""Point-to-point communication on paper: a model of blocking send/recv that predicts deadlocks.

Chapter 4 measures that with gloo a blocking ``send`` returns only once the receiver has posted the
matching ``recv`` (a *rendezvous*), and a blocking ``recv`` waits for its sender. Under that rule a
program is a list of ``("send", peer)`` / ``("recv", peer)`` steps per rank, and whether it
finishes or deadlocks can be decided without starting a process: :func:`simulate`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

OPS = ("send", "recv")


@dataclass
class Outcome:
    """What :func:`simulate` found: the matched messages in order, and where each stuck rank waits."""

    completed: bool
    messages: list = field(default_factory=list)  # (sender, receiver), in the order they were matched
    stuck: dict = field(default_factory=dict)  # rank -> the ("send"|"recv", peer) step it waits in

    def __str__(self) -> str:
        if self.completed:
            return f"completes: {len(self.messages)} messages"
        waits = ", ".join(f"rank {r} in {op}({'dst' if op == 'send' else 'src'}={p})"
                          for r, (op, p) in sorted(self.stuck.items()))
        return f"deadlock: {waits}"


def _validate(programs: dict) -> None:
    for rank, steps in programs.items():
        for step in steps:
            if len(step) != 2 or step[0] not in OPS or step[1] not in programs or step[1] == rank:
                raise ValueError(f"rank {rank}: bad step {step!r}; use ('send', peer) or ('recv', peer) "
                                 f"with a peer among ranks {sorted(programs)} other than {rank}")


def simulate(programs: dict) -> Outcome:
    """Run blocking programs under the rendezvous rule; a message moves only when both sides are ready.

    ``programs[rank]`` is that rank's list of steps. Returns an :class:`Outcome`: ``completed`` if
    every rank got to the end, otherwise the step each unfinished rank is blocked in.
    """
    _validate(programs)
    pos = {rank: 0 for rank in programs}
    messages = []
    progress = True
    while progress:
        progress = False
        for rank in sorted(programs):
            if pos[rank] >= len(programs[rank]):
                continue
            op, peer = programs[rank][pos[rank]]
            if op != "send" or pos[peer] >= len(programs[peer]):
                continue
            if programs[peer][pos[peer]] == ("recv", rank):
                pos[rank] += 1
                pos[peer] += 1
                messages.append((rank, peer))
                progress = True
    stuck = {r: programs[r][pos[r]] for r in programs if pos[r] < len(programs[r])}
    return Outcome(not stuck, messages, stuck)


def ring_neighbours(rank: int, world_size: int) -> tuple[int, int]:
    """(left, right): who a rank receives from and sends to in a ring."""
    return (rank - 1) % world_size, (rank + 1) % world_size


def ring_token(world_size: int, start: int = 0) -> int:
    """The token's value after a lap around the ring when every rank adds its own rank to it."""
    return start + sum(range(world_size))


# --- exercise self-checks ----------------------------------------------------------------------------

def _hint(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)


def check_exchange(programs: dict) -> None:
    """Exercise: ranks 0 and 1 swap tensors with *blocking* calls only, without deadlocking."""
    _hint(set(programs) == {0, 1}, "Give a program for rank 0 and for rank 1: {0: [...], 1: [...]}.")
    for rank, peer in ((0, 1), (1, 0)):
        _hint(sorted(programs[rank]) == [("recv", peer), ("send", peer)],
              f"Rank {rank} must send once to {peer} and receive once from {peer}.")
    outcome = simulate(programs)
    _hint(outcome.completed, f"This {outcome}. One rank has to send while the other receives.")
    print("correct: the exchange completes,", outcome)


def check_ring_shift(programs: dict, world_size: int = 4) -> None:
    """Exercise: every rank sends to its right and receives from its left (blocking), deadlock-free."""
    _hint(set(programs) == set(range(world_size)), f"Give a program for each of the ranks 0..{world_size - 1}.")
    for rank in range(world_size):
        left, right = ring_neighbours(rank, world_size)
        _hint(sorted(programs[rank]) == sorted([("send", right), ("recv", left)]),
              f"Rank {rank} must send once to {right} (its right) and receive once from {left} (its left).")
    outcome = simulate(programs)
    _hint(outcome.completed, f"This {outcome}. Hint: let the even ranks send first and the odd ranks "
                             "receive first.")
    print("correct: every rank passed its tensor to the right,", outcome)


def check_shift_right(returns: dict, world_size: int = 4) -> None:
    """Exercise 3, on real ranks: ``returns[r]`` is what rank r received; it must be its left neighbour's rank."""
    _hint(sorted(returns) == list(range(world_size)), f"Run it on {world_size} ranks: ranks 0..{world_size - 1}.")
    for rank in range(world_size):
        left, _ = ring_neighbours(rank, world_size)
        _hint(returns[rank] == float(left), f"Rank {rank} returned {returns[rank]!r}; it should have received "
                                            f"{float(left)} from its left neighbour, rank {left}.")
    print(f"correct: every one of the {world_size} ranks received its left neighbour's tensor.")
