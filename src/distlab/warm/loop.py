"""Inside one warm rank: join the process group once, then run what the kernel sends, forever.

Started by :func:`distlab.warm.group.start_rank_process` as a fresh interpreter (never a fork of the
kernel). Its configuration arrives in the environment variable ``DISTLAB_RANK``; its only link
to the kernel is one pipe. Everything user code prints goes back over that pipe, tagged with
the call that printed it; what C code writes to fd 1/2 (gloo's own messages) goes to the rank's
log file in the run folder.
"""
from __future__ import annotations

import faulthandler
import json
import linecache
import os
import pickle
import signal
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path

from distlab.folders.private import open_private
from distlab.warm import proto
from distlab.warm import watch as rank_watch
from distlab.worker import die_with_parent

RUNTIME_FILES = ("distlab/warm/loop.py", "distlab/warm/proto.py", "distlab/worker.py")  # not the learner's
_state = {"req": None, "in_user_code": False}


def main() -> None:
    cfg = json.loads(os.environ.pop("DISTLAB_RANK"))
    die_with_parent(cfg["parent_pid"])  # a killed kernel leaves no rank behind
    conn = Connection(cfg["conn_fd"])
    sender = Sender(conn)
    _install_signals(cfg)
    sys.path.extend(p for p in cfg["sys_path"] if p not in sys.path)  # what the kernel could import
    try:
        ns = _join_group(cfg)
    except BaseException as e:
        sender.send((proto.START_FAILED, proto.user_traceback(e, RUNTIME_FILES)))
        os._exit(1)
    rank_watch.start(sender, _state)  # an interrupt that finds the rank stuck in a collective is reported at once
    _track_thread_starts()
    sys.stdout, sys.stderr = RankStream(sender, "stdout"), RankStream(sender, "stderr")
    sender.send((proto.READY, os.getpid()))
    serve(conn, sender, ns)


def _install_signals(cfg: dict) -> None:
    """SIGUSR1 dumps every thread's stack to a file the kernel reads (even inside a collective);
    SIGINT stops user code, and only user code: the loop itself is never cut mid-message."""
    stacks = open_private(Path(cfg["folder"]) / f"rank{cfg['rank']}.stacks", "w")  # open for the handler
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    faulthandler.enable()  # a crash in C code leaves its Python stack in the log
    signal.signal(signal.SIGINT, _on_sigint)


def _on_sigint(signum, frame) -> None:
    if _state["in_user_code"]:
        raise KeyboardInterrupt


def _join_group(cfg: dict) -> dict:
    """Initialise the process group on the group's private FileStore; return the rank's namespace."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from distlab.config import choose_backend, cuda_device_count, device

    rank, world = cfg["rank"], cfg["world_size"]
    backend = choose_backend(cfg["backend"], world, cuda_device_count())
    if backend == "nccl":
        torch.cuda.set_device(rank)
    store = dist.FileStore(cfg["store"], world)  # in the group's private folder: no port anyone could open
    store.set_timeout(timedelta(seconds=300))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)
    ns = sys.modules["__main__"].__dict__  # classes defined in cells pickle as __main__.X, as in a script
    ns.update(torch=torch, dist=dist, rank=rank, world_size=world, device=device(rank))
    return ns


def serve(conn: Connection, sender: Sender, ns: dict) -> None:
    """Answer requests until the kernel says close or goes away."""
    while True:
        try:
            msg = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            break
        kind, req = msg[0], msg[1]
        if kind == proto.CLOSE:
            break
        _state["req"] = req
        reply = handle(msg, ns)
        sys.stdout.flush()
        sys.stderr.flush()
        _state["req"] = None
        sender.send_reply(reply)
    _leave()


def handle(msg: tuple, ns: dict) -> tuple:
    """Run one request; never raises: an exception becomes an error reply."""
    kind, req = msg[0], msg[1]
    try:
        if kind == proto.EXEC:
            value = _exec(msg[2], msg[3], ns)
        elif kind == proto.RUN:
            value = _run(*msg[2:], ns)
        elif kind == proto.PUSH:
            value = _push(msg[2], ns)
        elif kind == proto.PULL:
            value = proto.pulled(msg[2], ns)
        elif kind == proto.PROBE:
            value = _probe(ns)
        else:
            raise ValueError(f"distlab rank: unknown request {kind!r}")
    except BaseException as e:  # KeyboardInterrupt and SystemExit too: the rank must stay up
        return (proto.ERROR, req, type(e).__name__, proto.user_traceback(e, RUNTIME_FILES))
    return (proto.DONE, req, value)


def _exec(source: str, filename: str, ns: dict):
    _remember_source(filename, source)
    body, last = proto.compile_cell(source, filename)
    with UserCode():
        exec(body, ns)
        return eval(last, ns) if last is not None else None


def _run(units: list, values: bytes, entry: str, args: bytes, ns: dict):
    """Define the captured code in the rank's namespace (as a script's top level would), then call."""
    with UserCode():
        for source, filename, cell in units:
            _remember_source(filename, cell)
            exec(compile(source, filename, "exec"), ns)
        shipped = pickle.loads(values)
        ns.update({name: v for name, v in shipped.items() if name not in proto.RANK_OWNED})
        return ns[entry](*pickle.loads(args)) if entry else None  # "": definitions only (ranks.push of a function)


def _push(data: bytes, ns: dict) -> None:
    """Variables the kernel sent (``ranks.push``/``scatter``/``%%ranks --push``), set as a cell would."""
    with UserCode():  # unpickling may run code of the values' classes
        ns.update(pickle.loads(data))


def _probe(ns: dict) -> bool:
    torch, dist = ns["torch"], ns["dist"]
    t = torch.ones(1, device=ns["device"])
    dist.all_reduce(t)
    return int(t.item()) == dist.get_world_size()


def _remember_source(filename: str, text: str) -> None:
    """Tracebacks and stack dumps show the cell's lines: linecache is where they look."""
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)


class UserCode:
    """While user code runs, SIGINT (the kernel's interrupt) raises KeyboardInterrupt."""

    def __enter__(self):
        _state["in_user_code"] = True

    def __exit__(self, *exc):
        _state["in_user_code"] = False


def _leave() -> None:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_initialized():
            dist.destroy_process_group()
    finally:
        os._exit(0)


class Sender:
    """One pipe, many writers (user threads print too): each message goes whole, under a lock."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.lock = threading.Lock()

    def send(self, msg: tuple) -> None:
        data = pickle.dumps(msg)
        with self.lock:
            self.conn.send_bytes(data)

    def send_reply(self, reply: tuple) -> None:
        """A done reply carries its value pickled on its own, so a value the kernel cannot load
        spoils only itself; one that cannot travel (or names classes only this rank has) comes
        back as its repr."""
        if reply[0] == proto.DONE:
            try:
                value = pickle.dumps(reply[2])
                if b"__main__" in value:
                    raise pickle.PicklingError("defined on the rank only")
            except Exception:
                value = pickle.dumps(proto.Shown(proto.shown_text(reply[2], _safe_repr(reply[2]))))
            reply = reply[:2] + (value,)
        self.send(reply)


def _safe_repr(value) -> str:
    try:
        return repr(value)
    except Exception as e:
        return f"<{type(value).__name__} object; repr failed: {e}>"


def _track_thread_starts() -> None:
    """Remember which call started each thread: its output belongs to that call's cell only."""
    original = threading.Thread.start

    def start(self):
        self._distlab_req = _state["req"]
        return original(self)

    threading.Thread.start = start


class RankStream:
    """sys.stdout/sys.stderr of a rank: whole lines to the kernel, tagged with their call (and a
    line being redrawn with ``\\r``, a progress bar, at each redraw)."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, sender: Sender, name: str):
        self.sender, self.name = sender, name
        self.joiner = proto.LineJoiner()
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        req = _current_req()
        with self.lock:
            lines = self.joiner.feed(req, text)
            redrawn = self.joiner.take_redrawn(req)  # a progress bar goes as it moves, not at its end
        out = ("\n".join(lines) + "\n" if lines else "") + redrawn
        if out:
            self.sender.send((proto.OUT, req, self.name, out))
        return len(text)

    def flush(self) -> None:
        with self.lock:
            rest = self.joiner.drain()
        for req, text in rest:
            self.sender.send((proto.OUT, req, self.name, text))

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return 1 if self.name == "stdout" else 2


def _current_req():
    thread = threading.current_thread()
    if thread is threading.main_thread():
        return _state["req"]
    return getattr(thread, "_distlab_req", None)
