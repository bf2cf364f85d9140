"""distlab: run notebook-defined PyTorch distributed code on N ranks, and see it work.

Front ends: :func:`spawn` (``torch.multiprocessing.spawn``'s signature), :func:`launch`
(torchrun style) and :func:`run_script`. Inside workers: :func:`report`, :func:`device`.
"""
from .api import PendingRun, backend, device, launch, run_script, spawn
from .errors import (
    CaptureError,
    DistlabError,
    LaunchArgumentError,
    WorkerFailedError,
    WorkerTimeoutError,
)
from .results import RunResult
from .worker import report

__all__ = [
    "spawn", "launch", "run_script", "device", "backend", "report", "RunResult", "PendingRun",
    "DistlabError", "LaunchArgumentError", "CaptureError", "WorkerFailedError", "WorkerTimeoutError",
]
__version__ = "0.1.0"
