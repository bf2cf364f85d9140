"""Pure launch configuration: argument checks and backend choice.

Nothing here starts a process or opens a socket, so every rule is unit-testable and
bad arguments fail before any worker exists.
"""
from __future__ import annotations

import functools
import inspect
import numbers

from .errors import LaunchArgumentError

BACKENDS = ("auto", "gloo", "nccl")


def cuda_device_count() -> int:
    """CUDA devices visible here; 0 when torch has no CUDA (never initialises CUDA needlessly)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose_backend(requested: str, world_size: int, gpus: int) -> str:
    """`auto` means NCCL when every rank can own a GPU, gloo otherwise."""
    check_backend(requested, world_size, gpus)
    if requested == "auto":
        return "nccl" if gpus >= world_size else "gloo"
    return requested


def check_backend(requested: str, world_size: int, gpus: int) -> None:
    if requested not in BACKENDS:
        raise LaunchArgumentError("backend", requested, f"unknown backend; choose one of {BACKENDS}")
    if requested == "nccl" and gpus < world_size:
        raise LaunchArgumentError(
            "backend", requested,
            f"NCCL needs one GPU per rank but {world_size} ranks and {gpus} GPU(s) are available",
            'Use backend="gloo" (or "auto"), or fewer ranks.',
        )


def check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise LaunchArgumentError(name, value, "must be a positive integer", "For example nprocs=2.")
    return int(value)


def check_function(fn) -> None:
    """Workers re-create `fn` from source, so it must be a plain top-level Python function,
    possibly decorated (with ``functools.wraps``) or bound with ``functools.partial``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.ismethod(fn):
        raise LaunchArgumentError("fn", fn, "is a bound method", "Pass a top-level function instead.")
    if hasattr(fn, "__wrapped__"):
        fn = inspect.unwrap(fn)
    if not inspect.isfunction(fn):
        raise LaunchArgumentError(
            "fn", fn, f"must be a Python function, not {type(fn).__name__}",
            "Define it with `def` in a cell or a module.",
        )


def check_args(args) -> tuple:
    if not isinstance(args, tuple):
        raise LaunchArgumentError("args", args, f"must be a tuple, not {type(args).__name__}",
                                  "Write args=(2,) for one argument.")
    return args


def check_timeout(timeout) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or timeout <= 0:
        raise LaunchArgumentError("timeout", timeout, "must be a positive number of seconds or None")
    return float(timeout)
