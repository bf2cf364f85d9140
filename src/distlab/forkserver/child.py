"""A child forked from distlab's forkserver made into a rank's process: what both kinds of forked
rank do first, a rank of a launch (:mod:`distlab.forkserver.rank`) and a warm rank
(:mod:`distlab.warm.forked`).

The server's process is not a rank's: its environment, umask, output, thread count and random
state are the server's. Each step here makes one of them what a fresh ``python`` started by the
kernel would have had. Runs in forked children only (imports torch, which the server preloaded).
"""
from __future__ import annotations

import os
import sys
import tempfile
from multiprocessing import forkserver as mp_forkserver

import torch


def replace_environment(env: dict) -> None:
    """Make ``os.environ`` equal to ``env``, changing only what differs (each change is a C
    ``setenv`` call: the rank's environment is mostly the server's already)."""
    for name in [n for n in os.environ if n not in env]:
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value
    tempfile.tempdir = None  # derived again from this TMPDIR (the server's cached its own)


def close_alive_pipe() -> None:
    """The server exits when every copy of its "alive" pipe is closed; the kernel's copy must be
    the last one, so that the server (and then this rank) goes when the kernel does."""
    server = mp_forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None


def write_output_to(stdout: str, stderr: str) -> None:
    """Point fds 1 and 2 at the rank's log files and make Python's streams unbuffered, like
    ``python -u``: the launcher streams the logs live. (torchelastic does not redirect a forked
    rank's output on macOS, so distlab does it everywhere.)"""
    for fd, path in ((1, stdout), (2, stderr)):
        if path:
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
    sys.stdout = _unbuffered(1, sys.stdout, "strict")
    sys.stderr = _unbuffered(2, sys.stderr, "backslashreplace")


def _unbuffered(fd: int, old, errors: str):
    import io

    encoding = getattr(old, "encoding", None) or "utf-8"
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=encoding, errors=errors,
                            write_through=True)


def set_thread_count(env: dict) -> None:
    """OpenMP read OMP_NUM_THREADS when the *server* loaded torch; apply the rank's value now.

    The value is the one ``worker._install`` settles on (torchrun's rule: one thread per rank
    when several ranks share the machine, unless the user chose).
    """
    wanted = env.get("OMP_NUM_THREADS") or ("1" if int(env.get("LOCAL_WORLD_SIZE", "1")) > 1 else "")
    if wanted.isdigit() and int(wanted) > 0:
        torch.set_num_threads(int(wanted))


def write_both_to(path: str) -> None:
    """fds 1 and 2 both to ``path`` (one open file: their lines interleave in order), unbuffered."""
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for fd in (1, 2):
        os.dup2(target, fd)
    os.close(target)
    sys.stdout = _unbuffered(1, sys.stdout, "strict")
    sys.stderr = _unbuffered(2, sys.stderr, "backslashreplace")

_RESEEDED_IN: int | None = None  # the pid that last ran fresh_random_state


def fresh_random_state() -> None:
    """The random state a fresh interpreter would start with. torch seeds its generator from the
    OS when it is imported, and NumPy its global one; a forked rank would inherit the server's,
    so every rank (and every launch) would draw the same "random" numbers. Python's ``random``
    reseeds itself after a fork. CUDA generators are seeded lazily, without touching the GPU.
    Only a ``numpy.random`` the server imported is reseeded (``distlab.forkserver.preload`` does): touching
    ``numpy.random`` here would import it, which costs a forked rank 10-25 ms. A torch built
    without any accelerator (the CPU wheel) reseeds only its CPU generator: queueing lazy seeds
    for devices it cannot have cost a rank ~2 ms of stack formatting."""
    import torch

    if accelerator_built():
        torch.seed()  # every generator from one fresh seed
    else:
        torch.default_generator.seed()
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()
    global _RESEEDED_IN
    _RESEEDED_IN = os.getpid()


def accelerator_built() -> bool:
    """Whether this torch was built for any accelerator (asked without initialising one: on a
    CUDA build, ``torch.cuda.is_available()`` would start the CUDA driver in every rank)."""
    try:
        return bool(torch.backends.cuda.is_built() or torch.backends.mps.is_built() or torch.xpu._is_compiled()
                    or torch.mtia.is_available())
    except Exception:  # an API moved: behave as torch.seed() does
        return True


def reseed_once() -> None:
    """:func:`fresh_random_state`, unless this process drew it already (a spare, while it waited)."""
    if _RESEEDED_IN != os.getpid():
        fresh_random_state()
