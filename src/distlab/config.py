"""Launch configuration: argument checks, backend and device choice.

Nothing here starts a process or opens a socket, so every rule is unit-testable and
bad arguments fail before any worker exists.
"""
from __future__ import annotations

import functools
import inspect
import numbers
import os
import re

from distlab.errors import LaunchArgumentError

BACKENDS = ("auto", "gloo", "nccl")


def cuda_device_count() -> int:
    """CUDA devices visible here; 0 when torch has no CUDA (never initialises CUDA needlessly)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


DEVICE_MODES = ("auto", "cpu", "cuda")
DEVICE_VAR = "DISTLAB_DEVICE"


def device_mode(environ=None) -> str:
    """What ``DISTLAB_DEVICE`` asks for: ``auto`` (unset: a GPU per rank, else the CPU), ``cpu``, or
    ``cuda`` (every rank on a GPU through gloo, which takes CUDA tensors: the book's GPU path on one GPU)."""
    value = (os.environ if environ is None else environ).get(DEVICE_VAR, "").strip().lower() or "auto"
    if value not in DEVICE_MODES:
        raise LaunchArgumentError(DEVICE_VAR, value, f"unknown device mode; choose one of {DEVICE_MODES}",
                                  f"Unset {DEVICE_VAR}, or set it to cpu or cuda.")
    return value


def _check_cuda_mode(mode: str, gpus: int) -> None:
    if mode == "cuda" and gpus < 1:
        raise LaunchArgumentError(DEVICE_VAR, mode, "asks for CUDA but no CUDA device is visible here",
                                  f"Unset {DEVICE_VAR} to run on the CPU, or check CUDA_VISIBLE_DEVICES.")


def check_device_mode(count_gpus=None) -> str:
    """``DISTLAB_DEVICE``, checked in the kernel before any rank starts (GPUs counted only for ``cuda``)."""
    mode = device_mode()
    if mode == "cuda":
        _check_cuda_mode(mode, (count_gpus or cuda_device_count)())
    return mode


def choose_backend(requested: str, world_size: int, gpus: int, mode: str | None = None) -> str:
    """`auto` means NCCL when every rank can own a GPU, gloo otherwise; ``DISTLAB_DEVICE=cpu`` or
    ``cuda`` (``mode``, read from the environment when None) makes `auto` gloo whatever the GPUs."""
    check_backend(requested, world_size, gpus)
    mode = device_mode() if mode is None else mode
    _check_cuda_mode(mode, gpus)
    if requested == "auto":
        return "nccl" if mode == "auto" and gpus >= world_size else "gloo"
    return requested


def choose_device(local_rank: int, world_size: int, gpus: int, mode: str | None = None) -> str:
    """The device a rank computes on, as a string: ``cuda:<local rank>`` when every rank owns a GPU
    (NCCL), ``cuda:<local rank mod gpus>`` under ``DISTLAB_DEVICE=cuda`` (one GPU: all on ``cuda:0``),
    else ``cpu``. Pure: ``gpus`` is passed in, so the rule is testable on any machine."""
    mode = device_mode() if mode is None else mode
    _check_cuda_mode(mode, gpus)
    if mode == "cuda":
        return f"cuda:{local_rank % gpus}"
    if mode == "auto" and gpus >= max(world_size, local_rank + 1):
        return f"cuda:{local_rank}"
    return "cpu"


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


def check_non_negative_int(name: str, value, example: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise LaunchArgumentError(name, value, "must be a non-negative integer", f"For example {example}.")
    return int(value)


def check_max_restarts(value) -> int:
    return check_non_negative_int("max_restarts", value, "max_restarts=1")


VIEWS = ("auto", "text", "live", "widgets", "none", None)  # "widgets": the live view's earlier name
VIEW_METHODS = ("line", "metric", "close")


def check_view(view):
    """A view name, or an object the engine can call: checked now, not after the workers started."""
    if view is None or isinstance(view, str):
        if view not in VIEWS:
            raise LaunchArgumentError("view", view, f"unknown view; choose one of {VIEWS}",
                                      "Or pass an object with line(rank, text), metric(rank, row) and close().")
        return view
    missing = [m for m in VIEW_METHODS if not callable(getattr(view, m, None))]
    if missing:
        raise LaunchArgumentError("view", view, f"has no {', '.join(m + '()' for m in missing)} method",
                                  "A view object needs line(rank, text), metric(rank, row) and close().")
    return view


def check_nodes(nodes):
    """``nodes=``: an open :class:`distlab.Nodes` (anything with ``n``, ``command`` and ``closed``), or None."""
    if nodes is None:
        return None
    if not all(hasattr(nodes, name) for name in ("n", "command", "closed")):
        raise LaunchArgumentError("nodes", nodes, f"must be a distlab.Nodes, not {type(nodes).__name__}",
                                  "Make them with nodes = distlab.Nodes(2), then pass nodes=nodes.")
    if nodes.closed:
        raise LaunchArgumentError("nodes", nodes, "these nodes are closed",
                                  "Make new ones with distlab.Nodes(...).")
    return nodes


# run_script passes a node_rank on as torchrun passes --node-rank; only torch's static rendezvous reads it
NODE_RANK_IGNORED = ("node_rank={node_rank}: the c10d rendezvous ignores it, as it ignores torchrun's --node-rank: "
                     "torch numbers the machines itself, by sorting them (chapter 7). Leave node_rank out.")


def check_node_rank(node_rank, nnodes: int) -> int:
    node_rank = check_non_negative_int("node_rank", node_rank, "node_rank=0 on the first machine")
    if node_rank >= nnodes:
        raise LaunchArgumentError("node_rank", node_rank, f"must be below nnodes={nnodes}",
                                  "Number the machines 0 to nnodes - 1, one number each.")
    return node_rank


ENDPOINT = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+)(:(?P<port>\d+))?")


def check_rdzv_endpoint(endpoint, nnodes: int) -> str:
    """``HOST`` or ``HOST:PORT`` (``[IPv6]:PORT``), as torchrun takes it; needed when nnodes > 1."""
    if not isinstance(endpoint, str):
        raise LaunchArgumentError("rdzv_endpoint", endpoint, f"must be a string, not {type(endpoint).__name__}",
                                  'For example "10.0.0.1:29400".')
    if nnodes > 1 and not endpoint:
        raise LaunchArgumentError("rdzv_endpoint", endpoint, "is needed when nnodes > 1",
                                  'For example "127.0.0.1:29400".')
    match = ENDPOINT.fullmatch(endpoint)
    if endpoint and (match is None or (match["port"] is not None and not 0 < int(match["port"]) < 65536)):
        raise LaunchArgumentError("rdzv_endpoint", endpoint, "must be HOST or HOST:PORT with a port from 1 to 65535",
                                  'For example "10.0.0.1:29400" (node 0\'s address).')
    return endpoint


def check_script_args(args) -> list[str]:
    """A script's command-line arguments: a list or tuple of strings, numbers or paths."""
    if isinstance(args, (str, bytes)) or not isinstance(args, (list, tuple)):
        raise LaunchArgumentError("args", args, f"must be a list of command-line arguments, not {type(args).__name__}",
                                  'For example args=["--epochs", 2].')
    bad = [a for a in args if isinstance(a, bool) or not isinstance(a, (str, numbers.Real, os.PathLike))]
    if bad:
        raise LaunchArgumentError("args", args, f"{bad[0]!r} is not a string, number or path",
                                  "Each item becomes one command-line word.")
    return [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args]



def device(rank: int | None = None, world_size: int | None = None):
    """``cuda:<local rank>`` when every rank can own a GPU (the NCCL case), else ``cpu``;
    ``DISTLAB_DEVICE=cuda`` puts every rank on a GPU (all on ``cuda:0`` with one GPU, through gloo),
    ``DISTLAB_DEVICE=cpu`` on the CPU.

    In a worker the defaults come from torchrun's variables; in the kernel pass ``world_size`` (the
    ranks you will launch): without it the kernel counts as a world of one, which a single GPU fits."""
    import torch

    local = int(os.environ.get("LOCAL_RANK", "0")) if rank is None else int(rank)
    if world_size is None:
        world_size = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", local + 1)))
    gpus = cuda_device_count()
    problem = gpu_binding_problem(local, world_size, gpus, os.environ)
    if problem:
        raise LaunchArgumentError("device", f"{gpus} GPU(s)", problem[0], problem[1])
    return torch.device(choose_device(local, world_size, gpus))


def gpu_binding_problem(local_rank: int, local_world: int, gpus: int, environ) -> tuple[str, str] | None:
    """(what is wrong, what to do) when a Slurm task sees some GPUs but fewer than its node's ranks, which
    ``--gpus-per-task`` / ``--gpu-bind`` do (each task sees only its own GPU, always ``cuda:0``): the
    "auto" rule would put every rank on the CPU, silently. None otherwise. Pure."""
    if not 0 < gpus < local_world or "SLURM_JOB_ID" not in environ or device_mode(environ) != "auto":
        return None
    seen = environ.get("CUDA_VISIBLE_DEVICES", "?")
    return (f"local rank {local_rank} of the {local_world} ranks on this node sees {gpus} GPU(s) "
            f"(CUDA_VISIBLE_DEVICES={seen}): it would train on the CPU",
            f"Ask Slurm for --gpus-per-node={local_world} with no per-task GPU binding (torchrun then gives "
            "each rank cuda:<local rank>), or, bound one GPU per task, use cuda:0 in every rank "
            "(DISTLAB_DEVICE=cuda).")


def backend(world_size: int | None = None) -> str:
    """The backend ``auto`` picks here: NCCL with one GPU per rank on this machine, else gloo
    (always gloo under ``DISTLAB_DEVICE=cpu`` or ``cuda``).

    Inside a multi-node run only this node's ranks (LOCAL_WORLD_SIZE) need a GPU here."""
    local = os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))
    world = int(local) if world_size is None else world_size
    return choose_backend("auto", world, cuda_device_count())
