"""What distlab's forkserver process imports before it forks any rank (``distlab.forkserver.client.PRELOAD``).

Imported only in that server, never in a kernel or a rank. It ties the server to the kernel,
imports what every rank needs (torch, ``torch.distributed``, torchelastic's worker wrapper,
distlab's worker runtime, and ``torch._dynamo``, which DDP's constructor reads), and never
touches CUDA: a rank forked from here may use a GPU.

The server must not outlive the kernel that started it: on Linux the kernel sends it SIGKILL
when the kernel dies (``PR_SET_PDEATHSIG``), even a SIGKILLed kernel. Everywhere else (and as a
second line) the server leaves when the kernel's end of its "alive" pipe closes, which is why
every rank closes its own copy of that pipe (``distlab.forkserver.rank``). A rank's own parent is
the server, so a dead server takes its ranks with it (``distlab.worker.die_with_parent``).

Only your own processes may ask it for a fork: the server's loop (``distlab.forkserver.server``)
checks every connection's peer uid (``distlab.forkserver.peercred``) before it reads anything from it.
"""
import gc
import signal
import sys

try:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):  # not Linux
    pass

import multiprocessing.queues  # noqa: E402,F401  (what unpickling a rank's process object needs)
import multiprocessing.synchronize  # noqa: E402,F401
import runpy  # noqa: E402,F401

import torch  # noqa: E402,F401

# DistributedDataParallel's constructor reads torch._dynamo.utils.get_optimize_ddp_mode(), and
# torch imports torch._dynamo lazily: ~810 modules (dynamo, sympy, parts of inductor and onnx).
# Imported here once, not by each rank's first DDP(...), which took 1.5 s here (1-6 s on busy
# cores; other examples take 0.05-0.2 s) and now ~10 ms; a rank's USS after a DDP step 109 -> 14 MB.
# The server's preload takes ~1.4 s longer (1.5 -> 2.9 s, in the background) and 66 MB more RSS,
# shared with its ranks; a plain launch is as fast as before (bench/ddp_first.py, launch_latency.py).
# No CUDA: torch.cuda is not initialised and no thread is started (tests/test_forkserver.py, which
# also uses CUDA in a forked child; checked on a CPU build only: with triton installed it imports triton).
import torch._dynamo  # noqa: E402,F401
import torch.distributed  # noqa: E402,F401
import torch.distributed.elastic.multiprocessing  # noqa: E402,F401

# A node's agent is forked from here too (distlab.launch.agent.run_forked, #46) and runs torchelastic's
# launcher with the c10d rendezvous: imported once here, not by each agent of each launch (18 ms each).
import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend  # noqa: E402,F401
import torch.distributed.elastic.rendezvous.dynamic_rendezvous  # noqa: E402,F401
import torch.distributed.launcher.api  # noqa: E402,F401
import torch.utils.serialization  # noqa: E402,F401  (torch.save imports it: every rank saves its return value)

import distlab.forkserver.rank  # noqa: E402,F401
import distlab.rendezvous.prompt_store  # noqa: E402
import distlab.worker  # noqa: E402

distlab.worker.loopback_interface()  # looked up (and cached) once, not by every rank
distlab.rendezvous.prompt_store.store_class()  # its class made once

try:  # numpy loads numpy.random lazily: imported here once, not in each rank that reseeds it
    import numpy.random  # noqa: F401
except ImportError:
    pass
import distlab.forkserver.client  # noqa: E402,F401

# Objects made so far live as long as the server: keep the garbage collector of every rank off
# them, or its first full collection writes to (and so copies) most of the server's memory.
gc.collect()
gc.freeze()

HUGE_PAGE = 2 << 20
MADV_COLLAPSE = 25  # Linux >= 6.1


def _anonymous_regions():
    """Writable private anonymous mappings (the malloc heap, Python's arenas) of this process."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if fields[1].startswith("rw") and fields[1].endswith("p") and fields[5:] in ([], ["[heap]"]):
                yield start, end


def collapse_into_huge_pages() -> int:
    """Back the server's heap with 2 MiB pages: each fork then copies ~500 times fewer page-table
    entries (measured here: a fork 26 -> 6 ms, a rank's exit 52 -> 31 ms). Returns the bytes
    collapsed; 0 where the kernel cannot (not Linux, older than 6.1, THP disabled)."""
    import ctypes

    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        regions = list(_anonymous_regions())
    except (OSError, AttributeError):
        return 0
    done = 0
    for start, end in regions:
        start, end = -(-start // HUGE_PAGE) * HUGE_PAGE, end // HUGE_PAGE * HUGE_PAGE
        if end > start and madvise(start, end - start, MADV_COLLAPSE) == 0:
            done += end - start
    return done


if sys.platform.startswith("linux"):
    collapse_into_huge_pages()

