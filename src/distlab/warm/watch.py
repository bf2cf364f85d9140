"""Inside one warm rank: when an interrupt finds it stuck in a collective, tell the kernel at once.

After a timeout (or Kernel > Interrupt) the kernel sends SIGINT to every busy rank. A rank in
Python code raises KeyboardInterrupt within milliseconds and replies. A rank inside a collective
cannot: its main thread waits in C code, where Python never runs the signal handler. The kernel
used to give such a rank INTERRUPT_WAIT_S (2 s) before calling it blocked; that wait was most
of the seconds a ``%%ranks --timeout 2`` cell stayed blank before its error.

Python's C-level signal handler writes each signal's number to the "wakeup fd" even while the
main thread is stuck, so a small thread here learns of the SIGINT at once. If, CONFIRM_S later,
the main thread still sits at the same instruction of a ``torch.distributed`` function, it is
waiting in C, and this thread sends ``("blocked", req, function, ranks)``: the global ranks the
call waits for (a collective's group, a send's or recv's peer). The kernel knows which ranks
have left the call (they replied, or were never in it): a collective waiting for one of those
can never finish, so the kernel can stop waiting without guessing.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

from distlab.warm.proto import BLOCKED, WAITING

C10D_FILE = "torch/distributed/distributed_c10d.py"
CONFIRM_S = 0.05  # a main thread in Python code handles SIGINT long before this
WAITING_S = 1.0  # a call that sits this long in a collective says so (the cell's status line shows it)


def start(sender, state: dict) -> None:
    """Watch for SIGINT from a thread of its own. Must run in the main thread (signal's rule)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # the C handler must never block
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    main = threading.main_thread().ident
    threading.Thread(target=_watch, args=(read_end, sender, state, main), daemon=True,
                     name="distlab-interrupt-watch").start()


def _watch(read_end: int, sender, state: dict, main: int) -> None:
    import select

    seen: dict = {}
    while True:
        try:
            ready, _, _ = select.select([read_end], [], [], WAITING_S)
            got = os.read(read_end, 64) if ready else b"?"
        except OSError:
            return
        if not got:
            return
        if not ready:
            report_if_waiting(sender, state, main, seen)
        elif signal.SIGINT in got:
            report_if_blocked(sender, state, main)


def report_if_waiting(sender, state: dict, main: int, seen: dict) -> None:
    """Send ``("waiting", req, function, ranks)`` once for a call whose main thread has sat at the
    same instruction of a ``torch.distributed`` function since the last look (``seen``: that look)."""
    req, frame = state["req"], sys._current_frames().get(main)
    if req is None or frame is None or not frame.f_code.co_filename.replace("\\", "/").endswith(C10D_FILE):
        seen.clear()
        return
    here = (req, id(frame), frame.f_lasti)
    if seen.get("last") == here and seen.get("told") != here:
        ranks = waited_for(frame.f_code.co_name, frame.f_locals)
        sender.send((WAITING, req, frame.f_code.co_name, ranks or []))
        seen["told"] = here
    seen["last"] = here


def report_if_blocked(sender, state: dict, main: int) -> None:
    """Send ``("blocked", req, function, ranks)`` when the main thread stays in a collective."""
    req, frame = state["req"], sys._current_frames().get(main)
    if req is None or frame is None or not frame.f_code.co_filename.replace("\\", "/").endswith(C10D_FILE):
        return
    at = frame.f_lasti
    time.sleep(CONFIRM_S)
    if sys._current_frames().get(main) is not frame or frame.f_lasti != at or state["req"] != req:
        return  # it moved: Python code, which handles the interrupt itself
    ranks = waited_for(frame.f_code.co_name, frame.f_locals)
    if ranks is not None:
        sender.send((BLOCKED, req, frame.f_code.co_name, ranks))


def waited_for(function: str, local: dict) -> list[int] | None:
    """Global ranks ``torch.distributed.<function>`` waits for, read from its local variables: the
    peer of a ``send`` or ``recv`` (when it names one), else every rank of the call's group."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        members = dist.get_process_group_ranks(local.get("group"))  # None: the default group
        peers = {"send": ("dst", "group_dst"), "recv": ("src", "group_src")}.get(function, ())
        if peers and local.get(peers[0]) is not None:
            return [int(local[peers[0]])]
        if peers and local.get(peers[1]) is not None:
            return [members[int(local[peers[1]])]]
        return members
    except Exception:  # a frame this reading does not understand: the kernel waits as before
        return None
