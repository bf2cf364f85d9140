"""Pure launch configuration: argument checks, backend choice and the rank environment.

Nothing here starts a process or opens a socket, so every rule is unit-testable and
bad arguments fail before any worker exists.
"""
from __future__ import annotations

import inspect
import numbers
import os
from dataclasses import dataclass, field

from .errors import LaunchArgumentError

BACKENDS = ("auto", "gloo", "nccl")
LOOPBACK = "127.0.0.1"


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
    """Workers re-create `fn` from source, so it must be a plain top-level Python function."""
    if inspect.ismethod(fn):
        raise LaunchArgumentError("fn", fn, "is a bound method", "Pass a top-level function instead.")
    if not inspect.isfunction(fn):
        raise LaunchArgumentError(
            "fn", fn, f"must be a Python function, not {type(fn).__name__}",
            "Define it with `def` in a cell or a module.",
        )


def check_args(args) -> tuple:
    if not isinstance(args, tuple):
        raise LaunchArgumentError("args", args, f"must be a tuple, not {type(args).__name__}", "Write args=(2,) for one argument.")
    return args


def check_timeout(timeout) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or timeout <= 0:
        raise LaunchArgumentError("timeout", timeout, "must be a positive number of seconds or None")
    return float(timeout)


@dataclass(frozen=True)
class RankEnv:
    """The environment every worker starts with (torchrun's names), before user code runs."""

    run_id: str
    run_dir: str
    master_port: int
    world_size: int
    parent_pid: int
    master_addr: str = LOOPBACK
    extra: dict = field(default_factory=dict)

    def common(self) -> dict[str, str]:
        """Variables shared by all ranks; the engine adds RANK/LOCAL_RANK per worker."""
        env = {
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "DISTLAB_MASTER_PORT": str(self.master_port),
            "DISTLAB_RUN_ID": self.run_id,
            "DISTLAB_RUN_DIR": self.run_dir,
            "DISTLAB_PARENT_PID": str(self.parent_pid),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        }
        env.update({k: str(v) for k, v in self.extra.items()})
        return env
