"""distlab: run notebook-defined PyTorch distributed code on N ranks, and see it work.

Front ends: :func:`spawn` (``torch.multiprocessing.spawn``'s signature), :func:`launch`
(torchrun style) and :func:`run_script`. Inside workers: :func:`report`, :func:`device`.
Warm ranks kept between cells: :class:`Ranks`, and the ``%%ranks`` magic (``%load_ext distlab``).
Several machines on one: :class:`Nodes` (network namespaces joined by rate-limited links).
A notebook's own files (a script, checkpoints): :func:`work_folder`, private, removed when the kernel ends.
Errors a notebook catches: :class:`DistlabError` and its kinds, launch (``WorkerFailedError``, ...)
and warm ranks (``RankError``, ``RanksTimeoutError``, ``RanksStoppedError``).

The engine below is one folder per mechanism (``capture``, ``folders``, ``rendezvous``, ``view``,
``forkserver``, ``launch``, ``warm``, ``nodes``); each folder's ``__init__`` says what it does and what it may
import, and ``pyproject.toml``'s import-linter contracts hold that order.
"""
from distlab.api import PendingRun, launch, run_script, spawn
from distlab.config import backend, device
from distlab.errors import (
    CaptureError,
    DistlabError,
    LaunchArgumentError,
    NodesError,
    WorkerFailedError,
    WorkerTimeoutError,
)
from distlab.folders.privtmp import work_folder
from distlab.nodes.cluster import Nodes
from distlab.results import RunResult
from distlab.warm.errors import RankError, RanksStoppedError, RanksTimeoutError
from distlab.warm.ranks import Ranks
from distlab.worker import report

__all__ = [
    "spawn", "launch", "run_script", "device", "backend", "report", "RunResult", "PendingRun", "Ranks", "Nodes",
    "DistlabError", "LaunchArgumentError", "CaptureError", "WorkerFailedError", "WorkerTimeoutError",
    "RankError", "RanksTimeoutError", "RanksStoppedError", "NodesError", "work_folder",
]
__version__ = "0.1.0"

from distlab.folders import compile_cache as _compile_cache  # noqa: E402
from distlab.forkserver import prestart as _prestart  # noqa: E402

_compile_cache.use_private_cache()  # torch.compile's generated code: never in a folder another user made

_prestart.maybe_start()  # in a notebook: the forkserver starts now, in the background (DISTLAB_PRESTART=0: not)


def __getattr__(name: str):
    """``distlab.check(script)``: the checker lives a layer above this face (it uses the launcher),
    so it is imported on first use; the package :mod:`distlab.check` is itself callable."""
    if name == "check":
        import importlib

        return importlib.import_module("distlab.check")
    raise AttributeError(f"module 'distlab' has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    """``%load_ext distlab``: adds the ``%%ranks`` cell magic (see :mod:`distlab.warm.magic`).

    Re-running that first cell prints nothing: distlab leaves IPython's list of loaded extensions
    after each cell, so a second ``%load_ext distlab`` loads it again (registering the magic
    twice is harmless) instead of printing IPython's "already loaded" note."""
    from distlab.warm.magic import register

    register(ipython)
    if _forget_loaded not in ipython.events.callbacks["post_run_cell"]:
        ipython.events.register("post_run_cell", _forget_loaded)


def _forget_loaded(*_result) -> None:
    from IPython import get_ipython

    shell = get_ipython()
    if shell is not None:
        shell.extension_manager.loaded.discard(__name__)
