"""The runtime inside every worker process.

distlab starts each rank as ``python -m distlab.launch.rank RUN_JSON TARGET [ARGS...]``. This
module installs what makes a worker observable and safe (stack dumps on SIGUSR1, exit when
the launching kernel dies, precise error files), then runs TARGET as ``__main__`` exactly as
``python TARGET`` would. Generated scripts end with ``worker.main(fn, ...)``, which calls
``fn`` for this rank and ships its return value back.

Run by hand (``python script.py`` or ``torchrun script.py``) the same script works without
distlab's launcher: ``main`` then starts the ranks itself with ``torch.multiprocessing.spawn``
or reads torchrun's environment.
"""
from __future__ import annotations

import atexit
import faulthandler
import functools
import json
import os
import runpy
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from distlab.folders.private import check_private_file, open_private, write_private
from distlab.folders.runfolder import RunFolder, store_name

_RUN: dict | None = None  # the launcher's run config when started by distlab, else None
_METRICS = None  # open metrics file of this rank
_SCRIPT: str | None = None  # the run's worker script: the only file whose frames name notebook cells
ORPHAN_EXIT_CODE = 70


def rank_from_env() -> int:
    return int(os.environ.get("RANK", "0"))


def _folder() -> RunFolder:
    return RunFolder(_RUN["run_dir"])


def _install(run: dict) -> None:
    """Make this process observable and tied to its parent before user code runs."""
    global _RUN
    _RUN = run
    if int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does: N ranks must not each use every core
    rank = rank_from_env()
    os.dup2(sys.stdout.fileno(), sys.stderr.fileno())  # one log per rank, prints and tracebacks in order
    stacks = open_private(_folder().stack(rank), "w")  # kept open for the signal handler
    held = held_warning_signals()
    for sig in STACK_SIGNALS:
        if sig not in held:  # a held warning signal belongs to the job's own handler
            faulthandler.register(sig, file=stacks, all_threads=True)
    hand_warnings_to_the_job(held)
    write_private(_folder().ready(rank), str(os.getpid()))  # SIGUSR1 is safe from now on
    die_with_parent(run["parent_pid"])
    from distlab.rendezvous import retired_groups

    retired_groups.install()  # a destroyed gloo group closes with the rank: 20 ms less per run
    if run["single_node"]:  # keep gloo's and NCCL's own sockets on loopback too
        os.environ.update(loopback_socket_vars(os.environ, loopback_interface()))
        _private_rendezvous(_folder(), int(os.environ["MASTER_PORT"]))


#: what asks a rank for its stacks: SIGUSR1 from distlab's launchers; SIGWINCH in Slurm jobs, whose
#: scripts often want SIGUSR1 for themselves (``--signal=USR1@90``: checkpoint before the time limit).
#: SIGWINCH's default action is to do nothing, so no process of the job dies of it.
STACK_SIGNALS = (signal.SIGUSR1, signal.SIGWINCH)

#: the signals Slurm's warning before the time limit uses (``--signal=USR1@90``), held by distlab's Slurm
#: wrappers while a rank starts (distlab.slurm.rank blocks them before starting it)
WARNING_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


def held_warning_signals() -> set[int]:
    """The warning signals this process started with blocked: a Slurm rank, whose wrapper holds them."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    return {sig for sig in WARNING_SIGNALS if sig in blocked}


def release_on_handler(held: set[int], signals=signal) -> None:
    """Deliver each held warning signal once the rank's own code installs a handler for it.

    Slurm's warning can come at any moment of a rank's life; arriving while the rank still imports torch
    (a loaded node, a slow file system), before the job's ``signal.signal(SIGUSR1, ...)``, its default
    action killed the rank (exit 138) instead of letting it checkpoint. Blocked, it waits as pending; the
    first ``signal.signal`` for it unblocks it (in the main thread, where Python runs handlers) and a
    pending warning is then delivered to the handler. A rank that never installs one keeps it held."""
    if not held:
        return
    original = signals.signal

    def installing(signum, handler):
        previous = original(signum, handler)
        if signum in held:
            held.discard(signum)
            signals.pthread_sigmask(signals.SIG_UNBLOCK, [signum])
        if not held:
            signals.signal = original
        return previous

    signals.signal = installing


def hand_warnings_to_the_job(held: set[int]) -> None:
    """The warning signals this rank started with held are the job's: delivered to its handler once it has
    one, and held again once its code has ended (see the two functions below)."""
    hold_again_at_exit(held)
    release_on_handler(set(held))


def hold_again_at_exit(held: set[int], signals=signal, register=atexit.register) -> None:
    """Block the held warning signals again once the job's code has ended.

    Python's finalization resets every signal that has a Python handler to its default action, after
    ``atexit``; a warning that reached a rank then (Slurm's controller sends it once per attempt, at any
    moment: here just as a rank that had finished its steps was exiting) killed it with exit 138 and
    failed the job. Blocked from the first ``atexit`` call on, it stays pending and dies with the process."""
    if held:
        register(signals.pthread_sigmask, signals.SIG_BLOCK, sorted(held))


SOCKET_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def loopback_socket_vars(env, loopback: str) -> dict[str, str]:
    """gloo's and NCCL's interface variables for a single-node rank: the loopback interface,
    unless ``env`` chose one. Every kind of rank (launched, warm, a hand-run script's) uses this
    one rule, so none of them opens its collective sockets on another interface."""
    return {name: env.get(name, loopback) for name in SOCKET_VARS}


@functools.lru_cache(maxsize=1)
def loopback_interface() -> str:
    """The loopback interface's name (the forkserver looks it up once for all its ranks)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == "127.0.0.1" for a in addrs):
            return name
    return "lo"


def die_with_parent(parent_pid: int, watchdog: bool = True) -> None:
    """A killed kernel cannot stop its workers, so each worker is tied to its parent's life.

    On Linux the kernel delivers SIGKILL when the parent goes (works even on a stopped or hung
    worker); everywhere a watchdog thread also notices being re-parented and exits. ``watchdog=False``
    (an idle spare rank on Linux): the thread waits for the run, because a process with a second
    thread can no longer enter a node's namespaces (``setns`` of a user or mount namespace needs a
    single-threaded process: :mod:`distlab.forkserver.enter`).
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(ORPHAN_EXIT_CODE)
    if watchdog and _WATCHDOG.get(os.getpid()) != parent_pid:  # a rank starts it once
        threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
        _WATCHDOG[os.getpid()] = parent_pid


_WATCHDOG: dict[int, int] = {}  # pid -> the parent its watchdog thread watches (a thread is not forked)


def _exit_with_parent(parent_pid: int) -> None:
    """The portable half of die_with_parent: leave once re-parented (the parent is gone)."""
    while os.getppid() == parent_pid:
        time.sleep(0.25)
    print(f"distlab: rank {rank_from_env()}: launcher process {parent_pid} is gone, exiting.", file=sys.stderr)
    os._exit(ORPHAN_EXIT_CODE)


def _private_rendezvous(folder: RunFolder, distlab_port: int) -> None:
    """Every ``init_process_group`` of this single-node rank meets the others in a ``FileStore``
    inside the private run folder, unless user code chose its own ``MASTER_PORT``.

    torchrun's workers would connect to the agent's ``TCPStore``, which any local user can open.
    distlab's ranks get a placeholder ``MASTER_PORT`` (nothing listens there) and this hook turns
    the TCP rendezvous into a file only you can open: one per attempt and per
    ``init_process_group`` call (every rank calls it the same number of times, in the same order).
    Code that sets its own port (the article's ``setup`` uses 12355) gets what ``mp.spawn`` would
    give it, a store hosted by rank 0, but on 127.0.0.1 only (torch's own would listen on every
    interface), and the other ranks join it only if that port's listener is yours.
    """
    import itertools

    import torch.distributed  # noqa: F401  (the attribute `rendezvous` is a function; use the module)

    rdzv = sys.modules["torch.distributed.rendezvous"]
    original = rdzv._create_c10d_store
    calls = itertools.count()

    def create_store(hostname, port, rank, world_size, timeout, *args, **kwargs):
        os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        if int(port) == distlab_port:
            return _file_store(folder, next(calls), world_size, timeout)
        if int(rank) == 0:
            store = _user_port_store(int(port), world_size, timeout, *args, **kwargs)
            if store is not None:
                return store
        else:
            _check_listener_is_ours(int(port), int(rank))
        return original("127.0.0.1", port, rank, world_size, timeout, *args, **kwargs)

    rdzv._create_c10d_store = create_store


def _file_store(folder: RunFolder, call: int, world_size, timeout):
    """A ``FileStore`` in the run folder: the file is made 0600 first, never truncated (ranks race)."""
    import torch.distributed as dist

    path = folder.store(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"), call)
    open_private(path, "ab").close()
    store = dist.FileStore(str(path), int(world_size))
    store.set_timeout(timeout)
    if _cuda_built():
        return store
    from distlab.rendezvous.prompt_store import prompt_store  # a torch without CUDA: see that module for why

    return prompt_store(store)


def _cuda_built() -> bool:
    """Whether this torch can use CUDA (or ROCm), asked without starting the CUDA driver."""
    import torch

    return torch.backends.cuda.is_built()


def _check_listener_is_ours(port: int, rank: int) -> None:
    """Refuse to join a store on 127.0.0.1:``port`` that another user's process listens on: it
    would see (and could forge) this run's rendezvous. Checked twice: the table of listeners
    before connecting (a squatter is never even connected to), then the process that accepted a
    connection of ours (a listener that came after the look, or one the table did not show)."""
    from distlab.errors import PORT_SQUATTED, RendezvousError
    from distlab.rendezvous.loopback import connected_uid, listener_uid

    for _ in range(600):  # rank 0 may not listen yet: wait for a listener (at most ~60 s)
        uid = listener_uid(port)
        if uid is not None:
            break
        time.sleep(0.1)
    if uid is None or uid == os.geteuid():
        uid = connected_uid(port)
    if uid is not None and uid != os.geteuid():
        raise RendezvousError(PORT_SQUATTED.format(rank=rank, port=port, uid=uid))


def _user_port_store(port: int, world_size, timeout, use_libuv: bool = True, *args, **kwargs):
    """Rank 0's store on 127.0.0.1:``port``; None when this process already serves that port
    (torch then reuses its multi-tenant server, which is this loopback one)."""
    import errno

    from distlab.rendezvous.loopback import loopback_store

    try:
        return loopback_store(port, world_size, timeout, multi_tenant=True, use_libuv=use_libuv)
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
        if _serving(port):
            return None
        from distlab.errors import PORT_IN_USE, PortInUseError
        from distlab.rendezvous.loopback import port_holder

        raise PortInUseError(PORT_IN_USE.format(rank=0, port=port, holder=port_holder(port))) \
            from None  # the bare OSError named neither the port nor who holds it


def _serving(port: int) -> bool:
    import psutil

    return any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
               for c in own_connections(psutil.Process(), "inet"))


def own_connections(process, kind: str) -> list:
    """``process``'s sockets of ``kind``: psutil 6 named this ``net_connections``; Colab's and
    Kaggle's psutil 5.9 has only the old name ``connections`` (which psutil 6 still keeps, deprecated)."""
    listed = getattr(process, "net_connections", None) or process.connections
    return listed(kind)


def user_traceback(exc: BaseException) -> str:
    """The traceback without distlab's and runpy's frames: only the learner's code is shown."""
    frames = traceback.extract_tb(exc.__traceback__)
    runtime = ("distlab/worker.py", "distlab/launch/rank.py", "runpy.py", "<frozen runpy>")
    keep = [f for f in frames if not f.filename.endswith(runtime)]
    from distlab.capture.origins import format_frames  # liveview: frames of notebook code also name their cell

    text = "Traceback (most recent call last):\n" + format_frames(keep or frames, _SCRIPT)
    return text + "".join(traceback.format_exception_only(type(exc), exc))


def _write_error(exc: BaseException, text: str) -> None:
    """Write torchelastic's error file, with a sub-second timestamp so the first failure is exact."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    now = time.time()
    data = {"message": {"message": f"{type(exc).__name__}: {exc}",
                        "extraInfo": {"py_callstack": text, "timestamp": str(int(now)), "time": now}}}
    write_private(Path(path), json.dumps(data))


def script_with_origins(target: str, run_dir: str) -> str | None:
    """The script whose tracebacks may name notebook cells: the run's own generated script, inside
    its private run folder. A file ``run_script`` runs from elsewhere gets None: an
    ``.origins.json`` beside it may have been written by anyone who can write that folder."""
    real, folder = os.path.realpath(target), os.path.realpath(run_dir)
    return target if os.path.commonpath([real, folder]) == folder else None


def bootstrap(argv: list[str], parent_pid: int | None = None) -> None:
    """Install the runtime from RUN_JSON, then run TARGET as ``__main__`` (see ``distlab.launch.rank``).

    ``parent_pid``: the process to live and die with when it is not the launcher's (a rank forked
    from distlab's forkserver, ``distlab.forkserver.rank``, lives with the server).
    """
    run = json.loads(Path(argv[0]).read_text())
    if parent_pid is not None:
        run["parent_pid"] = parent_pid
    _install(run)
    os.environ["DISTLAB_RUN_DIR"] = run["run_dir"]  # for report() in processes this rank starts
    # This rank runs with `python -u`; processes it starts (a script's own mp.spawn ranks) write to the
    # same log file, not a terminal, and would hold their lines until they exit without this.
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if run.get("plain_python"):
        _forget_torchrun_environment()
    global _SCRIPT
    target = argv[1]
    _SCRIPT = script_with_origins(target, run["run_dir"])
    if _SCRIPT is not None:
        _name_cells_in_warnings(_SCRIPT)
    sys.argv = [target, *argv[2:]]
    sys.path.insert(0, str(Path(target).resolve().parent))
    sys.path.extend(p for p in run.get("sys_path", []) if p not in sys.path)  # modules the kernel could import
    try:
        runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            _write_error(e, user_traceback(e))
        raise
    except BaseException as e:
        text = user_traceback(e)
        _write_error(e, text)
        sys.stderr.write(text)
        _exit_now(1)


def _name_cells_in_warnings(script: str) -> None:
    """A warning that notebook code raises names its cell, as a traceback from it does, instead of
    a line of the generated script the learner never saw."""
    import warnings

    from distlab.capture.origins import warning_formatter

    warnings.formatwarning = warning_formatter(warnings.formatwarning, script)


def _exit_now(code: int) -> None:
    """Leave at once after a failure: interpreter shutdown with a live gloo group can take seconds
    (or abort in C++), which would delay the report and blur which rank failed first."""
    for stream in (sys.stdout, sys.stderr, _METRICS):
        if stream is not None:
            stream.flush()
    os._exit(code)


TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                      "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
                      "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")


def _forget_torchrun_environment() -> None:
    """For ``run_script(mode="python")``: the file must see what ``python file.py`` would see.

    TORCHELASTIC_RUN_ID stays: it is how distlab finds (and stops) the processes the script starts.
    """
    for name in TORCHRUN_VARIABLES:
        os.environ.pop(name, None)


def main(fn, args=(), nprocs: int = 1, style: str = "spawn", backend: str = "auto"):
    """Run ``fn`` for this rank; called at the end of every generated script.

    * under distlab or torchrun (RANK is set): run this one rank;
    * under plain ``python script.py``: start ``nprocs`` ranks with ``mp.spawn``, as the article does.
    """
    if "RANK" not in os.environ:
        return _spawn_locally(fn, args, nprocs, style, backend)
    rank = rank_from_env()
    if style == "spawn":
        value = fn(rank, *args)
    else:
        value = _run_with_group(fn, args, backend)
    _save_return(rank, value)
    return value


def _run_with_group(fn, args, backend: str):
    """torchrun style: the process group is up before ``fn`` runs and torn down after."""
    import torch.distributed as dist

    from distlab.config import choose_backend, cuda_device_count

    world = int(os.environ["WORLD_SIZE"])
    chosen = choose_backend(backend, world, cuda_device_count())
    if chosen == "nccl":
        import torch

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(chosen)
    try:
        return fn(*args)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _save_return(rank: int, value) -> None:
    if _RUN is None or value is None:
        return
    import torch

    final = _folder().returned(rank)
    tmp = final.with_suffix(".tmp")
    try:
        with open_private(tmp, "wb") as f:
            torch.save(value, f)
    except Exception as e:
        from distlab.errors import CaptureError

        raise CaptureError(f"rank {rank}'s return value ({type(value).__name__})", str(e),
                           "Return plain Python data, numbers or tensors (e.g. loss.item()).") from e
    os.replace(tmp, final)


def _spawn_locally(fn, args, nprocs, style, backend):
    """``python script.py``: behave like the article's ``mp.spawn`` main program, with nothing of
    the run where other users could reach it: torch's error files (which ``mp.spawn`` unpickles
    here) in this process's private folder, and the ranks meeting in a FileStore there, not on a
    port (a ``MASTER_PORT`` the code sets itself is served on 127.0.0.1 only, as under distlab)."""
    import torch.multiprocessing as mp

    from distlab.folders import privtmp
    from distlab.rendezvous.loopback import PLACEHOLDER_PORT

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(PLACEHOLDER_PORT))
    os.environ["WORLD_SIZE"] = str(nprocs)
    with privtmp.private_tempfiles() as folder:
        stores = Path(tempfile.mkdtemp(prefix="stores-", dir=folder))
        mp.spawn(_spawned_rank, args=(fn, args, style, backend, str(stores)), nprocs=nprocs, join=True)


def _spawned_rank(rank, fn, args, style, backend, stores: str):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
    os.environ.update(loopback_socket_vars(os.environ, loopback_interface()))
    from distlab.rendezvous.loopback import PLACEHOLDER_PORT

    _private_rendezvous(_StoreFolder(stores), PLACEHOLDER_PORT)
    value = main(fn, args, style=style, backend=backend)
    if value is not None:
        print(f"[rank{rank}] returned {value!r}")


class _StoreFolder:
    """Where a hand-run script's ranks keep their FileStores (the part of a RunFolder they use)."""

    def __init__(self, path: str):
        self.path = Path(path)

    def store(self, attempt, call: int) -> Path:
        return self.path / store_name(attempt, call)


def report(**metrics) -> None:
    """Send numbers (loss, step, ...) from a worker to the notebook as data; a no-op elsewhere.

    ``distlab.report(step=i, total=n, loss=loss.item())`` in a rank adds a row to that rank's
    ``res.metrics[rank]`` (``res.series("loss")`` gathers one metric); ``step`` and ``total`` also
    drive the rank's progress bar in the live view.

    Works in processes a distlab rank starts itself (``mp.spawn`` in a script run with
    ``run_script(mode="python")``): they find the run folder in DISTLAB_RUN_DIR.
    """
    global _METRICS
    run_dir = _RUN["run_dir"] if _RUN else os.environ.get("DISTLAB_RUN_DIR")
    if not run_dir:
        return
    rank = _current_rank()
    if _METRICS is None:
        _METRICS = open_private(RunFolder(run_dir).metrics(rank), "a", buffering=1)
    row = {"rank": rank, "time": time.time(), **metrics}
    _METRICS.write(json.dumps(row, default=_to_number) + "\n")


def _current_rank() -> int:
    """The process group's rank when one is up (true in mp.spawn children too), else RANK."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return rank_from_env()


def _to_number(x):
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"distlab.report: cannot send a {type(x).__name__}; send numbers or strings")


def load_data(script_file: str, name: str):
    """Load values that travel next to the script as ``<name>.pt`` (tensors, objects).

    The file is unpickled, so it must be yours and writable by nobody else."""
    import torch

    path = Path(script_file).with_name(f"{name}.pt")
    check_private_file(path)
    return torch.load(path, weights_only=False)

