"""distlab: run notebook-defined PyTorch distributed code on N ranks, and see it work.

Front ends: :func:`spawn` (``torch.multiprocessing.spawn``'s signature), :func:`launch`
(torchrun style) and :func:`run_script`. Inside workers: :func:`report`, :func:`device`.
Warm ranks kept between cells: :class:`Ranks`, and the ``%%ranks`` magic (``%load_ext distlab``).
"""
from .api import PendingRun, backend, device, launch, run_script, spawn
from .errors import (
    CaptureError,
    DistlabError,
    LaunchArgumentError,
    WorkerFailedError,
    WorkerTimeoutError,
)
from .ranks import Ranks
from .results import RunResult
from .worker import report

__all__ = [
    "spawn", "launch", "run_script", "device", "backend", "report", "RunResult", "PendingRun", "Ranks",
    "DistlabError", "LaunchArgumentError", "CaptureError", "WorkerFailedError", "WorkerTimeoutError",
]
__version__ = "0.1.0"

from . import compile_cache as _compile_cache  # noqa: E402
from . import prestart as _prestart  # noqa: E402

_compile_cache.use_private_cache()  # torch.compile's generated code: never in a folder another user made

_prestart.maybe_start()  # in a notebook: the forkserver starts now, in the background (DISTLAB_PRESTART=0: not)


def load_ipython_extension(ipython) -> None:
    """``%load_ext distlab``: adds the ``%%ranks`` cell magic (see :mod:`distlab.magic`)."""
    from .magic import register

    register(ipython)
