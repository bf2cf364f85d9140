"""Who owns a file, as seen from inside a user namespace: what the private-folder checks may conclude.

An ordinary user's :class:`distlab.Nodes` live in one user namespace of theirs
(``unshare --user --map-root-user``) that maps exactly one uid: theirs, which shows as 0 inside.
Every other uid of the host, root's included, has no name there: the kernel shows its files as
owned by the *overflow uid* (``/proc/sys/kernel/overflowuid``, 65534, ``nobody``). So inside, ``/``,
``/tmp`` and ``/home`` look like ``nobody``'s, and so does a folder of another user, alice: from
inside, stat cannot tell the host's root from alice. :mod:`distlab.folders.private` decides what to
trust with that; this module only reads the namespace (the uid map and the overflow uid) and
answers questions about it. Pure logic on a :class:`UidView`; :func:`current` reads this process's
view from ``/proc`` once (a process never changes user namespace: distlab never calls ``setns``
on itself, it starts ``nsenter``).

Standard library only.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

UID_MAP = "/proc/self/uid_map"
OVERFLOW_UID = "/proc/sys/kernel/overflowuid"
WHOLE_RANGE = 4294967295  # the initial namespace maps every uid to itself: "0 0 4294967295"


@dataclass(frozen=True)
class UidView:
    """A user namespace's uid map, as ``(first uid inside, first uid outside, count)`` lines, and the
    uid its files of unmapped owners show as."""

    mapping: tuple[tuple[int, int, int], ...] = ((0, 0, WHOLE_RANGE),)
    overflow: int = 65534

    @property
    def initial(self) -> bool:
        """The host's own view (no user namespace, or one that maps every uid as it is): owners are real."""
        return all(inside == outside for inside, outside, _ in self.mapping) and self.covered() >= WHOLE_RANGE

    def covered(self) -> int:
        return sum(count for _, _, count in self.mapping)

    def maps(self, uid: int) -> bool:
        return any(inside <= uid < inside + count for inside, _, count in self.mapping)

    def hides(self, uid: int) -> bool:
        """Whether a file that shows as owned by ``uid`` may belong to *any* user of the host that
        this namespace does not map (root, or another user): its owner cannot be known from here."""
        return not self.initial and uid == self.overflow and not self.maps(uid)

    def outer_uid(self, uid: int) -> int:
        """``uid`` as the namespace that made this one knows it, when this namespace was made for a
        single user (one uid mapped: the nodes' ``--map-root-user``, where you are 0 inside); else
        ``uid`` itself. A root folder's name built from it (``distlab-<uid>``) is the same inside
        the nodes as in the kernel that started them."""
        if len(self.mapping) == 1 and self.mapping[0][2] == 1 and self.mapping[0][0] == uid:
            return self.mapping[0][1]
        return uid


def parse_uid_map(text: str) -> tuple[tuple[int, int, int], ...]:
    """``/proc/<pid>/uid_map``'s lines (``inside outside count``) as tuples; a line that is not
    three numbers is an error (the kernel writes nothing else)."""
    lines = []
    for line in text.splitlines():
        if line.strip():
            inside, outside, count = (int(word) for word in line.split())
            lines.append((inside, outside, count))
    return tuple(lines)


def _read(path: str) -> str:
    with open(path) as f:  # closed at once: an unclosed file is a ResourceWarning in the learner's cell
        return f.read()


def read_view(read=_read) -> UidView:
    """The view of the process that reads ``/proc/self``; the host's own view where ``/proc`` has
    no uid map (a kernel without user namespaces, or another system)."""
    try:
        mapping = parse_uid_map(read(UID_MAP))
    except (OSError, ValueError):
        return UidView()
    try:
        overflow = int(read(OVERFLOW_UID).strip())
    except (OSError, ValueError):
        overflow = 65534
    return UidView(mapping or UidView().mapping, overflow)


@functools.lru_cache(maxsize=1)
def _cached(pid: int) -> UidView:
    return read_view()


def current() -> UidView:
    """This process's view (read once per process; a forked child reads its own, though it shares it)."""
    return _cached(os.getpid())
