"""distlab's own forkserver: a process that imported torch once and forks every rank.

Why a server and not ``fork`` of the kernel: a kernel that has used CUDA cannot fork safely (the
most reported failure of fork-based notebook launchers). The server is started with a fresh
``exec`` of Python (``multiprocessing``'s forkserver), imports torch, ``torch.distributed`` and
distlab's worker runtime, and never touches CUDA; a rank forked from it starts in milliseconds.

Why distlab's own instance, not ``multiprocessing``'s global one: distlab chooses what it
preloads, the server dies with the kernel (``PR_SET_PDEATHSIG``), a user's own use of the
forkserver is not affected, and the ranks do not import the kernel's ``__main__`` (they run
the worker script as ``__main__``). torchelastic reaches it through a start method name,
:data:`START_METHOD`, registered with ``multiprocessing``.

Ranks are tracked per run (their ``/proc`` environment is the server's, so the usual search
by ``TORCHELASTIC_RUN_ID`` cannot find them): see :func:`live_ranks`. POSIX only: import this
module after :func:`distlab.forkserver.mode.forkserver_works` said yes.
"""
from __future__ import annotations

import contextlib
import io
import os
import queue
import socket
import sys
import threading
from multiprocessing import connection as mp_connection
from multiprocessing import context as mp_context
from multiprocessing import forkserver as mp_forkserver
from multiprocessing import popen_forkserver, reduction, resource_tracker, spawn, util
from multiprocessing import process as mp_process
from pathlib import Path

from distlab.forkserver import mode as launchmode
from distlab.forkserver import tracker

START_METHOD = "distlab-forkserver"
PRELOAD = ["distlab.forkserver.preload"]  # torch and distlab's rank runtime: see that module
SPARES_VAR = "DISTLAB_SPARE_RANKS"  # how many ranks the server forks ahead (default 2; 0: none)
SPARE_NAME = launchmode.SPARE_NAME  # an idle spare's process name (see distlab.forkserver.spare)


class _ForkServer(mp_forkserver.ForkServer):
    """``multiprocessing``'s ForkServer bookkeeping (its address, "alive" pipe, pid, ``_stop``) with
    distlab's server loop (:mod:`distlab.forkserver.server`, which forks spare ranks ahead) and
    distlab's own end of the protocol: both ends are distlab's on every Python version."""

    def ensure_running(self) -> None:
        with self._lock:
            tracker.ensure_running()  # in a session of its own: see that module
            if self._forkserver_pid is not None:
                if not _ended(self._forkserver_pid):
                    return  # still serving
                os.close(self._forkserver_alive_fd)
                self._forkserver_address = self._forkserver_alive_fd = self._forkserver_pid = None
            self._launch()

    def _launch(self) -> None:
        """Start ``python -c "...main(...)"`` with the listening socket and the alive pipe's read end;
        this process keeps the write end (the server leaves when every copy is closed)."""
        address = socket_path(util.get_temp_dir())
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(address)
            os.chmod(address, 0o600)  # an abstract address was refused before (peercred)
            listener.listen()
            alive_r, alive_w = os.pipe()
            try:
                command = (f"from distlab.forkserver.server import main; "
                           f"main({listener.fileno()}, {alive_r}, {self._preload_modules!r}, {spare_count()})")
                exe = spawn.get_executable()
                flags = [f for f in util._args_from_interpreter_flags() if f not in launchmode.safe_path_flags()]
                args = launchmode.python_argv(code=command, python=exe, flags=flags)
                pid = util.spawnv_passfds(exe, args, [listener.fileno(), alive_r])
            except BaseException:
                os.close(alive_w)
                raise
            finally:
                os.close(alive_r)
        self._forkserver_address, self._forkserver_alive_fd, self._forkserver_pid = address, alive_w, pid
        threading.Thread(target=_reap, args=(pid,), daemon=True, name="distlab-forkserver-reaper").start()

    def _stop_unlocked(self) -> None:
        """``multiprocessing``'s, for a server its reaper may have waited for already."""
        if self._forkserver_pid is None:
            return
        os.close(self._forkserver_alive_fd)  # the server's signal to leave
        self._forkserver_alive_fd = None
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self._forkserver_pid, 0)
        self._forkserver_pid = None
        if not util.is_abstract_socket_namespace(self._forkserver_address):
            os.unlink(self._forkserver_address)
        self._forkserver_address = None

    def connect_to_new_process(self, fds):
        """Ask the server for a child; returns (status pipe's read end, process pipe's write end)."""
        if len(fds) + 4 >= mp_forkserver.MAXFDS_TO_SEND:
            raise ValueError("too many fds")
        parent_r, child_w = os.pipe()
        child_r, parent_w = os.pipe()
        try:
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(self._forkserver_address)
                reduction.sendfds(client, [child_r, child_w, self._forkserver_alive_fd,
                                           resource_tracker.getfd(), *fds])
            return parent_r, parent_w
        except BaseException:
            os.close(parent_r)
            os.close(parent_w)
            raise
        finally:
            os.close(child_r)
            os.close(child_w)


def _reap(pid: int) -> None:
    """Wait for the server to end, so that it never lingers as a zombie: a Jupyter kernel's shutdown
    SIGTERMs the children in its process group and waits until none is left, zombies included, and
    jupyter_client kills the kernel (without its ``atexit`` handlers) after 2.5 s of that."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _ended(pid: int) -> bool:
    """Whether the server ``pid`` has ended (its reaper may have waited for it already)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return bool(done)


def socket_path(folder: str) -> str:
    """A name for the server's socket in ``folder`` (this process's private folder): as short as
    can be (``fs0``), because a Unix socket's path must fit 107 bytes and the folder already sits
    in the runs root (a ``DISTLAB_RUNS`` of 60-odd characters, as a test's ``tmp_path``, left
    ``multiprocessing``'s ``listener-XXXXXXXX`` one byte too many); the number moves on past a
    name a previous server left."""
    n = 0
    while os.path.lexists(os.path.join(folder, f"fs{n}")):
        n += 1
    return os.path.join(folder, f"fs{n}")


def spare_count() -> int:
    """``DISTLAB_SPARE_RANKS`` (read when the server starts): how many ranks it keeps forked ahead
    of the requests, at least (it keeps as many as the largest launch asked for, up to 8)."""
    value = os.environ.get(SPARES_VAR, "").strip()
    if not sys.platform.startswith("linux"):
        return 0  # an idle spare is told from a leftover worker by its name, which only Linux lets it set
    if not value:
        return 2
    if not value.isdigit():
        raise ValueError(f"{SPARES_VAR}={value!r}: write a whole number of spare ranks (0 turns them off)")
    return int(value)


_SERVER = _ForkServer()
_SERVER.set_forkserver_preload(PRELOAD)
_RANKS: dict[str, list] = {}  # run id -> the _RankPopen of each rank this kernel forked for it
_LAUNCH = threading.local()  # the run a thread is launching (torchelastic starts ranks in that thread)
_LOCK = threading.Lock()


def preparation_data(name: str) -> dict:
    """What a forked child applies before it unpickles its target: the kernel's sys.path and cwd.

    ``multiprocessing`` would also make the child import the kernel's ``__main__`` and fix its
    default start method; a rank needs neither (it runs the worker script as ``__main__``).
    """
    cwd = os.getcwd()
    return {"name": name, "authkey": bytes(mp_process.current_process().authkey), "dir": cwd,
            "sys_path": [p if p else cwd for p in sys.path]}


class _RankPopen(popen_forkserver.Popen):
    """Starts a process through distlab's server instead of ``multiprocessing``'s global one.

    The pid is read when first asked for, not here: torchelastic's loop can then ask the server
    for the next rank while this one is still being forked (a fork of a process holding torch
    costs tens of milliseconds).
    """

    _pid = None
    handle = None  # psutil.Process of the rank, made when its pid arrives (it cannot be reused yet)

    def _launch(self, process_obj):
        self.rank = rank_of(process_obj)
        payload = io.BytesIO()
        mp_context.set_spawning_popen(self)
        try:
            reduction.dump(preparation_data(process_obj.name), payload)
            reduction.dump(process_obj, payload)
        finally:
            mp_context.set_spawning_popen(None)
        self._pid_lock = threading.Lock()
        self.sentinel, data_w = _SERVER.connect_to_new_process(self._fds)
        parent_w = os.dup(data_w)  # the child reads EOF here when the launcher dies
        self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))
        with open(data_w, "wb", closefd=True) as f:
            f.write(payload.getbuffer())

    @property
    def pid(self) -> int:
        """The server writes the pid first on the sentinel pipe, the exit code later."""
        with self._pid_lock:
            if self._pid is None:
                import psutil

                self._pid = mp_forkserver.read_signed(self.sentinel)
                try:
                    self.handle = psutil.Process(self._pid)
                except psutil.NoSuchProcess:
                    pass
            return self._pid

    @pid.setter
    def pid(self, value: int) -> None:
        self._pid = value

    def wait_gone(self, deadline: float) -> bool:
        """After the exit code was read: wait until the process is gone. The server writes the
        exit status once it has reaped the process, then closes the pipe: a rank that told its
        code early (``distlab.forkserver.spare.tell_exit``) is gone with that second message, any other
        rank was gone already (the pipe ends)."""
        import time

        got = b""
        while self.finalizer.still_active():  # else the fd is closed (and its number maybe reused)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not mp_connection.wait([self.sentinel], remaining):
                return False
            try:
                data = os.read(self.sentinel, 64)
            except OSError:
                return True
            got += data
            if not data or len(got) >= mp_forkserver.SIGNED_STRUCT.size:
                return True
        return True

    def poll(self, flag=os.WNOHANG):
        if self.returncode is None and self._pid is None:
            if flag == os.WNOHANG and not mp_connection.wait([self.sentinel], 0):
                return None  # not even forked yet (``Process.start`` polls older children)
            self.pid  # noqa: B018  (consume the pid before reading the exit code)
        return super().poll(flag)


class RankProcess(mp_context.ForkServerProcess):
    """A rank forked by distlab's server; remembered under the run that started it."""

    @staticmethod
    def _Popen(process_obj):
        return _RankPopen(process_obj)

    def start(self):
        super().start()
        with _LOCK:
            _RANKS.setdefault(getattr(_LAUNCH, "run_id", None), []).append(self._popen)
        started = getattr(_LAUNCH, "processes", None)
        if started is not None:
            started.append(self)


def call_by_name(module: str, name: str, *args):
    """A fork request's target given by name, imported in the child: a layer below the target's own
    may ask for it (the engine forks a node's agent, ``distlab.launch.agent.run_forked``, which
    imports the engine)."""
    import importlib

    return getattr(importlib.import_module(module), name)(*args)


class Forked:
    """A process forked from the server (a warm rank, a node's agent) behind the part of
    ``subprocess.Popen``'s interface distlab's callers use."""

    def __init__(self, process: RankProcess):
        self.process = process

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def sentinel(self) -> int:
        """Ready once the process has ended (``multiprocessing.connection.wait``)."""
        return self.process.sentinel

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess

        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(f"forked process {self.pid}", timeout)
        return self.process.exitcode

    def terminate(self) -> None:
        if self.process.exitcode is None:
            self.process.terminate()

    def kill(self) -> None:
        if self.process.exitcode is None:
            self.process.kill()


class _Context(mp_context.ForkServerContext):
    Process = RankProcess


def get_context() -> _Context:
    """distlab's start method as a ``multiprocessing`` context (``Process`` forks from the server)."""
    register()
    return mp_context._concrete_contexts[START_METHOD]


def register() -> None:
    """Let torchelastic (``multiprocessing.get_context(START_METHOD)``) find distlab's context."""
    mp_context._concrete_contexts.setdefault(START_METHOD, _Context())


class _Keeper(threading.Thread):
    """Starts (and restarts) the server from one thread that lives as long as the kernel.

    On Linux the server asks for SIGKILL when its parent *thread* ends (``PR_SET_PDEATHSIG``), so
    it must not be started by a launch's own thread (a ``join=False`` run ends with its thread).
    """

    def __init__(self):
        super().__init__(daemon=True, name="distlab-forkserver")
        self.requests: queue.Queue = queue.Queue()

    def run(self) -> None:
        while True:
            reply = self.requests.get()
            try:
                _start_server()
                reply.put(_SERVER._forkserver_pid)
            except BaseException as e:  # handed to the caller
                reply.put(e)


_KEEPER: _Keeper | None = None


def _start_server() -> None:
    """Start the server so that it imports *this* distlab, and leave the kernel as it was.

    Refused (:class:`ForkserverRefused`) where its socket would be reachable by other users.
    The server is a fresh interpreter with the kernel's environment: it would import whatever
    distlab that environment finds, not one the kernel found through its own ``sys.path``
    (a checkout added in a notebook). ``ForkServer.ensure_running`` also fixes the kernel's default
    start method as a side effect (it asks for it); that is undone, so a user's later
    ``mp.set_start_method`` still works.
    """
    from distlab.folders import privtmp
    from distlab.forkserver import peercred

    default = mp_context._default_context
    unset = default.get_start_method(allow_none=True) is None
    # the server's socket in this process's private folder, and its TMPDIR there too
    with privtmp.multiprocessing_tempdir(), privtmp.private_tempfiles():
        reason = peercred.abstract_socket_reason()
        if reason is not None:
            raise ForkserverRefused(reason)
        if _socket_gone():  # its private folder was removed (a new runs root): start a fresh one
            with contextlib.suppress(OSError):
                _SERVER._stop()
            _SERVER._forkserver_address = None
        with _pythonpath_first(distlab_root()), _safe_path():
            _SERVER.ensure_running()  # also multiprocessing's resource tracker (its own `python -c`)
    if unset:
        default._actual_context = None


def _socket_gone() -> bool:
    address = _SERVER._forkserver_address
    return (_SERVER._forkserver_pid is not None and isinstance(address, str) and not address.startswith("\0")
            and not os.path.exists(address))


class ForkserverRefused(RuntimeError):
    """A forkserver would not be safe here (see :mod:`distlab.forkserver.peercred`); ranks start fresh."""


def distlab_root() -> str | None:
    """The folder holding this ``distlab`` package, unless it is a site-packages folder (a fresh
    interpreter finds an installed distlab itself, and site-packages must not come before the
    standard library)."""
    import site

    root = str(Path(__file__).resolve().parents[__name__.count(".")])  # distlab.forkserver.client: 2 up
    sites = {os.path.abspath(p) for p in [*site.getsitepackages(), site.getusersitepackages()]}
    return None if root in sites else root


@contextlib.contextmanager
def _safe_path():
    """``PYTHONSAFEPATH=1`` while the server and ``multiprocessing``'s resource tracker start (both
    ``python -c``, in the kernel's working directory): neither imports a module from that folder.
    Ranks get the kernel's own environment back (``distlab.forkserver.rank``)."""
    old = os.environ.get("PYTHONSAFEPATH")
    os.environ["PYTHONSAFEPATH"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONSAFEPATH", None)
        else:
            os.environ["PYTHONSAFEPATH"] = old


@contextlib.contextmanager
def _pythonpath_first(folder: str | None):
    """PYTHONPATH with ``folder`` first while the server is started (it inherits the environment)."""
    old = os.environ.get("PYTHONPATH")
    if folder is not None:
        os.environ["PYTHONPATH"] = os.pathsep.join([folder, *([old] if old else [])])
    try:
        yield
    finally:
        if folder is not None:
            if old is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = old


_ADOPTED: list[int] = []  # in a child of the server that asks it for ranks (an agent on a node): its pid


def adopt() -> None:
    """In a child of the server that asks it for ranks of its own (the agent of a node,
    :func:`distlab.launch.agent.run_forked`): use the parent server through the socket address and
    "alive" pipe the child inherited; never start a second server."""
    inherited = mp_forkserver._forkserver
    _SERVER._forkserver_address = inherited._forkserver_address
    _SERVER._forkserver_alive_fd = inherited._forkserver_alive_fd
    _SERVER._forkserver_pid = os.getppid()
    _ADOPTED[:] = [os.getppid()]


def ensure_server() -> int:
    """Start the server if it is not running (about a second: it imports torch); return its pid.

    A server that runs is answered here, without the keeper thread: handing the question to
    another thread and back costs two wake-ups, which on a busy machine took ~5 ms a launch."""
    global _KEEPER
    if _ADOPTED:
        return _ADOPTED[0]
    pid = _SERVER._forkserver_pid
    if pid is not None and _KEEPER is not None and _running(pid) and not _socket_gone():
        return pid  # (it passed the keeper's checks when it started; they cannot change since)
    with _LOCK:
        if _KEEPER is None:
            _KEEPER = _Keeper()
            _KEEPER.start()
    reply: queue.Queue = queue.Queue()
    _KEEPER.requests.put(reply)
    outcome = reply.get()
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _running(pid: int) -> bool:
    """Whether child ``pid`` has not exited (asked without reaping it: the keeper does that)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return False


def server_pid() -> int | None:
    """The server's pid while it runs, else None."""
    return _SERVER._forkserver_pid


@contextlib.contextmanager
def launching(run_id: str):
    """Remember the ranks this thread starts for ``run_id``; yields the list of their processes."""
    processes: list[RankProcess] = []
    _LAUNCH.run_id, _LAUNCH.processes = run_id, processes
    try:
        yield processes
    finally:
        _LAUNCH.run_id = _LAUNCH.processes = None


def live_ranks(run_id: str) -> dict:
    """rank -> psutil.Process of the run's forked ranks still alive (for the watcher's timeout,
    stack dumps and clean-up). A rank whose number is unknown gets a negative key. A rank that
    told its exit code, or has exited and waits to be reaped (a zombie), is leaving: not counted,
    but remembered until :func:`wait_gone` (forgetting a zombie let a launch return while the server
    had not reaped its ranks yet, and a busy machine then saw them as left-over processes)."""
    import psutil

    with _LOCK:
        tracked = list(_RANKS.get(run_id, ()))
    alive, leaving = [], []
    for popen in tracked:
        try:
            popen.pid  # noqa: B018  (makes popen.handle)
            if popen.handle is None or not popen.handle.is_running():
                continue  # never forked, or reaped
            exited = popen.handle.status() == psutil.STATUS_ZOMBIE
            (alive if popen.returncode is None and not exited else leaving).append(popen)
        except (OSError, EOFError, psutil.Error):  # never forked, or gone
            pass
    with _LOCK:
        if alive or leaving:
            _RANKS[run_id] = alive + leaving
        else:
            _RANKS.pop(run_id, None)
    return {popen.rank if popen.rank is not None else -1 - i: popen.handle for i, popen in enumerate(alive)}


def wait_gone(run_id: str, timeout: float = 10.0) -> bool:
    """Wait until every rank of the run that has told its exit code is gone from the machine:
    the server has reaped it (it then closes the status pipe) and the rank's own copy of the
    pipe closed when it exited. False if some rank is still there at ``timeout``."""
    import time

    with _LOCK:
        tracked = _RANKS.pop(run_id, [])
    deadline = time.monotonic() + timeout
    return all([popen.wait_gone(deadline) for popen in tracked if popen.returncode is not None])


def rank_of(process_obj, default=None):
    """The local rank of a process torch.multiprocessing started: its target's second argument
    (``torch.multiprocessing.spawn._wrap(fn, i, args, error_file)``). Single node: the rank."""
    args = getattr(process_obj, "_args", ())
    return args[1] if len(args) > 1 and isinstance(args[1], int) else default
