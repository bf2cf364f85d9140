"""What distlab's forkserver process imports before it forks any rank (``forkserver.PRELOAD``).

Imported only in that server, never in a kernel or a rank. It ties the server to the kernel,
imports what every rank needs (torch, ``torch.distributed``, torchelastic's worker wrapper and
distlab's worker runtime), and never touches CUDA: a rank forked from here may use a GPU.

The server must not outlive the kernel that started it: on Linux the kernel sends it SIGKILL
when the kernel dies (``PR_SET_PDEATHSIG``), even a SIGKILLed kernel. Everywhere else (and as a
second line) the server leaves when the kernel's end of its "alive" pipe closes, which is why
every rank closes its own copy of that pipe (``distlab._forkrank``). A rank's own parent is
the server, so a dead server takes its ranks with it (``distlab.worker._die_with_parent``).
"""
import gc
import signal

try:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):  # not Linux
    pass

import multiprocessing.queues  # noqa: E402,F401  (what unpickling a rank's process object needs)
import multiprocessing.synchronize  # noqa: E402,F401
import runpy  # noqa: E402,F401

import torch  # noqa: E402,F401
import torch.distributed  # noqa: E402,F401
import torch.distributed.elastic.multiprocessing  # noqa: E402,F401

import distlab._forkrank  # noqa: E402,F401
import distlab.forkserver  # noqa: E402,F401

# Objects made so far live as long as the server: keep the garbage collector of every rank off
# them, or its first full collection writes to (and so copies) most of the server's memory.
gc.collect()
gc.freeze()
