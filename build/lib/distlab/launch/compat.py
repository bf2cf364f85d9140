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
"""
from __future__ import annotations

from distlab.errors import TORCH_TOO_OLD, DistlabError

TORCH_FLOOR = "2.9"
_checked = False


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
