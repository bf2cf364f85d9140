"""How ranks start: forked from distlab's forkserver, or as fresh interpreters. Pure rules.

``start="forkserver"`` (the default where it works) forks each rank from a server process that
imported torch once, so a launch costs tens of milliseconds instead of an interpreter start and
``import torch`` per rank. The server was started with a fresh ``exec`` and never touches CUDA,
so it stays safe after the kernel has used a GPU. ``start="spawn"`` starts every rank as a
fresh interpreter (``python -m distlab.launch.rank``), as torchrun does.

Nothing here starts a process: the choice and the environment a rank ends up with are plain
functions, tested without processes.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from distlab.errors import LaunchArgumentError

START_CHOICES = ("auto", "forkserver", "spawn")
START_ENV = "DISTLAB_START"  # overrides start="auto", e.g. to run a whole test suite in one mode
FORKSERVER_PLATFORMS = ("linux", "darwin")
AGENT_VARS = "DISTLAB_AGENT_VARS"  # names of the variables torchelastic gave a forked rank
LOG_VARS = ("DISTLAB_RANK_STDOUT", "DISTLAB_RANK_STDERR")  # the rank's log files, for the rank itself


def check_start(start) -> None:
    """Raised before any process starts, like every argument error."""
    if start not in START_CHOICES:
        raise LaunchArgumentError("start", start, f"unknown start method; choose one of {START_CHOICES}",
                                  '"spawn" starts fresh interpreters (slower, the way torchrun does).')


def resolve_start(start: str, env=None, platform: str | None = None, forkserver_works: bool = True) -> str:
    """``"forkserver"`` or ``"spawn"``: what a launch asked for, falling back where a forkserver
    cannot work (a platform other than Linux/macOS, or no fd passing in ``multiprocessing``)."""
    check_start(start)
    env = os.environ if env is None else env
    if start == "auto":
        start = env.get(START_ENV, "auto")
        if start not in START_CHOICES:
            raise LaunchArgumentError(START_ENV, start, f"unknown start method; choose one of {START_CHOICES}")
    if start == "spawn":
        return "spawn"
    platform = sys.platform if platform is None else platform
    supported = forkserver_works and platform.startswith(FORKSERVER_PLATFORMS)
    return "forkserver" if supported else "spawn"


def forkserver_works() -> bool:
    """Whether this Python can pass fds to a forkserver and accept distlab's start method, and its
    ``multiprocessing`` is one distlab's forkserver was checked against (:mod:`distlab.forkserver.stdlib`;
    else a warning, and ranks start as fresh interpreters)."""
    try:
        from multiprocessing import context, popen_forkserver  # noqa: F401  (ImportError on Windows)
    except ImportError:
        return False
    if not isinstance(getattr(context, "_concrete_contexts", None), dict):
        return False
    from distlab.forkserver import stdlib, tracker

    reason = tracker.current_problem()
    if reason is not None:
        stdlib.warn_once(reason, 'ranks start as fresh interpreters (start="spawn"), not from distlab\'s forkserver')
        return False
    return True


def rank_environment(kernel_env: dict, current: dict) -> dict:
    """The environment a forked rank must run with: the kernel's *at launch*, plus torchelastic's.

    A forked rank inherits the server's environment (the kernel's when the server started), and
    torchelastic sets its variables (RANK, MASTER_PORT, ...) on top; their names arrive in
    ``DISTLAB_AGENT_VARS``. A fresh interpreter would see ``{**kernel_env, **agent_vars}``.
    """
    names = [n for n in current.get(AGENT_VARS, "").split(",") if n]
    env = dict(kernel_env)
    env.update({n: current[n] for n in names if n in current})
    for name in (AGENT_VARS, *LOG_VARS):
        env.pop(name, None)
    return env



SAFE_PATH_CODE = "import sys; sys.path[:] = [p for p in sys.path if p]; "  # Python 3.10 has no -P


def safe_path_flags(version=None) -> list[str]:
    """Flags for an interpreter distlab starts with ``python -c``: never the current folder first on
    ``sys.path``. With ``-c``, Python puts the working directory (``""``) before the standard
    library, so a ``torch.py`` or ``multiprocessing/`` in the folder a notebook runs in (a shared
    project folder, ``/tmp``) would be imported by distlab's own processes. ``-P`` (Python 3.11+)
    leaves it out; older Pythons run :data:`SAFE_PATH_CODE` first, before any import."""
    version = sys.version_info if version is None else version
    return ["-P"] if tuple(version) >= (3, 11) else []


def importable_path() -> list[str]:
    """What a rank started fresh appends to its ``sys.path`` (after the standard library): the kernel's,
    with ``""`` named as the folder it stands for, and the working folder, which ``-m`` used to put
    first (:func:`python_argv`): a module next to the notebook is still imported, ``json`` is not."""
    cwd = os.getcwd()
    return list(dict.fromkeys([*(p or cwd for p in sys.path), cwd]))


def python_argv(module: str | None = None, *args: str, code: str | None = None, python: str | None = None,
                flags: Sequence[str] = ("-u",), version=None) -> list[str]:
    """The command line of every Python distlab starts: ``python -m MODULE ARGS`` or ``python -c CODE
    ARGS``, never with the working folder first on ``sys.path``.

    An agent, a standby or a rank runs in the notebook's working folder (on nodes, as root), and
    ``-m``/``-c`` would put that folder before the standard library: a ``json.py`` another user
    planted in a shared project folder would run in them. 3.11+: ``-P`` (:func:`safe_path_flags`).
    3.10 has no ``-P``, so ``-m`` becomes ``-c`` code that drops the empty entry
    (:data:`SAFE_PATH_CODE`) and then runs the module as ``-m`` would (``runpy``)."""
    if (module is None) == (code is None):
        raise TypeError("python_argv: give a module or code, not both")
    python = sys.executable if python is None else python
    safe = safe_path_flags(version)
    if module is not None and safe:
        return [python, *safe, *flags, "-m", module, *args]
    if module is not None:
        code = f"import runpy; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    return [python, *safe, *flags, "-c", SAFE_PATH_CODE + code, *args]


def current_umask() -> int:
    """This process's umask, read without changing it where Linux says it (``/proc/self/status``):
    ``os.umask`` can only read it by setting it, and another thread creating a file in between
    would get the wrong mode. A forked rank inherits the *server's* umask (the kernel's when the
    server started), so the launch carries the kernel's current one to every rank."""
    try:
        with open("/proc/self/status") as f:
            found = umask_from_status(f.read())
    except OSError:
        found = None
    if found is None:
        found = os.umask(0o077)
        os.umask(found)
    return found


def umask_from_status(text: str) -> int | None:
    """Pure half of :func:`current_umask`: the ``Umask:`` line of ``/proc/<pid>/status`` (Linux >= 4.7)."""
    for line in text.splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    return None


def forked_ranks(run_id: str) -> dict:
    """rank -> psutil.Process of the live ranks of ``run_id`` forked from distlab's forkserver.

    Their ``/proc`` environment and command line are the server's, so the watcher's search by
    TORCHELASTIC_RUN_ID (and RANK, ``distlab.launch.rank``) cannot find them: it asks here too.
    """
    module = sys.modules.get("distlab.forkserver.client")
    return module.live_ranks(run_id) if module is not None else {}


def server_children(ready: dict[int, int]) -> dict:
    """rank -> psutil.Process, for each pid in ``ready`` (rank -> pid, from a run's private ``ready/``
    folder) that is a working child of this process's forkserver (not an idle spare): a rank that an
    agent on a node asked the server for, whose pid only that agent's records hold."""
    import psutil

    server = forkserver_pid()
    found = {}
    for rank, pid in ready.items():
        try:
            p = psutil.Process(pid)
            if server is not None and p.ppid() == server and p.name() != SPARE_NAME:
                found[rank] = p
        except psutil.Error:
            continue
    return found


def wait_forked_ranks_gone(run_id: str) -> None:
    """Return once the run's forked ranks that told their exit code have also left the machine."""
    module = sys.modules.get("distlab.forkserver.client")
    if module is not None:
        module.wait_gone(run_id)


def forkserver_pid() -> int | None:
    """The pid of distlab's forkserver in this process, if it runs: a helper that lives as long as
    the kernel by design (the ranks it forks are workers, it is not)."""
    module = sys.modules.get("distlab.forkserver.client")
    return module.server_pid() if module is not None else None


def adopted_server() -> int | None:
    """The pid of the forkserver this process asks for ranks as its child (a node's forked agent,
    ``distlab.forkserver.client.adopt``), else None."""
    module = sys.modules.get("distlab.forkserver.client")
    return module._ADOPTED[0] if module is not None and module._ADOPTED else None


SPARE_NAME = "distlab-spare"  # an idle spare rank's process name (distlab.forkserver.spare sets it)


def spare_ranks(at_least: int = 0, timeout: float = 5.0) -> list[int]:
    """The pids of the forkserver's idle spare ranks, oldest first: the processes the next launch's
    ranks will be (Linux; none elsewhere, or without a server). Waits up to ``timeout`` seconds for
    ``at_least`` of them (the server forks them right after a launch's ranks have exited)."""
    import time

    import psutil

    server = forkserver_pid()
    deadline = time.monotonic() + timeout
    while True:
        found = []
        try:
            children = psutil.Process(server).children() if server is not None else []
        except psutil.NoSuchProcess:
            children = []
        for p in children:
            try:
                if p.name() == SPARE_NAME:
                    found.append((p.create_time(), p.pid))
            except psutil.NoSuchProcess:
                pass
        if len(found) >= at_least or time.monotonic() >= deadline or not sys.platform.startswith("linux"):
            return [pid for _, pid in sorted(found)]
        time.sleep(0.01)
