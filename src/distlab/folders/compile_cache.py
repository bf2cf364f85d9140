"""torch.compile's cache in a folder only you can use, in the kernel and in every rank.

Inductor (``torch.compile``'s backend) keeps the code it generates and later *imports* it from
``<tmp>/torchinductor_<user>``: a predictable name in the shared temp folder, made with
``exist_ok=True`` and never checked for its owner. Another user who creates that folder first
(mode 0777) can swap a generated module, and your next compile runs their code. Triton's cache
lives inside it (``<cache>/triton/<device>``) unless ``TRITON_CACHE_DIR`` says otherwise, so one
variable moves both.

``import distlab`` points ``TORCHINDUCTOR_CACHE_DIR`` at ``<runs root>/compile-cache`` (the
checked 0700 root of :mod:`distlab.folders.runfolder`; persistent, so a second compile, or rank 1 after
rank 0, still finds the cache), unless you set it yourself to a folder only you can write. torch's
own default (which torch itself puts in the variable when ``torch._dynamo`` or ``torch._inductor`` is
imported before distlab), a folder of another owner and one that group or others can write count as
unset: distlab replaces them, and says so. Every process distlab starts inherits the variable, and a
generated script run by hand sets it the same way when it imports distlab.

The variable is not the whole story: Inductor also calls ``default_cache_dir()`` directly, which
ignores it (its precompiled C++ headers, ``<tmp>/torchinductor_<user>/precompiled_headers``,
are included in every CPU kernel it compiles; measured with torch 2.13). So that function is
replaced by one that returns the cache folder (the user's own too), in the modules already imported
and, as they are imported, in the others (:class:`_DefaultCacheDirHook`), along with the values torch
computed from it at import (the header folder, Dynamo's cache). Once ``torch._inductor`` has loaded,
what the compile will use is checked, and a torch that moved what distlab replaces gets a warning,
never silence. Standard library only: ``import distlab`` does not import torch.
"""
from __future__ import annotations

import contextlib
import getpass
import importlib.abc
import importlib.util
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path

ENV = "TORCHINDUCTOR_CACHE_DIR"
FOLDER = "compile-cache"
TORCH_MODULE = "torch._inductor.runtime.cache_dir_utils"  # where torch defines default_cache_dir
HEADERS_MODULE = "torch._inductor.codecache"  # _HEADER_DIR: default_cache_dir() at its import; compiles load it
COPIES = ("torch._inductor.runtime.runtime_utils", HEADERS_MODULE)  # `from ... import default_cache_dir`
DYNAMO_MODULE = "torch._dynamo.package"  # DynamoCache: cache_dir() + "/dynamo" at its import
WATCHED = (TORCH_MODULE, *COPIES, DYNAMO_MODULE, "torch._inductor")

TORCH_DEFAULT = "is torch's shared default (torch set it when torch._dynamo or torch._inductor was imported first)"
CACHE_REPLACED = ("distlab: torch.compile's cache folder TORCHINDUCTOR_CACHE_DIR={folder} {why}: another user could "
                  "put code there that your next compile imports. Using {private} instead. To keep a folder of "
                  "your own, set TORCHINDUCTOR_CACHE_DIR to one that you own and no one else can write "
                  "(mkdir -m 700) before importing torch or distlab.")
CACHE_UNPATCHED = ("distlab: after torch._inductor loaded, {what} is {folder}, not the private compile cache "
                   "{private}: this torch moved what distlab redirects, and compiled code may go to the shared "
                   "temporary folder. Set TORCHINDUCTOR_CACHE_DIR to a folder only you can write before importing "
                   "torch, and report this torch version to distlab.")


def shared_default() -> str:
    """torch's own default, ``<tmp>/torchinductor_<user>``, computed as torch does (without torch)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def distrust(folder: str, uid: int | None = None) -> str | None:
    """Why ``folder`` must not hold compiled code that this user's processes import; None when it may:
    it is not torch's shared default, and it does not exist yet or is owned by ``uid`` (yours) and
    writable by no one else."""
    uid = os.geteuid() if uid is None else uid
    if os.path.abspath(folder) == os.path.abspath(shared_default()):
        return TORCH_DEFAULT
    try:
        st = os.stat(folder)
    except OSError:
        return None
    if st.st_uid != uid:
        return f"belongs to uid {st.st_uid}, not you"
    if st.st_mode & 0o022:
        return f"is writable by {'others' if st.st_mode & 0o002 else 'its group'} (mode {st.st_mode & 0o777:o})"
    return None


def wanted(environ, root: Path) -> dict[str, str]:
    """Pure rule: the variables to set (none where the user chose a cache folder only they can write)."""
    chosen = environ.get(ENV)
    return {} if chosen and distrust(chosen) is None else {ENV: str(root / FOLDER)}


def use_private_cache(environ=None) -> str | None:
    """Set :data:`ENV` in ``environ`` (``os.environ``) unless it names a folder only you can write
    (made 0700 if missing); returns the folder set, None where yours was kept. Either way torch's
    ``default_cache_dir()`` returns the cache folder from now on.

    Where the runs root cannot be used (a ``DISTLAB_RUNS`` that fails its checks, which the first
    launch reports), the cache goes to a fresh private folder instead (``mkdtemp``: 0700, a name
    nobody can guess): not kept between kernels, but never the predictable shared one.
    """
    from distlab.errors import RunFolderError
    from distlab.folders.private import PRIVATE_DIR, private_root

    environ = os.environ if environ is None else environ
    chosen = environ.get(ENV)
    kept = bool(chosen) and distrust(chosen) is None
    if kept:
        with contextlib.suppress(OSError):  # torch says why when it compiles
            os.makedirs(chosen, PRIVATE_DIR, exist_ok=True)
    try:
        changes = wanted(environ, private_root())
    except (RunFolderError, OSError):
        changes = {} if kept else {ENV: tempfile.mkdtemp(prefix="distlab-compile-cache-")}
    for folder in changes.values():
        os.makedirs(folder, PRIVATE_DIR, exist_ok=True)  # inside the checked root: ours alone
    if changes and chosen:
        warnings.warn(CACHE_REPLACED.format(folder=chosen, why=distrust(chosen), private=changes[ENV]),
                      RuntimeWarning, stacklevel=3)
    environ.update(changes)
    replace_default_cache_dir(environ[ENV])
    return changes.get(ENV)


def replace_default_cache_dir(folder: str) -> None:
    """torch's ``default_cache_dir()`` returns ``folder`` from now on: in the modules already loaded
    (torch imported before distlab) at once, in the others as they are imported, before any module
    that copies the function (``from ... import``) or computes a folder from it runs."""
    for name in WATCHED:
        if name in sys.modules:
            _patch(sys.modules[name], folder)
    for finder in [f for f in sys.meta_path if isinstance(f, _DefaultCacheDirHook)]:
        sys.meta_path.remove(finder)
    if not all(name in sys.modules for name in WATCHED):
        sys.meta_path.insert(0, _DefaultCacheDirHook(folder))


def _patch(module, folder: str) -> None:
    """Replace, in ``module``, the function and whatever torch computed from it when it was imported."""
    def default_cache_dir() -> str:
        """distlab: the private compile cache, not ``<tmp>/torchinductor_<user>``."""
        return folder

    if hasattr(module, "default_cache_dir"):
        module.default_cache_dir = default_cache_dir
    if hasattr(module, "_HEADER_DIR"):
        module._HEADER_DIR = os.path.join(folder, "precompiled_headers")
        module._HEADER_LOCK_DIR = os.path.join(module._HEADER_DIR, "locks")
    store = getattr(module, "DynamoCache", None)
    if hasattr(store, "_path_prefix") and distrust(os.path.dirname(store._path_prefix)) is not None:
        store._path_prefix = os.path.join(folder, "dynamo")


def check_loaded(folder: str) -> None:
    """Warn (never stay silent) where a loaded torch would still compile outside ``folder``: the
    function distlab replaces is gone from its module, or the header folder is elsewhere."""
    seen = []
    if TORCH_MODULE in sys.modules or importlib.util.find_spec(TORCH_MODULE) is None:  # else: patched on import
        function = getattr(sys.modules.get(TORCH_MODULE), "default_cache_dir", None)
        seen.append((f"{TORCH_MODULE}.default_cache_dir", function() if function else "(not found)"))
    if HEADERS_MODULE in sys.modules:
        seen.append((f"{HEADERS_MODULE}._HEADER_DIR", getattr(sys.modules[HEADERS_MODULE], "_HEADER_DIR", None)
                     or "(not found)"))
    wrong = [(what, where) for what, where in seen if not where.startswith(folder)]
    env = os.environ.get(ENV)
    if env and distrust(env) is not None:
        wrong.append((ENV, env))
    for what, where in wrong:
        warnings.warn(CACHE_UNPATCHED.format(what=what, folder=where, private=folder), RuntimeWarning, stacklevel=2)


class _DefaultCacheDirHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when one of the :data:`WATCHED` modules is imported, it lets the usual
    finders load it and patches it right after it runs; after ``torch._inductor`` or its code cache
    loads, it checks what a compile will use (:func:`check_loaded`)."""

    def __init__(self, folder: str):
        self.folder = folder
        self._finding: set[str] = set()

    def find_spec(self, name, path=None, target=None):
        if name not in WATCHED or name in self._finding:
            return None
        self._finding.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, folder = spec.loader.exec_module, self.folder

        def exec_then_patch(module):
            exec_module(module)
            _patch(module, folder)
            if name in ("torch._inductor", HEADERS_MODULE):
                check_loaded(folder)

        spec.loader.exec_module = exec_then_patch
        return spec
