"""Errors distlab raises, with their message templates.

The templates are module constants so tests can check the words a learner reads,
and so every message says *what* failed, *where* (which rank) and *what to do next*.
"""
from __future__ import annotations

import errno

ARGUMENT = "distlab: invalid argument {name}={value!r}: {problem}. {hint}"
CAPTURE = (
    "distlab: cannot ship {what} to the worker processes: {problem}. {hint}"
)
RANK_FAILED = (
    "distlab: rank {rank}{where} failed first (exit code {exitcode}); the other ranks were stopped.\n"
    "{traceback}\n"
    "--- last lines rank {rank} printed ---\n{last_lines}\n"
    "Run folder (script and every rank's log): {run_dir}"
)
TIMED_OUT = (
    "distlab: the run did not finish within timeout={timeout}s; all ranks were stopped.\n"
    "Where each rank was when the time ran out:\n{stacks}\n"
    "A rank waiting in a collective usually means another rank never called it. "
    "Run folder: {run_dir}"
)
INTERRUPTED = "distlab: interrupted; all {n} worker processes were stopped. Run folder: {run_dir}"


class DistlabError(Exception):
    """Base class for every error distlab raises on purpose: ``except distlab.DistlabError`` catches them.

    Each kind is also the builtin exception it resembles (``ValueError``, ``TimeoutError``, ...), so code
    written for ``torch.multiprocessing.spawn`` keeps catching what it caught."""

    def _render_traceback_(self) -> list[str]:
        """What IPython shows instead of a traceback through distlab's own frames: the message,
        which already names the rank, carries that rank's traceback and says what to do next."""
        return notebook_message(type(self).__name__, str(self))


class LaunchArgumentError(DistlabError, ValueError):
    """An argument is wrong (a ``ValueError``); raised before any process starts, and it names the
    argument, what is wrong with it and what to pass instead."""

    def __init__(self, name: str, value, problem: str, hint: str = ""):
        self.name = name
        super().__init__(ARGUMENT.format(name=name, value=value, problem=problem, hint=hint).rstrip())


class CaptureError(DistlabError, TypeError):
    """Notebook code or data that cannot be written as a worker script or data file (a ``TypeError``):
    it names what could not be captured and says what to do (define it in a cell, import it, ...)."""

    def __init__(self, what: str, problem: str, hint: str):
        self.what = what
        super().__init__(CAPTURE.format(what=what, problem=problem, hint=hint))


class WorkerFailedError(DistlabError, RuntimeError):
    """A rank raised or died; the other ranks were stopped first.

    ``rank``: the first rank that failed; ``exitcode``; ``remote_traceback``: its Python traceback, each
    frame from notebook code naming its cell; ``node``: its node on :class:`distlab.Nodes`, else None;
    ``result``: the :class:`RunResult` so far (every rank's logs)."""

    def __init__(self, rank: int, exitcode: int, traceback: str, last_lines: str, run_dir, result=None,
                 node: int | None = None, local_rank: int | None = None):
        self.rank, self.exitcode, self.remote_traceback = rank, exitcode, traceback
        self.result, self.node = result, node
        where = "" if node is None else f" (node{node}, local rank {local_rank})"
        super().__init__(
            RANK_FAILED.format(
                rank=rank, where=where, exitcode=exitcode, traceback=traceback.rstrip(),
                last_lines=last_lines.rstrip() or "(nothing)", run_dir=run_dir,
            )
        )


class WorkerTimeoutError(DistlabError, TimeoutError):
    """The run passed its ``timeout=`` (a ``TimeoutError``); the ranks were stopped.

    ``stacks[rank]``: where each rank's Python was at that moment; ``timeout``: the limit in seconds;
    ``result``: the :class:`RunResult` so far."""

    def __init__(self, timeout: float, stacks: dict[int, str], run_dir, result=None):
        self.timeout, self.stacks, self.result = timeout, stacks, result
        text = "\n".join(f"--- rank {r} ---\n{s.rstrip()}" for r, s in sorted(stacks.items()))
        super().__init__(TIMED_OUT.format(timeout=timeout, stacks=text or "(no rank had started)", run_dir=run_dir))


RUN_FOLDER = "distlab: cannot use {path} for run folders: {problem}. {hint}"
CANCELLED = "distlab: run cancelled; all {n} worker processes were stopped. Run folder: {run_dir}"
TORCH_TOO_OLD = (
    "distlab: this torch ({version}) lacks what distlab's launcher uses: {missing}. "
    "Install torch>={floor} (pip install 'torch>={floor}')."
)
AGENT_FAILED = (
    "distlab: torchelastic's agent stopped with an error before the ranks could finish:\n{error}\n"
    "Run folder: {run_dir}"
)
NEVER_STARTED = "(never started here: the agent was still waiting for the other nodes at {endpoint})"


class RunFolderError(DistlabError, OSError):
    """The runs root or a run folder is not private to you; nothing was started."""


class RunCancelledError(DistlabError, RuntimeError):
    """``PendingRun.cancel()`` stopped the run before it finished."""


class RunInterrupted(KeyboardInterrupt):
    """The learner interrupted the kernel; every worker was stopped. Still a KeyboardInterrupt.

    IPython shows ``_render_traceback_()`` instead of a traceback: the cell then leads with what
    happened (one line) and the run folder, not with distlab's own frames.
    """

    def __init__(self, n: int, run_dir, result=None):
        self.n, self.run_dir, self.result = n, run_dir, result
        super().__init__(INTERRUPTED.format(n=n, run_dir=run_dir))

    def _render_traceback_(self) -> list[str]:
        head, _, folder = str(self).partition(" Run folder: ")
        return notebook_message("", head) + ([f"Run folder (script and every rank's log): {folder}"] if folder else [])


def notebook_message(name: str, message: str) -> list[str]:
    """The lines of an error as a notebook shows them: the first in red, as IPython does."""
    first, *rest = message.splitlines() or [""]
    return [f"\x1b[0;31m{name + ': ' if name else ''}{first}\x1b[0m", *rest]


PORT_SQUATTED = (
    "distlab: rank {rank} will not join the store on 127.0.0.1:{port}: another user (uid {uid}) listens on that "
    "port, and would see (and could forge) this run's rendezvous. Choose another MASTER_PORT, or leave "
    "MASTER_PORT to distlab (its ranks meet in a private file, not on a port)."
)
PORT_IN_USE = (
    "distlab: rank {rank} cannot host the store on 127.0.0.1:{port}, the MASTER_PORT your code set: the port is "
    "already in use (EADDRINUSE), {holder}. Any program on this machine may have chosen the same fixed port (12355 "
    "is also the official tutorials' port). Leave MASTER_PORT to the launcher (distlab and torchrun set it for "
    "every rank; delete the line that sets it), or give every rank a port nobody holds."
)
HOLDER_YOURS = "held by a process of yours: pid {pid} ({command}); if it is an earlier run that is over, stop it"
HOLDER_YOURS_UNNAMED = "held by a process of yours that distlab could not find"
HOLDER_OTHER = "held by another user, {user}"
HOLDER_UNKNOWN = "held by a program distlab cannot name"
FORKSERVER_REFUSED = (
    "distlab: not using a forkserver ({why}); starting fresh interpreters instead (slower). {hint}"
)


class RendezvousError(DistlabError, RuntimeError):
    """The ranks cannot meet safely (another user holds the port)."""


class PortInUseError(RendezvousError, OSError):
    """A fixed ``MASTER_PORT`` that another program already holds (an ``OSError`` with errno
    ``EADDRINUSE``, as the bind's was: code that caught that still catches this)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.errno = errno.EADDRINUSE


NODES = "distlab: cannot start nodes: {problem}. {hint}"
NODE_COMMAND = "distlab: node {node} ({host}): `{command}` failed (exit code {code}):\n{output}\n{hint}"
NODE_GONE = ("distlab: {node} is gone: the process that holds its namespaces ended, so nothing runs there. "
             "Close these nodes and make new ones with distlab.Nodes(...).")


NODE_RUN_INTERRUPTED = ("distlab: interrupted; every process of these commands on {hosts} was stopped{killed}. "
                        "The nodes are still up: run the cell again.")


class NodeRunInterrupted(KeyboardInterrupt):
    """Kernel > Interrupt while commands ran on nodes; every process they started, on every node, is
    gone. Still a KeyboardInterrupt. One line in a notebook, not a traceback through the wait loop."""

    def __init__(self, hosts: list[str], killed: int):
        self.hosts, self.killed = hosts, killed
        super().__init__(NODE_RUN_INTERRUPTED.format(
            hosts=" and ".join(hosts), killed=f" ({killed} of them with SIGKILL)" if killed else ""))

    def _render_traceback_(self) -> list[str]:
        return notebook_message("", str(self))


class NodesError(DistlabError, RuntimeError):
    """Nodes (network namespaces standing in for machines) cannot start, or a step on one failed."""
