"""Which process made a private temporary folder, and whether that very process still runs.

A process folder's name says ``proc-<host>-<pid>-...``, and that is not enough to prune it:

* a pid is reused: a kernel killed yesterday and a process started since with its pid look alike
  to ``kill(pid, 0)``;
* a process on one of :class:`distlab.Nodes` runs on this machine, with this machine's pids, under
  the node's own host name (``proc-node0-...``): by its name the folder is another machine's, and
  it was never pruned.

So each process leaves a stamp in its folder (:data:`STAMP`): the machine's boot id, its pid
namespace, its pid and its start time. A folder is its process's while a process with that pid
and that start time runs in that boot and pid namespace, whatever host name it ran under. A stamp
of another boot or pid namespace (another machine or container sharing the root) is not judged
here. Standard library only; reads ``/proc`` (Linux); elsewhere there is no stamp, and the name
alone is used, as before.
"""
from __future__ import annotations

import os
from pathlib import Path

STAMP = ".owner"  # in each process folder: see the module docstring


def machine() -> tuple[str, str] | None:
    """(boot id, pid namespace) of this process: where its pids mean something. None off Linux."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        return boot, os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22); None when it
    does not run (a zombie counts as gone: it runs nothing and its folder is no longer used)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return ticks_in_stat(f.read())
    except OSError:
        return None


def ticks_in_stat(text: str) -> int | None:
    """The start time in a ``/proc/<pid>/stat`` line; None for a process that ended (state Z or X)."""
    fields = text.rpartition(")")[2].split()  # after the command name, which may hold spaces and ")"
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def stamp(pid: int | None = None) -> str | None:
    """The stamp of ``pid`` (this process by default) as this process sees it; None off Linux."""
    pid = os.getpid() if pid is None else pid
    where, started = machine(), start_ticks(pid)
    if where is None or started is None:
        return None
    return f"{where[0]} {where[1]} {pid} {started}\n"


def write(folder: Path) -> None:
    """Stamp ``folder`` (just made by this process, 0700) as this process's."""
    mark = stamp()
    if mark is None:
        return
    fd = os.open(folder / STAMP, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(mark)


def read(folder: Path) -> tuple[str, str, int, int] | None:
    """(boot id, pid namespace, pid, start ticks) of the stamp in ``folder``; None without one."""
    try:
        with open(Path(folder) / STAMP, encoding="ascii") as f:
            boot, ns, pid, started = f.read().split()
        return boot, ns, int(pid), int(started)
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def verdict(folder: Path, pid: int, here: tuple[str, str] | None = None, started=start_ticks) -> bool | None:
    """Whether ``folder`` (named after process ``pid``) outlived its process, by its stamp: True
    (gone: pid ended, or reused by a later process), False (still running), None (no stamp of
    this boot and pid namespace to judge by; the caller decides by the name)."""
    here = machine() if here is None else here
    mark = read(folder)
    if mark is None or here is None or mark[:2] != here or mark[2] != pid:
        return None
    return started(pid) != mark[3]


def reused(pid: int, since: float, margin_s: float = 60.0) -> bool:
    """Whether the process now running as ``pid`` started after ``since`` (a time): then it cannot
    be the one that changed a folder at ``since``, which has ended. For folders without a stamp.
    ``margin_s``: a start time in wall-clock seconds is derived from the boot time, which moves
    when the clock is set; a live folder must never look stale."""
    ticks = start_ticks(pid)
    if ticks is None:
        return False
    try:
        with open("/proc/stat", encoding="ascii") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, StopIteration, ValueError):
        return False
    return boot + ticks / os.sysconf("SC_CLK_TCK") > since + margin_s
