"""The front ends: ``spawn`` (mp.spawn's signature), ``launch`` (torchrun style), ``run_script``.

Each validates its arguments, writes what the ranks will run into a fresh run folder, and hands
an :class:`~distlab.launch.engine.Plan` to the one engine.
"""
from __future__ import annotations

import threading
import warnings
from dataclasses import replace
from pathlib import Path

from distlab import config
from distlab.capture import collect as capture
from distlab.capture import origins, script
from distlab.errors import LaunchArgumentError
from distlab.folders.private import open_private, write_private
from distlab.folders.runfolder import RunFolder
from distlab.forkserver import mode as launchmode
from distlab.launch import engine
from distlab.launch.compat import check_torch
from distlab.nodes.plan import RDZV_PORT as NODES_RDZV_PORT
from distlab.results import RunResult
from distlab.view.display import make_view


def spawn(fn, args: tuple = (), nprocs: int = 1, join: bool = True, *, timeout: float | None = None,
          view="auto", max_restarts: int = 0, start: str = "auto", nodes=None) -> RunResult:
    """Drop-in for ``torch.multiprocessing.spawn``: runs ``fn(rank, *args)`` on ``nprocs`` ranks.

    An article's ``mp.spawn(demo, args=(2,), nprocs=2)`` runs after changing one name. ``fn``,
    and the notebook classes, helpers, imports and constants it uses, are written into a readable
    worker script in a private run folder (``res.script``); each rank's lines stream into the cell
    as ``[rank1] ...``. Bad arguments raise :class:`LaunchArgumentError` before any process starts.

    :param fn: a function defined in the notebook or importable; called as ``fn(rank, *args)``.
    :param args: the other arguments, sent to every rank (tensors travel as a data file).
    :param nprocs: ranks on this machine (on each node with ``nodes``).
    :param join: ``False`` returns a :class:`PendingRun` at once (``join()``, ``cancel()``).
    :param timeout: seconds; past it every rank's Python stack is shown in a
        :class:`WorkerTimeoutError` and the ranks are stopped.
    :param view: ``"auto"`` (one live output redrawn in place in JupyterLab, ``[rank1] line``
        elsewhere), ``"text"``, ``"live"`` or ``None`` (nothing shown).
    :param max_restarts: restarts of the whole group after a failure, as torchrun's.
    :param start: ``"forkserver"`` forks the ranks from distlab's torch-preloaded server (fast,
        CUDA-safe), ``"spawn"`` starts fresh interpreters; ``"auto"`` is the forkserver where it
        works (see :mod:`distlab.forkserver.mode`).
    :param nodes: a :class:`distlab.Nodes`; ``nprocs`` ranks on each node (``nodes.n * nprocs``
        in all; rank ``r`` on node ``r // nprocs``, as torch's c10d rendezvous numbers the nodes by
        host name), one torchelastic agent per node inside its network, meeting in a c10d
        rendezvous at node 0, as ``torchrun --nnodes`` on each machine would.
    :returns: a :class:`RunResult`: ``returns[rank]``, ``logs[rank]``, ``metrics[rank]``, ``script``.
    :raises WorkerFailedError: a rank raised or died; it names the first failing rank with its
        traceback, after the other ranks were stopped.
    """
    __tracebackhide__ = True  # liveview: IPython shows the learner's cell, not distlab's frames
    return _start(fn, args, nprocs, "spawn", "auto", join, timeout, view, max_restarts, start, nodes)


def launch(fn, world_size: int, args: tuple = (), backend: str = "auto", *, join: bool = True,
           timeout: float | None = None, view="auto", max_restarts: int = 0, start: str = "auto",
           nodes=None) -> RunResult:
    """torchrun style: each rank gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT``, its process group is initialised, ``fn(*args)`` runs, and the group is destroyed.

    Inside ``fn`` use ``dist.get_rank()`` and ``distlab.device()``; no ``setup()`` is needed.

    :param fn: called as ``fn(*args)`` on every rank (not ``fn(rank, ...)`` as :func:`spawn`).
    :param world_size: ranks on this machine (on each node with ``nodes``).
    :param backend: ``"auto"`` (NCCL with one GPU per rank, else gloo: :func:`backend`), ``"gloo"``
        or ``"nccl"``.
    :param nodes: a :class:`distlab.Nodes`: ``world_size`` ranks on each node, as in :func:`spawn`.
    :returns: a :class:`RunResult` (or a :class:`PendingRun` with ``join=False``).

    ``join``, ``timeout``, ``view``, ``max_restarts`` and ``start`` are those of :func:`spawn`.
    """
    __tracebackhide__ = True  # liveview: IPython shows the learner's cell, not distlab's frames
    return _start(fn, args, world_size, "launch", backend, join, timeout, view, max_restarts, start, nodes)


def run_script(path, nproc_per_node: int = 1, args=(), *, mode: str = "torchrun", timeout: float | None = None,
               view="auto", max_restarts: int = 0, nnodes: int = 1, node_rank: int | None = None,
               rdzv_endpoint: str = "", rdzv_id: str = "distlab") -> RunResult:
    """Run a file as a terminal user would.

    ``mode="torchrun"``: like ``torchrun --nproc-per-node N path args`` (RANK etc. set per rank).
    ``mode="python"``: like ``python path args``: one process; the script starts its own ranks.
    ``nnodes > 1``: this machine is one node of a c10d rendezvous at ``rdzv_endpoint``
    (``torchrun --nnodes N --rdzv-backend c10d --rdzv-endpoint E --rdzv-id ID``), the same call on
    every machine. c10d numbers the machines itself, by sorting them (chapter 7): ``node_rank``,
    torchrun's ``--node-rank``, is checked and passed on as torchrun passes it, and c10d ignores it,
    so giving it warns (torchrun logs the same). torch's c10d
    rendezvous unpickles what it reads from its store, so whoever can reach ``rdzv_endpoint`` can
    run code as you in the agent process: distlab runs that agent in a child process, never in
    the notebook's kernel, but use multi-node runs only on a network whose machines you trust.
    ``timeout`` also bounds the wait for the other nodes.
    """
    __tracebackhide__ = True  # liveview: IPython shows the learner's cell, not distlab's frames
    path = Path(path)
    if not path.is_file():
        raise LaunchArgumentError("path", str(path), "no such file", "Write the script first, or fix the path.")
    if mode not in ("torchrun", "python"):
        raise LaunchArgumentError("mode", mode, 'must be "torchrun" or "python"')
    nproc = config.check_positive_int("nproc_per_node", nproc_per_node)
    nnodes = config.check_positive_int("nnodes", nnodes)
    if mode == "python" and (nproc != 1 or nnodes != 1):
        raise LaunchArgumentError("nproc_per_node", nproc,
                                  'must be 1 with mode="python" (the script starts its own ranks)')
    target_args, timeout = config.check_script_args(args), config.check_timeout(timeout)
    node_rank = None if node_rank is None else config.check_node_rank(node_rank, nnodes)
    rdzv_endpoint = config.check_rdzv_endpoint(rdzv_endpoint, nnodes)
    view, max_restarts = config.check_view(view), config.check_max_restarts(max_restarts)
    if node_rank is not None:  # every argument is valid: nobody should rely on a numbering they will not get
        warnings.warn(config.NODE_RANK_IGNORED.format(node_rank=node_rank), UserWarning, stacklevel=2)
    check_torch()
    plan = engine.Plan(
        run_dir=engine.new_run_dir(path.stem), target=path.resolve(), nproc=nproc,
        target_args=target_args, timeout=timeout,
        max_restarts=max_restarts, nnodes=nnodes, node_rank=node_rank or 0, rdzv_endpoint=rdzv_endpoint,
        plain_python=mode == "python", rdzv_id=rdzv_id,
    )
    names = {0: path.name} if mode == "python" else None  # one process and its own ranks: not "rank0"
    return engine.execute(plan, make_view(view, plan.world_size, names), collect_returns=False)


def _start(fn, args, nprocs, style, backend, join, timeout, view, max_restarts, start="auto", nodes=None):
    __tracebackhide__ = True  # liveview: IPython shows the learner's cell, not distlab's frames
    start = launchmode.resolve_start(start, forkserver_works=launchmode.forkserver_works())
    config.check_function(fn)
    args = config.check_args(args)
    nprocs = config.check_positive_int("nprocs", nprocs)
    timeout = config.check_timeout(timeout)
    view, max_restarts = config.check_view(view), config.check_max_restarts(max_restarts)
    nodes = config.check_nodes(nodes)
    nnodes = 1 if nodes is None else nodes.n
    config.check_backend(backend, nprocs, config.cuda_device_count() if backend == "nccl" else 0)
    config.check_device_mode()
    captured = capture.capture(fn, args)  # raises CaptureError before any process starts
    check_torch()
    args = capture.compact(args)  # a small view of a large tensor travels as its own elements
    run_dir = engine.new_run_dir(captured.entry)
    path = write_script(run_dir, captured, args, nprocs * nnodes, style, backend)
    origins.save(path, getattr(fn, "func", fn).__globals__)  # worker tracebacks name the notebook cell
    plan = engine.Plan(run_dir=run_dir, target=path, nproc=nprocs, timeout=timeout,
                       max_restarts=max_restarts, script=path, start=start)
    if nodes is not None:  # each node's agent meets the others at node 0, on a port only these nodes have
        plan = replace(plan, nnodes=nnodes, rdzv_endpoint=f"{nodes.hosts[0]}:{NODES_RDZV_PORT}",
                       rdzv_id=f"distlab-{plan.run_id}")
    if join:
        return engine.execute(plan, make_view(view, nprocs * nnodes), **({} if nodes is None else {"nodes": nodes}))
    return PendingRun(plan, make_view(view, nprocs * nnodes), nodes)


def write_script(run_dir: Path, captured, args: tuple, nprocs: int, style: str, backend: str) -> Path:
    """Write ``<fn>.py`` and, for values that are not source, ``values.pt``/``args.pt`` beside it
    (files only you can read: the workers run and unpickle them)."""
    import torch

    folder = RunFolder(run_dir)
    path = folder.script(captured.entry)
    write_private(path, script.render(captured, args=args, nprocs=nprocs, style=style, backend=backend,
                                      filename=path.name))
    for name, value, needed in (("values", captured.values, bool(captured.values)),
                                ("args", args, script.needs_args_file(args))):
        if needed:
            with open_private(folder.data(name), "wb") as f:
                torch.save(value, f)
    return path


class PendingRun:
    """A launch running in a background thread (``join=False``).

    ``join()`` returns its result (or raises its error); a Ctrl-C while waiting leaves the run
    going and joinable again. ``cancel()`` stops it.
    """

    def __init__(self, plan: engine.Plan, view, nodes=None):
        self.plan, self.nodes = plan, nodes
        self._done = threading.Event()  # not Thread.join: a Ctrl-C inside it can corrupt the thread's state
        self._result = self._error = None
        self._thread = threading.Thread(target=self._run, args=(view,), daemon=True,
                                        name=f"distlab-run-{plan.run_id}")
        self._thread.start()

    def _run(self, view) -> None:
        try:
            across = {} if self.nodes is None else {"nodes": self.nodes}
            self._result = engine.execute(self.plan, view, **across)
        except BaseException as e:  # handed to join()
            self._error = e
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def join(self, timeout: float | None = None) -> RunResult:
        __tracebackhide__ = True  # IPython shows the learner's cell, not distlab's frames
        try:
            finished = self._done.wait(timeout)
        except KeyboardInterrupt:
            raise KeyboardInterrupt(f"distlab: stopped waiting; run {self.plan.run_dir} is still running. "
                                    "Call join() again, or cancel() to stop it.") from None
        if not finished:
            raise TimeoutError(f"distlab: run {self.plan.run_dir} still running after {timeout}s")
        if self._error is not None:
            raise self._error
        return self._result

    def cancel(self, timeout: float | None = 60) -> bool:
        """Stop every rank of this run; returns once it has ended (True) or after ``timeout``.
        ``join()`` then raises :class:`~distlab.errors.RunCancelledError` (unless it had finished)."""
        self.plan.cancel.set()
        return self._done.wait(timeout)


