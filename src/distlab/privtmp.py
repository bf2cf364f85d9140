"""This process's private temporary folder, and the temporary files of torch kept inside it.

torch's launcher writes files to ``tempfile``'s directory (normally the shared ``/tmp``) and
reads some of them back: ``torch.multiprocessing.start_processes`` names an error file
``pytorch-errorfile-*.pickle`` there, *unlinks it*, and when a rank fails it ``pickle.load``\\ s
whatever then sits at that path, in the launching process (the kernel). Another user who
re-creates the name in ``/tmp`` runs code as you. ``multiprocessing`` keeps its ``pymp-*``
folder there too (the forkserver's socket), and warm ranks kept their folder there, both left
behind after a SIGKILL where pruning never looked.

So every place distlab starts processes does it inside :func:`private_tempfiles`, which points
``tempfile`` at ``<runs root>/proc-<host>-<pid>-<random>``: made 0700 by ``mkdtemp`` inside the
checked private root, removed when the process exits, and pruned with the root's old runs once
its process is gone (after a SIGKILL). The host name is in the name because a root may be shared
by several machines (a home on NFS, ``DISTLAB_RUNS`` on a cluster's file system): a pid says
whether a process is alive only on the machine that runs it, so only this host's folders are
pruned. Standard library only, like :mod:`distlab.runfolder`.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
import threading
from multiprocessing import util
from pathlib import Path

PREFIX = "proc-"
ENV_RUNS = "DISTLAB_RUNS"  # (runfolder.ENV: this module imports runfolder only when it needs it)
NAME = re.compile(r"^proc-(?P<host>.+)-(?P<pid>\d+)-[^-]+$")  # mkdtemp's random part has no "-"
_LOCK = threading.RLock()
_DIRS: dict[int, Path] = {}  # pid -> its folder (a forked child makes its own)
_DEPTH = [0]
_SAVED: list = []


def process_dir(root: Path | None = None) -> Path:
    """This process's private temporary folder (created on first use, in the private root)."""
    from .runfolder import check_private_dir, private_root

    pid = os.getpid()
    with _LOCK:
        folder = _DIRS.get(pid)
        if folder is not None and folder.is_dir():
            check_private_dir(folder)
            return folder
        folder = Path(tempfile.mkdtemp(prefix=folder_prefix(pid), dir=private_root(root)))
        _DIRS[pid] = folder
        # removed after multiprocessing's own exit handlers, which remove its pymp-* folder in here
        util.Finalize(None, _remove, args=(folder, pid), exitpriority=-101)
        return folder


HOST_CHARS = 16  # a folder name stays short: the forkserver's socket path inside it must fit 107 bytes


def host_name(name: str | None = None) -> str:
    """This machine's name as it goes into a folder name (no "/", nothing odd, at most
    :data:`HOST_CHARS`: a longer name keeps its start and a hash of the whole, so two long names
    that share a start, ``gpu-node-0017.cluster...`` and ``gpu-node-0018.cluster...``, stay apart)."""
    import hashlib

    name = socket.gethostname() if name is None else name
    clean = re.sub(r"[^A-Za-z0-9._-]", "_", name) or "host"
    if len(clean) <= HOST_CHARS:
        return clean
    return f"{clean[:HOST_CHARS - 9]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def folder_prefix(pid: int, host: str | None = None) -> str:
    """``proc-<host>-<pid>-``: how the private temporary folder of process ``pid`` starts."""
    return f"{PREFIX}{host_name() if host is None else host}-{pid}-"


def owner_of(name: str) -> tuple[str, int] | None:
    """(host, pid) of a private temporary folder's name; None for any other name, including the
    ``proc-<pid>-*`` of distlab before the host went into the name (whose host is unknown)."""
    m = NAME.match(name)
    return (m.group("host"), int(m.group("pid"))) if m else None


def root_of(folder: str) -> Path | None:
    """The runs root a private temporary folder lives in, when ``folder`` is one (of this process,
    or passed down as ``TMPDIR``): runs started while ``tempfile`` points there belong in that root,
    not in a new root nested inside the folder (and removed with it)."""
    path = Path(folder)
    if owner_of(path.name) is None:
        return None
    from .runfolder import _is_private_dir

    return path.parent if _is_private_dir(path) and _is_private_dir(path.parent) else None


def _remove(folder: Path, pid: int) -> None:
    if os.getpid() == pid:  # never a parent's folder from a forked child's exit
        shutil.rmtree(folder, ignore_errors=True)


def child_environment(folder: Path) -> dict[str, str]:
    """The variables every process started from inside :func:`private_tempfiles` gets, so that its
    own temporary files are private too: ``TMPDIR`` (a rank's ``mp.spawn`` writes torch's error
    files, ``torch.compile`` and ``tempfile`` their files, there), and the runs root the folder lies
    in as ``DISTLAB_RUNS`` (without it a child that imports distlab would derive its root from that
    ``TMPDIR`` and nest it in a folder that goes when this process exits)."""
    return {"TMPDIR": str(folder), "DISTLAB_RUNS": str(folder.parent)}


@contextlib.contextmanager
def private_tempfiles():
    """Within this block, ``tempfile`` (so torch's error files) writes to :func:`process_dir`, and
    the processes started inherit :func:`child_environment`.

    ``tempfile.tempdir`` and the environment are process-wide: a launch running in a background
    thread (``join=False``) also sends the kernel's own temporary files there while ranks start
    (they stay private to you). Nested and concurrent blocks restore the values the first one saw.
    """
    folder = process_dir()
    with _LOCK:
        if _DEPTH[0] == 0:
            names = child_environment(folder)
            if os.environ.get(ENV_RUNS):
                del names[ENV_RUNS]  # the user's choice stays (a child resolves it as this process did)
            _SAVED[:] = [tempfile.tempdir, {name: os.environ.get(name) for name in names}]
            tempfile.tempdir = str(folder)
            os.environ.update(names)
        _DEPTH[0] += 1
    try:
        yield folder
    finally:
        with _LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                tempfile.tempdir, saved_env = _SAVED
                _restore_environment(saved_env)


def _restore_environment(saved: dict[str, str | None]) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@contextlib.contextmanager
def multiprocessing_tempdir():
    """``multiprocessing``'s temporary folder (where a forkserver puts its socket) inside
    :func:`process_dir` while the block runs; the kernel's own setting comes back afterwards."""
    from multiprocessing import process

    config = process.current_process()._config
    missing = object()
    saved = config.get("tempdir", missing)
    config["tempdir"] = str(process_dir())
    try:
        yield
    finally:
        if saved is missing:
            config.pop("tempdir", None)
        else:
            config["tempdir"] = saved


def stale_dirs(root: Path, alive=None, host: str | None = None) -> list[Path]:
    """This host's ``proc-<host>-<pid>-*`` folders in ``root`` whose process no longer runs (killed
    without cleanup). Another host's folders are never touched: their pids mean nothing here."""
    alive = pid_alive if alive is None else alive
    host = host_name() if host is None else host
    stale = []
    for entry in os.scandir(root):
        owner = owner_of(entry.name)
        if owner is not None and owner[0] == host and entry.is_dir(follow_symlinks=False) and not alive(owner[1]):
            stale.append(Path(entry.path))
    return stale


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: the folder may still be in use by a pid reuse; keep it
    return True
