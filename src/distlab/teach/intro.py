"""Helpers for the introduction: collect what child processes write to a file descriptor."""
import contextlib
import os
import tempfile

from distlab.folders import privtmp
from distlab.forkserver import prestart


@contextlib.contextmanager
def child_output(fd: int):
    """Collect what child processes write to file descriptor ``fd`` (1: stdout, 2: stderr) into ``lines``.

    Children started with ``mp.spawn`` inherit the kernel's descriptors, so what they print goes
    wherever the kernel's own fd points: some frontends forward it into the cell, some only to the
    terminal that started Jupyter. Pointing ``fd`` at a file meanwhile makes it something a cell can
    print and assert, the same in every frontend.

    Each child's line reaches the file whole, also where ``PYTHONUNBUFFERED`` is set
    (:func:`buffered_children`). Inside the block, temporary files (torch's
    ``pytorch-errorfile-*.pickle``, which ``mp.spawn`` later unpickles) go to this process's private
    folder, and the children get it as ``TMPDIR`` (:mod:`distlab.folders.privtmp`): the shared
    ``/tmp`` would let another user plant that file. The block first waits for distlab's background
    start of its server (begun by ``import distlab``), so that nothing else of the kernel starts
    processes while ``fd`` points at the file.
    """
    lines: list[str] = []
    prestart.wait()
    with privtmp.private_tempfiles(), buffered_children(), tempfile.TemporaryFile(mode="w+") as sink:
        saved = os.dup(fd)
        os.dup2(sink.fileno(), fd)
        try:
            yield lines
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().splitlines())


@contextlib.contextmanager
def buffered_children():
    """Start children without ``PYTHONUNBUFFERED`` (some containers and CI machines set it): unbuffered,
    ``print`` writes its text and its newline in two writes, and two ranks printing at once then leave
    ``"hello from rank 1 of 2hello from rank 0 of 2"`` in the file. Buffered, each child writes its
    line in one write (stdout when it exits, stderr at each newline). The kernel's setting is back
    after the block."""
    saved = os.environ.pop("PYTHONUNBUFFERED", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["PYTHONUNBUFFERED"] = saved


def child_stderr():
    """:func:`child_output` for stderr, where ``mp.spawn``'s children report an unpickling error."""
    return child_output(2)


def child_stdout():
    """:func:`child_output` for stdout, where the children's ``print`` goes."""
    return child_output(1)
