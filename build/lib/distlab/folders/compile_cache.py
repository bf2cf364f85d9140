"""torch.compile's cache in a folder only you can use, in the kernel and in every rank.

Inductor (``torch.compile``'s backend) keeps the code it generates and later *imports* it from
``<tmp>/torchinductor_<user>``: a predictable name in the shared temp folder, made with
``exist_ok=True`` and never checked for its owner. Another user who creates that folder first
(mode 0777) can swap a generated module, and your next compile runs their code. Triton's cache
lives inside it (``<cache>/triton/<device>``) unless ``TRITON_CACHE_DIR`` says otherwise, so one
variable moves both.

``import distlab`` points ``TORCHINDUCTOR_CACHE_DIR`` at ``<runs root>/compile-cache`` (the
checked 0700 root of :mod:`distlab.folders.runfolder`; persistent, so a second compile, or rank 1 after
rank 0, still finds the cache), unless you set it yourself. Every process distlab starts inherits
it, and a generated script run by hand sets it the same way when it imports distlab.

The variable is not the whole story: Inductor also calls ``default_cache_dir()`` directly, which
ignores it (its precompiled C++ headers, ``<tmp>/torchinductor_<user>/precompiled_headers``,
are included in every CPU kernel it compiles; measured with torch 2.13). So that function is
replaced, as its module is imported, by one that returns the same private folder
(:class:`_DefaultCacheDirHook`). Standard library only: ``import distlab`` does not import torch.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

ENV = "TORCHINDUCTOR_CACHE_DIR"
FOLDER = "compile-cache"
TORCH_MODULE = "torch._inductor.runtime.cache_dir_utils"  # where torch defines default_cache_dir


def wanted(environ, root: Path) -> dict[str, str]:
    """Pure rule: the variables to set (none where the user chose a cache folder already)."""
    return {} if environ.get(ENV) else {ENV: str(root / FOLDER)}


def use_private_cache(environ=None) -> str | None:
    """Set :data:`ENV` in ``environ`` (``os.environ``) unless it is set; returns the folder set.

    Where the runs root cannot be used (a ``DISTLAB_RUNS`` that fails its checks, which the first
    launch reports), the cache goes to a fresh private folder instead (``mkdtemp``: 0700, a name
    nobody can guess): not kept between kernels, but never the predictable shared one.
    """
    from distlab.errors import RunFolderError
    from distlab.folders.private import PRIVATE_DIR, private_root

    environ = os.environ if environ is None else environ
    try:
        changes = wanted(environ, private_root())
    except (RunFolderError, OSError):
        changes = {} if environ.get(ENV) else {ENV: tempfile.mkdtemp(prefix="distlab-compile-cache-")}
    for folder in changes.values():
        os.makedirs(folder, PRIVATE_DIR, exist_ok=True)  # inside the checked root: ours alone
    environ.update(changes)
    if changes:
        replace_default_cache_dir(changes[ENV])
    return changes.get(ENV)


def replace_default_cache_dir(folder: str) -> None:
    """torch's ``default_cache_dir()`` returns ``folder`` from now on: at once if its module is
    loaded, else when it is (before any module that copies the function, ``from ... import``)."""
    loaded = sys.modules.get(TORCH_MODULE)
    if loaded is not None:
        _patch(loaded, folder)
        return
    if not any(isinstance(finder, _DefaultCacheDirHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _DefaultCacheDirHook(folder))


def _patch(module, folder: str) -> None:
    def default_cache_dir() -> str:
        """distlab: the private compile cache, not ``<tmp>/torchinductor_<user>``."""
        return folder

    module.default_cache_dir = default_cache_dir


class _DefaultCacheDirHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when torch's cache-folder module is imported, it lets the usual finder
    load it and patches it right after it runs."""

    def __init__(self, folder: str):
        self.folder = folder

    def find_spec(self, name, path=None, target=None):
        if name != TORCH_MODULE:
            return None
        sys.meta_path.remove(self)  # one use: the real finders answer, and this hook is done
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module, folder = spec.loader.exec_module, self.folder

        def exec_then_patch(module):
            exec_module(module)
            _patch(module, folder)

        spec.loader.exec_module = exec_then_patch
        return spec
