"""The launcher's watcher thread: streams rank output live, enforces the timeout, stops workers.

It runs beside torchelastic's agent (which owns the main thread, so it can catch SIGINT).
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import psutil

POLL_S = 0.05
STACK_WAIT_S = 0.5


def our_workers(run_id: str) -> list[psutil.Process]:
    """Live descendants of this process that belong to run ``run_id`` (torchelastic sets the id)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.environ().get("TORCHELASTIC_RUN_ID") == run_id:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    # -- start-mode hook (#18): a forked rank's /proc environment is the forkserver's, not its own
    from .launchmode import forked_ranks

    return found + [p for p in forked_ranks(run_id).values() if p not in found]


def stop_workers(run_id: str, grace_s: float = 2.0) -> int:
    """SIGTERM, then SIGKILL whatever is left of the run; returns how many were alive."""
    procs = our_workers(run_id)
    for p in procs:
        _signal(p, signal.SIGTERM)
        _signal(p, signal.SIGCONT)  # a stopped worker acts on SIGTERM only once continued
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        _signal(p, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=grace_s)
    return len(procs)


def _signal(p: psutil.Process, sig) -> None:
    try:
        p.send_signal(sig)
    except psutil.NoSuchProcess:
        pass


class Watcher(threading.Thread):
    def __init__(self, run_dir: Path, run_id: str, world_size: int, view, timeout: float | None):
        super().__init__(daemon=True, name=f"distlab-watch-{run_id}")
        self.run_dir, self.run_id, self.world_size = run_dir, run_id, world_size
        self.view, self.timeout = view, timeout
        self.timed_out = False
        self.stacks: dict[int, str] = {}
        self._stop_event = threading.Event()
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, str] = {}
        self._start = time.monotonic()

    def run(self) -> None:
        while not self._stop_event.wait(POLL_S):
            self.poll()
            if self.timeout and not self.timed_out and time.monotonic() - self._start > self.timeout:
                self.stacks = self.dump_stacks()
                self.timed_out = True
            if self.timed_out:
                stop_workers(self.run_id, grace_s=0.5)  # again after any torchelastic restart

    def finish(self) -> None:
        """Stop watching, then stream what is left so no line is lost."""
        self._stop_event.set()
        if self.is_alive():
            self.join()
        self.poll(final=True)
        self.view.close()

    def poll(self, final: bool = False) -> None:
        for path in sorted(self.run_dir.glob("logs/attempt*/rank*.*")):
            if path.suffix in (".out", ".err"):
                rank = int(path.stem[4:])
                for line in self._new_lines(path, final):
                    self.view.line(rank, line)
        for path in sorted(self.run_dir.glob("metrics/rank*.jsonl")):
            rank = int(path.stem[4:])
            for line in self._new_lines(path, final):
                self.view.metric(rank, json.loads(line))

    def _new_lines(self, path: Path, final: bool) -> list[str]:
        with open(path, "rb") as f:
            f.seek(self._offsets.get(path, 0))
            chunk = f.read()
        self._offsets[path] = self._offsets.get(path, 0) + len(chunk)
        text = self._partial.pop(path, "") + chunk.decode(errors="replace")
        lines = text.split("\n")
        if not final:
            self._partial[path] = lines.pop()  # keep an unfinished line for later
        elif lines and lines[-1] == "":
            lines.pop()
        return lines

    def dump_stacks(self) -> dict[int, str]:
        """Ask every started rank for its Python stacks (faulthandler on SIGUSR1) and read them."""
        ready = {int(p.name[4:]): int(p.read_text()) for p in (self.run_dir / "ready").glob("rank*")}
        for pid in ready.values():
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        time.sleep(STACK_WAIT_S)
        stacks = {}
        for rank in range(self.world_size):
            path = self.run_dir / "stacks" / f"rank{rank}.txt"
            text = path.read_text(errors="replace") if path.exists() else ""
            stacks[rank] = clean_stack(text) or "(not started yet: still importing, or already exited)"
        return stacks


RUNTIME_FRAMES = ("distlab/worker.py", "distlab/_start.py", "<frozen runpy>", "threading.py")


def clean_stack(dump: str) -> str:
    """Keep a faulthandler dump readable: drop distlab's own watchdog thread and launcher frames."""
    blocks, current = [], []
    for line in dump.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")) and current:
            blocks.append(current)
            current = []
        current.append(line)
    if current:
        blocks.append(current)
    kept = []
    for block in blocks:
        if any("_exit_with_parent" in line for line in block):
            continue
        kept.append("\n".join(line for line in block if not any(f in line for f in RUNTIME_FRAMES)))
    return "\n\n".join(kept)
