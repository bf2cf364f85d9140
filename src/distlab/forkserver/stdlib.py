"""What distlab uses of ``multiprocessing``'s private parts, and the Pythons it was checked against.

distlab's forkserver subclasses ``multiprocessing``'s ``ForkServer`` and ``popen_forkserver.Popen``,
sets fields of the module-level ``_forkserver`` and ``_resource_tracker`` in a forked child, registers
a start method in ``context._concrete_contexts``, and :mod:`distlab.forkserver.tracker` lends the
resource tracker's module another ``util`` while the tracker starts. None of that is public API, so
each name in :data:`SURFACE` was read, with the code around it, in the standard library of CPython
3.10.13, 3.11.7, 3.12.1 and 3.13.0 (their ``Lib/multiprocessing``), and in copies of CPython main's
``forkserver.py`` and ``resource_tracker.py`` as of 2026 (3.14's own files were not at hand), which
carry 3.14's changes: the forkserver's
authentication (``_forkserver_authkey``, on the protocol distlab replaces at both ends), the resource
tracker's ``_launch`` (which still spawns through its module's ``util.spawnv_passfds``), and, in
main, a fork hook that closes the tracker's pipe in a child of a bare ``os.fork()`` (a forked rank
sets ``_resource_tracker._fd`` after the fork, from the descriptors its request brought). 3.14 also
makes ``forkserver`` the default start method on Linux: distlab names its start method everywhere
(``distlab-forkserver``, ``spawn``) and never uses the default.

On any other Python, or where a name is gone, :func:`problem` says why, and the callers fall back to
the standard behaviour with a warning: ranks start as fresh interpreters (``start="spawn"``), and
the resource tracker starts the usual way (:mod:`distlab.forkserver.tracker`).
Pure but for :func:`missing`, which imports ``multiprocessing``'s modules (kernel, and the server).
"""
from __future__ import annotations

import sys
import warnings

#: The (major, minor) versions whose ``multiprocessing`` the names below were read in (see above).
CHECKED = ((3, 10), (3, 11), (3, 12), (3, 13), (3, 14))

#: module -> the names distlab reads, calls, subclasses or overrides there.
SURFACE = {
    "multiprocessing.forkserver": ("ForkServer", "_forkserver", "MAXFDS_TO_SEND", "SIGNED_STRUCT",
                                   "read_signed", "write_signed"),
    "multiprocessing.popen_forkserver": ("Popen",),
    "multiprocessing.context": ("_concrete_contexts", "_default_context", "ForkServerContext",
                                "ForkServerProcess", "set_spawning_popen", "get_spawning_popen"),
    "multiprocessing.util": ("_args_from_interpreter_flags", "_close_stdin", "spawnv_passfds",
                             "is_abstract_socket_namespace", "get_temp_dir", "Finalize", "close_fds"),
    "multiprocessing.resource_tracker": ("_resource_tracker", "ensure_running", "getfd", "util"),
    "multiprocessing.spawn": ("_main", "get_executable"),
    "multiprocessing.reduction": ("sendfds", "recvfds", "dump", "DupFd"),
}
#: (module, instance) -> the fields distlab reads or sets on that module-level instance.
FIELDS = {
    ("multiprocessing.forkserver", "_forkserver"): ("_forkserver_address", "_forkserver_alive_fd",
                                                    "_forkserver_pid", "_inherited_fds", "_lock",
                                                    "_preload_modules", "_stop", "_stop_unlocked",
                                                    "set_forkserver_preload"),
    ("multiprocessing.resource_tracker", "_resource_tracker"): ("_fd",),
}
_warned: set[str] = set()


def missing(modules: dict | None = None) -> list[str]:
    """The names of :data:`SURFACE` and :data:`FIELDS` this Python lacks, as ``module.name``.
    ``modules``: name -> module object, for a test to hand in fakes (default: import them)."""
    import importlib

    def get(name):
        return modules[name] if modules is not None else importlib.import_module(name)

    gone = []
    for module, names in SURFACE.items():
        try:
            mod = get(module)
        except (ImportError, KeyError):
            gone.append(module)
            continue
        gone.extend(f"{module}.{n}" for n in names if not hasattr(mod, n))
    for (module, instance), names in FIELDS.items():
        obj = getattr(_or_none(get, module), instance, None)
        if obj is not None:
            gone.extend(f"{module}.{instance}.{n}" for n in names if not hasattr(obj, n))
    return gone


def _or_none(get, module):
    try:
        return get(module)
    except (ImportError, KeyError):
        return None


def problem(version=None, gone=None) -> str | None:
    """Why distlab must not use ``multiprocessing``'s private parts on this Python, or None.

    ``version``: ``sys.version_info`` (default this Python's); ``gone``: :func:`missing`'s answer."""
    version = tuple(sys.version_info if version is None else version)[:2]
    gone = missing() if gone is None else gone
    if version not in CHECKED:
        checked = ", ".join(f"{a}.{b}" for a, b in CHECKED)
        return (f"Python {version[0]}.{version[1]} is not among the versions whose multiprocessing "
                f"distlab was checked against ({checked})")
    if gone:
        return f"this Python's multiprocessing lacks {', '.join(gone)}"
    return None


def warn_once(reason: str, fallback: str) -> None:
    """One warning per reason and fallback: what is not used, why, and what happens instead."""
    text = f"distlab: {reason}; {fallback}"
    if text not in _warned:
        _warned.add(text)
        warnings.warn(text, RuntimeWarning, stacklevel=3)
