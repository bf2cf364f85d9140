"""The torch features distlab's launcher relies on, checked once, with an error that says so.

Each is public torch API that appeared in a known release (dates of the upstream changes):

* ``LaunchConfig.logs_specs`` and ``LogsSpecs``/``LogsDest`` (torch 2.3): distlab's log layout;
* ``TCPStore(master_listen_fd=...)`` on the default libuv backend (torch 2.8, pytorch#150215):
  the store listens on a socket distlab bound to 127.0.0.1;
* ``RendezvousStoreInfo`` (torch 2.4): how a rendezvous handler tells workers where the store is;
* ``LaunchConfig.signals_to_handle`` (torch 2.9, pytorch#160690): the agent leaves the kernel's
  SIGHUP/SIGQUIT/SIGUSR1 handlers alone.

Hence ``torch>=2.9`` in ``pyproject.toml``. The check below looks for the features themselves,
so a build that has them passes whatever its version string says.

The chapters use three features newer than that floor (:data:`FEATURE_SINCE`); on an older torch
(Colab's 2.11, say) a chapter shows what that torch does instead and goes on:

* DDP's ``forward_sync_buffers`` (torch 2.13, pytorch#178054), the new name of ``broadcast_buffers``:
  :func:`ddp_buffer_sync_arg` reads DDP's signature;
* gloo's list ``all_to_all`` (torch 2.12, pytorch#165435; 2.11's gloo raises "Backend gloo does not
  support alltoall"): a backend's support is measured by running the collective (chapter 5), and
  :func:`is_all_to_all_refusal` tells that refusal from a real failure;
* pipeline schedules with two neighbouring stages on one rank (``ScheduleZBVZeroBubble``'s V, chapter 12):
  up to 2.11 the schedule's first step sends a warm-up message from every stage to its neighbours
  (``_get_init_p2p_neighbors_ops``), so a rank sends to itself, which gloo cannot ("Pair is not
  connected"); 2.12's warm-up (``_warmup_forward_vote``) passes it inside the rank. A fix inside a
  schedule has no public name to look for, so this one goes by the release.

The three releases were read in the released wheels themselves, not guessed: ``forward_sync_buffers``
first appears in 2.13.0's ``torch/nn/parallel/distributed.py`` (absent from 2.9.0 to 2.12.1), and
``ProcessGroupGloo::alltoall`` first among 2.12.0's ``libtorch_cpu.so`` symbols (absent from 2.11.0),
and the warm-up first in 2.12.0's ``torch/distributed/pipelining/schedules.py``.
"""
from __future__ import annotations

from distlab.errors import TORCH_TOO_OLD, DistlabError

TORCH_FLOOR = "2.9"
_checked = False

#: The torch release that brought each feature a chapter uses beyond the floor (see above).
FEATURE_SINCE = {
    "DDP(forward_sync_buffers=...)": (2, 13),
    "gloo all_to_all": (2, 12),
    "pipeline stages side by side on one rank": (2, 12),
}


def launch_config_fields() -> set[str]:
    from dataclasses import fields

    from torch.distributed.launcher.api import LaunchConfig

    return {f.name for f in fields(LaunchConfig)}


def missing_features(config_fields: set[str], store_doc: str, modules: dict[str, set[str]]) -> list[str]:
    """What of distlab's needs this torch lacks (pure: the caller gathers the facts)."""
    missing = [f"LaunchConfig.{name}" for name in ("logs_specs", "signals_to_handle") if name not in config_fields]
    if "master_listen_fd" not in store_doc:
        missing.append("TCPStore(master_listen_fd=...)")
    for module, names in modules.items():
        missing.extend(f"{module}.{name}" for name in sorted(names))
    return missing


def _absent(module: str, names: tuple[str, ...]) -> set[str]:
    import importlib

    try:
        mod = importlib.import_module(module)
    except ImportError:
        return set(names)
    return {n for n in names if not hasattr(mod, n)}


def check_torch() -> None:
    """Raise a DistlabError naming every missing feature; cheap after the first call."""
    global _checked
    if _checked:
        return
    import torch
    from torch.distributed import TCPStore

    modules = {
        "torch.distributed.elastic.multiprocessing": _absent(
            "torch.distributed.elastic.multiprocessing", ("LogsSpecs", "LogsDest", "SignalException")),
        "torch.distributed.elastic.rendezvous": _absent(
            "torch.distributed.elastic.rendezvous", ("RendezvousHandler", "RendezvousInfo", "RendezvousStoreInfo")),
    }
    missing = missing_features(launch_config_fields(), TCPStore.__init__.__doc__ or "",
                               {k: v for k, v in modules.items() if v})
    if missing:
        raise DistlabError(TORCH_TOO_OLD.format(version=torch.__version__, missing=", ".join(missing),
                                                floor=TORCH_FLOOR))
    _checked = True


def release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string: ``"2.11.0+cu128"`` and ``"2.16.0.dev20261201"``
    alike; a string that does not start with two numbers is an error that says so."""
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ValueError(f"not a torch version: {version!r} (expected e.g. '2.13.0')") from None


def has_since(feature: str, version: str) -> bool:
    """Whether torch ``version`` is at least the release that brought ``feature`` (a key of
    :data:`FEATURE_SINCE`): what the release notes promise, for a chapter to check its run against."""
    return release(version) >= FEATURE_SINCE[feature]


def needs_line(feature: str, version: str, instead: str) -> str:
    """One line for a chapter's output: which torch ``feature`` needs, and what this one does instead."""
    major, minor = FEATURE_SINCE[feature]
    return f"{feature} needs torch {major}.{minor} or later; this is torch {version}: {instead}"


def ddp_buffer_sync_arg(ddp_parameters=None) -> str:
    """The name of DDP's argument that broadcasts rank 0's buffers before each forward:
    ``"forward_sync_buffers"`` where DDP takes it (torch 2.13 and later), else ``"broadcast_buffers"``.

    Decided by DDP's own signature (``ddp_parameters``: its parameter names; read from torch when
    None), not by the version string. The two differ only while DDP is built: ``broadcast_buffers=False``
    also leaves buffers out of the construction broadcast, ``forward_sync_buffers=False`` does not."""
    if ddp_parameters is None:
        import inspect

        from torch.nn.parallel import DistributedDataParallel

        ddp_parameters = inspect.signature(DistributedDataParallel.__init__).parameters
    return "forward_sync_buffers" if "forward_sync_buffers" in ddp_parameters else "broadcast_buffers"


def is_all_to_all_refusal(message: str) -> bool:
    """Whether ``message`` (a rank's error) is a backend refusing the list ``all_to_all`` outright, as
    gloo did before torch 2.12 (``Backend gloo does not support alltoall``; older releases said
    ``ProcessGroup gloo does not support alltoall``), rather than a collective that failed."""
    return "does not support alltoall" in message
