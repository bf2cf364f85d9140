"""Warm ranks: N processes with the process group initialised, kept alive between calls.

``distlab.spawn`` starts fresh ranks for every call. :class:`Ranks` starts them once, so a
notebook can create a tensor on every rank in one cell and all-reduce it in the next (the
``%%ranks`` magic, :mod:`distlab.warm.magic`). Each rank is a fresh interpreter (never a fork of the
kernel, so the kernel may use CUDA) tied to the kernel's life; the kernel talks to it over one
``multiprocessing`` pipe (:mod:`distlab.warm.proto`), and the group's store is a ``FileStore`` in
the group's private folder: no port at all. This module is the kernel side; :mod:`distlab.warm.loop` is the rank side.
"""
from __future__ import annotations

import linecache
import pickle
import signal
import sys
import threading
import time
import weakref
from itertools import count

from distlab import config
from distlab.capture import collect as capture
from distlab.errors import LaunchArgumentError
from distlab.forkserver import mode as launchmode
from distlab.warm import data, proto, replaced
from distlab.warm import errors as err
from distlab.warm.group import Conversation, RankGroup, start_group
from distlab.warm.status import NO_STATUS, CallStatus, LiveStatus

COLLECTING = {"timeout": "limit reached: collecting where each rank is…",
              "interrupt": "interrupted: collecting where each rank is…",
              "blocked": "a rank failed: collecting where the others are…"}
PROBE_TIMEOUT_S = 10.0  # the health check: one all-reduce on every rank
_current: list = []  # weak references to open Ranks, the last started last (what %%ranks uses)


def current() -> Ranks:
    """The Ranks that ``%%ranks`` cells run on: the last one started and not closed.

    Held weakly: re-running ``ranks = distlab.Ranks(2)`` lets the old ranks go, and they end. In a
    notebook, at the end of the cell, even when an earlier cell showed them and IPython's ``Out``
    still holds them (:mod:`distlab.warm.replaced`).
    """
    alive = [r for r in open_ranks() if r.state != "closed"]
    if not alive:
        raise err.RanksStoppedError(err.NO_RANKS)
    return alive[-1]


def open_ranks() -> list[Ranks]:
    """Every :class:`Ranks` still referenced (closed ones included: they hold no process), oldest first."""
    return [r for r in (ref() for ref in _current) if r is not None]


def _forget(ranks: Ranks) -> None:
    _current[:] = [ref for ref in _current if ref() is not None and ref() is not ranks]


class _Default:
    def __repr__(self) -> str:
        return "<the Ranks' timeout>"


DEFAULT = _Default()


class Ranks:
    """``nprocs`` persistent ranks with the process group up; a context manager.

    ``exec(source)`` runs code in each rank's own namespace (``torch``, ``dist``, ``rank``,
    ``world_size`` and ``device`` are predefined) and returns ``{rank: last expression}``;
    ``run(fn, *args)`` captures a notebook function as ``spawn`` does and returns
    ``{rank: fn(*args)}``. ``timeout`` (seconds, or None for no limit) bounds every call unless
    the call gives its own. Output of user threads that outlive their call is kept in
    ``late_output`` instead of appearing in a later cell.

    ``nodes`` (:class:`distlab.Nodes`): ``nprocs`` ranks on each node, ``nodes.n * nprocs`` in all
    (``nprocs`` then is that total), rank ``r`` on node ``r // per_node``, talking over the nodes' links.
    Those ranks are forked from distlab's forkserver like any others and enter their node's
    namespaces first (:mod:`distlab.forkserver.enter`); ``start="spawn"``: fresh interpreters
    started inside their node.
    """

    def __init__(self, nprocs: int, backend: str = "auto", timeout: float | None = None, start: str = "auto",
                 nodes=None):
        self.per_node = config.check_positive_int("nprocs", nprocs)
        self.nodes = check_nodes(nodes)
        self.nprocs = self.per_node * (nodes.n if nodes is not None else 1)
        config.check_backend(backend, self.per_node, config.cuda_device_count() if backend == "nccl" else 0)
        self.backend = backend
        self.start = launchmode.resolve_start(start, forkserver_works=launchmode.forkserver_works())
        self.timeout = config.check_timeout(timeout)
        self.late_output: dict[int, str] = {}
        self._exec_names: dict[str, str] = {}  # one file name per distinct source: compiled once, cached
        self._requests = count(1)
        self._lock = threading.Lock()
        self._group: RankGroup | None = None
        self._finalizer = None
        self._stopped_why = "never started"
        self.start_s = 0.0
        self._start()

    # --- life cycle ----------------------------------------------------------------------------

    def _start(self) -> None:
        began = time.perf_counter()
        group = self._start_group()
        self._group, self._stopped_why = group, ""
        self._setup: list[str] = []  # what set these ranks up (cells, run, push): what to re-run after a restart
        self._finalizer = weakref.finalize(self, group.stop)
        self.start_s = time.perf_counter() - began
        _forget(self)
        _current.append(weakref.ref(self))
        replaced.watch(open_ranks)

    def _start_group(self) -> RankGroup:
        """Forked from distlab's forkserver where it works; fresh interpreters after a warning
        (once per reason) where it cannot start, as ``spawn`` does."""
        if self.start == "forkserver":
            from distlab.forkserver import elastic as forklaunch

            if forklaunch.server_or_warning():
                return start_group(self.nprocs, self.backend, "forkserver", nodes=self.nodes)
        return start_group(self.nprocs, self.backend, "spawn", nodes=self.nodes)

    def _drop_group(self, why: str, graceful: bool) -> None:
        if self._group is not None:
            self._finalizer.detach()
            self._group.stop(graceful=graceful)
        self._group, self._stopped_why = None, why

    def restart(self) -> Ranks:
        """Stop the ranks (if any) and start fresh ones: the way back after a broken group."""
        with self._guard():
            self._drop_group("restarting", graceful=True)
            self._start()
        return self

    def close(self) -> None:
        """End every rank. Calling it again does nothing."""
        self._drop_group("closed", graceful=True)
        _forget(self)

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def state(self) -> str:
        """``"ready"``, ``"stopped"`` (run ``restart()``) or ``"closed"``."""
        if self._group is not None:
            return "ready"
        return "closed" if self._stopped_why == "closed" else "stopped"

    @property
    def pids(self) -> list[int]:
        return self._group.pids if self._group is not None else []

    def __repr__(self) -> str:
        where = f", nodes={self.nodes.n}x{self.per_node}" if self.nodes is not None else ""
        return f"Ranks(nprocs={self.nprocs}{where}, backend={self.backend!r}, state={self.state!r}, pids={self.pids})"

    # --- calls ---------------------------------------------------------------------------------

    def exec(self, source: str, *, ranks=None, timeout=DEFAULT) -> proto.RankValues:
        """Run ``source`` on every rank (or ``ranks``); ``{rank: value of its last expression or None}``."""
        __tracebackhide__ = True
        if not isinstance(source, str):
            raise LaunchArgumentError("source", source, f"must be a str, not {type(source).__name__}")
        filename = self._exec_names.setdefault(source, f"<ranks.exec #{len(self._exec_names) + 1}>")
        outcome = self._exec(source, filename, "ranks.exec", ranks, timeout)
        if isinstance(outcome, BaseException):
            raise outcome  # from here: the traceback shows the caller's line, not distlab's insides
        return outcome

    def _exec(self, source: str, filename: str, where: str, ranks, timeout, live: bool = False):
        """``{rank: value}``, or the exception to raise (the caller raises it: a shorter traceback)."""
        selected, limit = self._selection(ranks), self._limit(timeout)
        proto.compile_cell(source, filename)  # a SyntaxError is raised here, before any rank sees it
        return self._call((proto.EXEC, source, filename), selected, limit, where, live=live)

    def run(self, fn, *args, ranks=None, timeout=DEFAULT) -> proto.RankValues:
        """Call notebook function ``fn(*args)`` on every rank (or ``ranks``); ``{rank: return value}``.

        ``fn`` and what it uses are captured as :func:`distlab.spawn` captures them, and defined in
        each rank's namespace (so ``%%ranks`` cells can call them afterwards).
        """
        __tracebackhide__ = True
        config.check_function(fn)
        selected, limit = self._selection(ranks), self._limit(timeout)
        units, values, entry = shipped(fn, args)  # raises CaptureError before anything is sent
        payload = (units, values, entry, pickle.dumps(args))
        outcome = self._call((proto.RUN, *payload), selected, limit, f"ranks.run({fn.__name__})")
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    # --- data between the kernel and the ranks --------------------------------------------------

    def push(self, namespace: dict | None = None, /, *, ranks=None, timeout=DEFAULT, **values) -> None:
        """Set variables on every rank (or ``ranks``) to the **same** value: ``ranks.push(x=t, lr=0.1)``.

        Each rank gets its own copy (pickled here, sent over the rank's private pipe). A name that
        clashes with ``ranks``/``timeout`` goes in a dict: ``ranks.push({"ranks": 4})``. One value
        per rank instead: :meth:`scatter`.

        A function defined in the notebook travels as ``ranks.run`` and ``spawn`` send one: as its source, with
        the helpers, classes, imports and constants it uses (a rank has no notebook to import it from).
        """
        __tracebackhide__ = True
        values = data.merge(namespace, values, "push")
        selected, limit = self._selection(ranks), self._limit(timeout)
        functions = {name: v for name, v in values.items() if data.notebook_function(v)}
        defined = [shipped(fn, (), alias=name) for name, fn in functions.items()]  # CaptureError before sending
        payload = data.pack({name: v for name, v in values.items() if name not in functions})
        where = f"ranks.push({', '.join(values)})"
        for units, shipped_values, _ in defined:
            outcome = self._call((proto.RUN, units, shipped_values, "", pickle.dumps(())), selected, limit, where)
            if isinstance(outcome, BaseException):
                raise outcome
        outcome = self._call((proto.PUSH, payload), selected, limit, where)
        if isinstance(outcome, BaseException):
            raise outcome

    def scatter(self, namespace: dict | None = None, /, *, ranks=None, timeout=DEFAULT, **values) -> None:
        """Set a variable to **one value per rank**: ``ranks.scatter(x=[v0, v1])`` gives rank 0 ``v0``.

        Each value is a list or tuple with one item per selected rank (in rank order) or a dict
        ``{rank: value}``; a rank receives only its own item. The same value everywhere: :meth:`push`.
        """
        __tracebackhide__ = True
        values = data.merge(namespace, values, "scatter")
        selected, limit = self._selection(ranks), self._limit(timeout)
        each = {rank: (proto.PUSH, data.pack(mine)) for rank, mine in data.split(values, selected).items()}
        outcome = self._call(None, selected, limit, f"ranks.scatter({', '.join(values)})", each=each)
        if isinstance(outcome, BaseException):
            raise outcome

    def pull(self, *names: str, ranks=None, timeout=DEFAULT) -> proto.RankValues:
        """``{rank: value}`` of a variable on every rank (or ``ranks``); ``{rank: (v1, v2)}`` for several."""
        __tracebackhide__ = True
        names = tuple(data.check_names(names, "pull"))
        selected, limit = self._selection(ranks), self._limit(timeout)
        outcome = self._call((proto.PULL, names), selected, limit, f"ranks.pull({', '.join(map(repr, names))})")
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def gather(self, name: str, *, ranks=None, timeout=DEFAULT) -> list:
        """A variable's value on each rank, as a list in rank order: ``[v_rank0, v_rank1, ...]``."""
        __tracebackhide__ = True
        values = self.pull(name, ranks=ranks, timeout=timeout)
        return [values[r] for r in sorted(values)]

    def _selection(self, ranks) -> list[int]:
        if ranks is None:
            return list(range(self.nprocs))
        chosen = [ranks] if isinstance(ranks, int) and not isinstance(ranks, bool) else ranks
        ok = isinstance(chosen, (list, tuple, range)) and len(chosen) > 0 and all(
            isinstance(r, int) and not isinstance(r, bool) and 0 <= r < self.nprocs for r in chosen)
        if not ok or len(set(chosen)) != len(chosen):
            raise LaunchArgumentError("ranks", ranks, f"must be distinct ranks between 0 and {self.nprocs - 1}",
                                      "For example ranks=[0, 1].")
        return sorted(chosen)

    def _limit(self, timeout) -> float | None:
        return self.timeout if timeout is DEFAULT else config.check_timeout(timeout)

    def _guard(self):
        if not self._lock.acquire(blocking=False):
            raise err.RanksBusyError(err.BUSY)
        return _Release(self._lock)

    def _call(self, message: tuple | None, selected: list[int], timeout, where: str, each: dict | None = None,
              live: bool = False):
        """Send ``message`` to the selected ranks (or ``each[rank]`` to each) and wait for every reply.

        ``live``: show the call's status line while it runs (%%ranks cells, :mod:`distlab.warm.status`).
        """
        with self._guard():
            if self._group is None:
                return err.RanksStoppedError(err.CLOSED if self.state == "closed" else
                                             err.STOPPED.format(why=self._stopped_why))
            status = live_status(selected, timeout) if live else NO_STATUS
            try:
                outcome = self._converse(message, selected, timeout, where, each, status)
            except BaseException:
                status.end("failed")
                raise
            status.end(None if isinstance(outcome, proto.RankValues) else ended_how(outcome))
            if isinstance(outcome, proto.RankValues) and (message is None or message[0] in SETS_UP):
                self._setup = [*(w for w in self._setup if w != where), where]
            return outcome

    def _converse(self, message, selected: list[int], timeout, where: str, each, status):
        with _InterruptFlag() as flag:
            conv = Conversation(self._group, next(self._requests), selected, self.late_output, flag, status)
            if each is None:
                conv.send(message[0], *message[1:])
            else:
                send_each(conv, each)
            conv.wait(timeout)
            problem = self._conclude(conv, where, timeout)
        if problem is None:
            return proto.RankValues({r: conv.replies[r][2] for r in selected})
        if problem[0] == "restart":
            status.phase("restarting the ranks…")
            try:
                self._start()  # outside the interrupt flag: a second Kernel > Interrupt stops it
            except BaseException as e:
                e.__cause__ = problem[1]
                return e
        return problem[1]

    # --- after a failure, a timeout or an interrupt ---------------------------------------------

    def _conclude(self, conv: Conversation, where: str, timeout):
        """Recover what can be recovered; None when the call succeeded, else (action, error)."""
        stacks = {}
        if conv.pending:
            conv.status.phase(COLLECTING[conv.reason])
            stacks = self._group.dump_stacks(sorted(conv.pending))
            self._group.interrupt(sorted(conv.pending))
            conv.wait_after_interrupt()
        conv.sink.finish()
        failures = conv.failures()
        if not failures and conv.reason is None:
            return None
        why = self._why_broken(conv, failures)
        usable = why is None
        if usable:
            return "keep", build_error(conv, failures, stacks, where, timeout, err.STATE_USABLE, usable)
        state = err.restarted(why, self._setup)  # one rule, whatever broke the group: fresh ranks
        self._drop_group(why, graceful=False)
        return "restart", build_error(conv, failures, stacks, where, timeout, state, usable)

    def _why_broken(self, conv: Conversation, failures: list[int]) -> str | None:
        """Why the process group cannot go on, or None after a passed health check."""
        if conv.still_pending:
            names = err.plural(conv.still_pending)
            if failures:
                return f"rank{names['s']} {names['ranks']} stayed blocked after rank {failures[0]} failed"
            inside = sorted({conv.blocked[r][0] for r in conv.still_pending if r in conv.blocked})
            if conv.stuck():  # each told us where (distlab.warm.watch)
                return (f"rank{names['s']} {names['ranks']} stayed blocked in {' and '.join(inside)} after an "
                        "interrupt, waiting for a rank that had left the call")
            return f"rank{names['s']} {names['ranks']} stayed blocked in C code (a collective?) after an interrupt"
        dead = [r for r, reply in conv.replies.items() if reply[0] == "died"]
        if dead:
            return f"rank {dead[0]} died"
        return None if self._probe() else "the health check, one all_reduce on every rank, failed"

    def _probe(self) -> bool:
        with _InterruptFlag() as flag:
            conv = Conversation(self._group, next(self._requests), list(range(self.nprocs)), self.late_output, flag)
            conv.send(proto.PROBE)
            conv.wait(PROBE_TIMEOUT_S)
            conv.sink.finish()
        return not conv.pending and all(reply[0] == proto.DONE and reply[2] is True for reply in conv.replies.values())


SETS_UP = (proto.EXEC, proto.RUN, proto.PUSH)  # calls that leave state on the ranks (scatter: message None)


def check_nodes(nodes):
    """None, or open :class:`distlab.Nodes` (checked before any rank starts)."""
    if nodes is None:
        return None
    from distlab.nodes.cluster import Nodes

    if not isinstance(nodes, Nodes):
        raise LaunchArgumentError("nodes", nodes, "must be distlab.Nodes", "Make them: nodes = distlab.Nodes(2).")
    if nodes.closed:
        raise LaunchArgumentError("nodes", nodes, "are closed", "Make new ones: nodes = distlab.Nodes(2).")
    return nodes


def build_error(conv, failures: list[int], stacks: dict[int, str], where: str, timeout, state: str,
                usable: bool) -> BaseException:
    """The exception a failed, timed-out or interrupted call raises; ``state`` says what is left."""
    everyone = {r: stacks.get(r) or "(finished this call)" for r in conv.ranks}
    if failures:
        first = failures[0]
        reply = conv.replies[first]
        blocked = err.BLOCKED.format(stacks=err.format_stacks(stacks)) if stacks else ""
        if reply[0] == "died":
            how = f" (exit code {reply[2]})" if reply[2] is not None else ""
            text = err.RANK_DIED.format(rank=first, how=how, where=where, log=reply[3], state=state)
            return err.RankError(text, first, "died", reply[3], usable)
        others = failures[1:]
        too = err.OTHERS_TOO.format(**err.plural(others)) if others else ""
        hint = err.not_on_the_ranks(reply[2], reply[3], notebook_namespace())
        text = err.RANK_RAISED.format(rank=first, name=reply[2], where=where, others=too,
                                      traceback=reply[3].rstrip() + hint, blocked=blocked, state=state)
        return err.RankError(text, first, reply[2], reply[3], usable)
    names = err.plural(stacks or conv.ranks)
    if conv.reason == "timeout":
        text = err.TIMED_OUT.format(where=where, timeout=timeout, stacks=err.format_stacks(everyone), state=state,
                                    **names)
        return err.RanksTimeoutError(text, everyone, usable)
    return err.RanksInterrupted(err.INTERRUPTED.format(where=where, stacks=err.format_stacks(everyone),
                                                    state=state, **names))


def live_status(selected: list[int], limit):
    """A status line for the cell, where a Jupyter frontend draws it as the cell runs."""
    from distlab.view.display import live_frontend

    return LiveStatus(CallStatus(selected, limit)) if live_frontend() else NO_STATUS


def ended_how(error: BaseException) -> str:
    """How a call that raised ``error`` ended, in the words of its status line."""
    if isinstance(error, err.RanksTimeoutError):
        return "timed out"
    return "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"


def send_each(conv: Conversation, messages: dict[int, tuple]) -> None:
    """Like ``conv.send``, but each rank gets its own message (``scatter``: only its own values)."""
    for rank in sorted(conv.pending):
        kind, *payload = messages[rank]
        try:
            conv.group.conns[rank].send_bytes(pickle.dumps((kind, conv.req, *payload)))
        except OSError:
            conv._record(rank, conv._death(rank))


def shipped(fn, args: tuple, alias: str | None = None) -> tuple[list, bytes, str]:
    """(units, pickled values, entry) that define notebook function ``fn`` and what it uses on a rank, as
    :func:`distlab.spawn` captures it; ``alias``: the name it gets there too (``ranks.push(g=f)``)."""
    cap = capture.capture(fn, args)  # raises CaptureError before anything is sent
    head = proto.captured_head(cap)
    units = [(head, f"<distlab: imports for {fn.__name__}>", head)]
    units += [definition_unit(text, fn.__globals__) for text in cap.definitions]
    if alias is not None and alias != cap.entry:
        units.append((f"{alias} = {cap.entry}\n", f"<distlab: push {alias}>", f"{alias} = {cap.entry}\n"))
    warn_rank_owned(fn.__name__, proto.shipped_rank_names(cap))
    values = {name: v for name, v in cap.values.items() if name not in proto.RANK_OWNED}
    return units, pickle.dumps(values), cap.entry


def definition_unit(source: str, ns: dict) -> tuple[str, str, str]:
    """(code, filename, the file's text) for one captured definition, placed at its own lines.

    A function defined in cell 3 at line 5 is compiled as ``Cell In[3]`` from line 5, so a rank's
    traceback points into the cell the learner wrote. Unknown origins keep the plain source.
    """
    name = proto.defined_name(source)
    filename = _code_file(ns.get(name)) if name else None
    if filename:
        lines = linecache.getlines(filename)
        first = proto.locate(source, lines)
        if first is not None:
            return "\n" * (first - 1) + source, _display_name(filename), "".join(lines)
    return source, f"<distlab: {name}>", source


def _code_file(obj) -> str | None:
    import inspect

    if inspect.isfunction(obj):
        return inspect.unwrap(obj).__code__.co_filename
    if inspect.isclass(obj):
        for member in vars(obj).values():
            code = getattr(getattr(member, "__func__", member), "__code__", None)
            if code is not None:
                return code.co_filename
    return None


def _display_name(filename: str) -> str:
    """IPython's name for a cell's file (``Cell In[3]``), else the file name itself."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    number = getattr(getattr(shell, "compile", None), "_filename_map", {}).get(filename)
    return f"Cell In[{number}]" if number is not None else filename


class _Release:
    def __init__(self, lock):
        self.lock = lock

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.lock.release()


class _InterruptFlag:
    """While waiting on ranks, Kernel > Interrupt (SIGINT) sets a flag instead of raising.

    Raising mid-read could cut a message in half; the wait loop checks the flag every few ms
    and then ends the call properly (stacks, interrupt the ranks, health check).
    """

    def __enter__(self):
        self.raised = False
        self.saved = None
        if threading.current_thread() is threading.main_thread():
            self.saved = signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum, frame) -> None:
        self.raised = True

    def __exit__(self, *exc) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self.saved if self.saved is not None else signal.default_int_handler)


def warn_rank_owned(fn_name: str, names: list[str]) -> None:
    """Say once per call that the notebook's ``rank`` (or ``world_size``, ``device``) stays in the
    notebook: on the ranks, the function sees each rank's own."""
    if names:
        import warnings

        shown = ", ".join(names)
        warnings.warn(f"ranks.run({fn_name}): the notebook's {shown} stay{'s' if len(names) == 1 else ''} in the "
                      f"notebook; on the ranks, {fn_name} sees each rank's own {shown}.", UserWarning, stacklevel=3)


def notebook_namespace() -> dict:
    """The notebook's variables: IPython's user namespace in a kernel, else ``__main__``'s."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    return shell.user_ns if shell is not None else vars(sys.modules["__main__"])
