"""Slurm's warning (``--signal=SIG@T``) that came before a process's ranks existed: passed on to them.

Slurm sends the warning once per attempt, to the processes the job's step has at that moment. Its controller
sends it at its first time-limit check (one every 30 s) at which the warning is less than 30 s away: with a
warning time close to the limit (``--time=1 --signal=USR1@50``) that check can come at any moment from the
attempt's start on. The processes that start ranks (torchrun's agent under :mod:`distlab.slurm.bound`, and
:mod:`distlab.slurm.rank`) hold the warning signals blocked, so that the warning never kills them. One that came
while they were still starting (torchrun importing torch and meeting the other nodes takes seconds) reached no
rank: it stayed pending in the starter, and the ranks never heard of it (in CI the job then ran to its end in one
attempt instead of checkpointing and requeueing).

So a starter, right after it has started its ranks, takes the warnings pending in it and passes each on to every
rank that does not already hold it. A rank that existed when Slurm signalled holds it pending itself (it starts
with the warnings blocked until its own handler exists, :func:`distlab.worker.release_on_handler`), and gets no
second one. The pure part (:func:`pending_in`, :func:`missed`) is apart from the signalling (:func:`pass_on`).
"""
from __future__ import annotations

import os
import signal

WARNING_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
_PENDING_FIELDS = ("SigPnd:", "ShdPnd:")  # pending for the thread, and for the whole process


def pending_in(status: str) -> set[int]:
    """The signals pending in a process, from its ``/proc/PID/status`` text (hex masks, bit ``n-1`` for
    signal ``n``): those sent to its main thread and those sent to the process."""
    mask = 0
    for line in status.splitlines():
        if line.startswith(_PENDING_FIELDS):
            mask |= int(line.split()[1], 16)
    return {bit + 1 for bit in range(mask.bit_length()) if mask >> bit & 1}


def missed(taken: list[int], held: dict[int, set[int]]) -> list[tuple[int, int]]:
    """(pid, signal) for each warning ``taken`` from the starter that a rank (pid -> the signals pending in it)
    does not hold: the ranks that did not exist when it came. In pid order, then the order taken."""
    return [(pid, sig) for pid in sorted(held) for sig in taken if sig not in held[pid]]


def take_pending(signals=WARNING_SIGNALS, wait=signal.sigtimedwait) -> list[int]:
    """Take (consume) the ``signals`` pending in this process, which holds them blocked; none waits."""
    taken = []
    while (info := wait(signals, 0)) is not None:
        taken.append(info.si_signo)
    return taken


def _held_by(pid: int) -> set[int] | None:
    """The signals pending in ``pid``; None when it has ended (nothing to pass on to)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return pending_in(f.read())
    except (FileNotFoundError, ProcessLookupError):
        return None


def pass_on(pids, signals=WARNING_SIGNALS) -> list[tuple[int, int]]:
    """After starting the ranks ``pids``: the warnings pending in this process go to the ranks that missed them.
    Returns what was sent, (pid, signal)."""
    taken = take_pending(signals)
    if not taken:
        return []
    held = {pid: found for pid in pids if (found := _held_by(pid)) is not None}
    sent = []
    for pid, sig in missed(taken, held):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue
        sent.append((pid, sig))
    return sent
