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
pruned. Standard library only, like :mod:`distlab.folders.runfolder`.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import tempfile
import threading
from multiprocessing import util
from pathlib import Path

from distlab.folders import owner, private
from distlab.folders.private import ENV, check_private_dir, folder_prefix

_LOCK = threading.RLock()
_DIRS: dict[int, Path] = {}  # pid -> its folder (a forked child makes its own)
_DEPTH = [0]
_SAVED: list = []


def process_dir(root: Path | None = None) -> Path:
    """This process's private temporary folder (created on first use, in the private root)."""
    pid = os.getpid()
    with _LOCK:
        folder = _DIRS.get(pid)
        if folder is not None and folder.is_dir():
            check_private_dir(folder)
            return folder
        folder = Path(tempfile.mkdtemp(prefix=folder_prefix(pid), dir=private.private_root(root)))
        owner.write(folder)  # which process this is, so that pruning knows when it has gone
        _DIRS[pid] = folder
        # removed after multiprocessing's own exit handlers, which remove its pymp-* folder in here
        util.Finalize(None, _remove, args=(folder, pid), exitpriority=-101)
        finish_exit_handlers_despite_sigterm()
        return folder


def work_folder(prefix: str = "work-") -> Path:
    """A fresh folder for a notebook's own files (a script it writes, its checkpoints) that goes
    when the kernel ends.

    ``WORK = distlab.work_folder("ddp-train-")`` makes it with ``mkdtemp`` (mode 0700) inside this
    process's own folder under distlab's private per-user root, so another user can neither read it
    nor plant a file in it, and ranks on this machine and on :class:`distlab.Nodes` can use it. It is
    removed with that folder when the kernel ends; after a SIGKILL, the next kernel's start removes
    it. Nothing is left that the learner did not ask to keep: copy out what should stay.

    Returns the folder's :class:`pathlib.Path`.
    """
    return Path(tempfile.mkdtemp(prefix=prefix, dir=process_dir()))


def finish_exit_handlers_despite_sigterm() -> None:
    """Once this process is exiting, let a SIGTERM wait until the exit handlers registered so far
    (this folder's removal, closing :class:`distlab.Nodes`) have run. jupyter_client SIGTERMs a
    kernel 2.5 s after it asked it to shut down, and a loaded machine can take that long to get to
    them; its SIGKILL, 2.5 s later, still ends the kernel. Call it again after registering another
    handler: the last one registered runs first."""
    atexit.unregister(_ignore_sigterm)
    atexit.register(_ignore_sigterm)


def _ignore_sigterm() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


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
            if os.environ.get(ENV):
                del names[ENV]  # the user's choice stays (a child resolves it as this process did)
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


