"""A rank's stack dump cut down to the learner's frames. Pure.

When a run or a ``%%ranks`` cell times out, each rank writes where it waits (``faulthandler``:
every thread, innermost frame first). Most of that is distlab's: its watchdog thread, the worker
runtime, the frames that started the process (``runpy``, a fork from the server). One cleaner,
for a launch's timeout (:mod:`distlab.launch.watch`) and a warm rank's (:mod:`distlab.warm.group`):
each says which files are its runtime.
"""
from __future__ import annotations

import re

WATCHDOG = "_exit_with_parent"  # the thread that ends a rank whose parent died (distlab.worker)


def clean_stack(dump: str, runtime: tuple[str, ...], *, started_by: tuple[str, ...] = (),
                compact: bool = False) -> str:
    """``dump`` without distlab's watchdog thread, without frames from ``runtime`` files, and
    without the outermost frames that match ``started_by`` (how the process started, not where it
    is). Threads left with no frame are dropped. ``compact``: no thread headers, no indentation,
    site-packages paths shortened (``File "torch/x.py"``): the same text on every machine."""
    kept = []
    for block in thread_blocks(dump):
        frames = [line for line in block[1:] if line.strip() and not any(r in line for r in runtime)]
        if compact:
            frames = [short_path(line.strip()) for line in frames]
        while frames and any(s in frames[-1] for s in started_by):
            frames.pop()
        if frames:
            kept.append("\n".join(frames if compact else [block[0], *frames]))
    return "\n\n".join(kept)


def thread_blocks(dump: str) -> list[list[str]]:
    """Each thread's lines (its header first), distlab's watchdog thread left out."""
    blocks, current = [], []
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")) and current:
            blocks.append(current)
            current = []
        current.append(line)
    if current:
        blocks.append(current)
    return [block for block in blocks if not any(WATCHDOG in line for line in block)]


def short_path(frame: str) -> str:
    """``File ".../site-packages/torch/x.py"`` -> ``File "torch/x.py"``: the same on every machine."""
    return re.sub(r'^File ".*?[/\\]site-packages[/\\]', 'File "', frame)
