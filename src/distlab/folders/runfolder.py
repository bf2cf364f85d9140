"""The run folder: where one launch keeps its script, data, logs and results, private to you.

distlab unpickles what a run folder holds (return values, shipped values) and the workers run
the script in it, so nobody else may be able to write there, or even read it. The root they live
in, and what private means, are :mod:`distlab.folders.private`'s. The rules here:

* **Run folders.** Each launch gets a fresh ``<YYYYmmdd-HHMMSS>-<name>-<random>`` folder made by
  ``tempfile.mkdtemp`` (mode 0700, a name nobody can take first). Its subfolders are 0700 and
  every file distlab (or torchelastic, for the logs) writes there is created 0600.
* **Pruning.** Each new run prunes the root: a run folder is kept if it is among the
  ``KEEP_NEWEST`` (20) most recently changed, or if something in it changed during the last
  ``KEEP_YOUNGER_S`` (one day); every other run folder is deleted. Entries whose names are not
  run-folder names are never touched.

The layout (one place; everything else asks a :class:`RunFolder` for its paths)::

    run.json                 what the worker runtime needs (parent pid, sys.path, ...)
    <entry>.py               the generated worker script
    values.pt, args.pt       notebook values that are not source code
    logs/attempt<k>/rank<r>.out|.err|.error.json   one set per torchelastic (re)start
    stacks/rank<r>.txt       faulthandler dumps (timeouts)
    ready/rank<r>            the worker's pid, written once its runtime is installed
    returns/rank<r>.pt       return values
    metrics/rank<r>.jsonl    distlab.report() rows
    stores/attempt<k>-<n>    the FileStore of the n-th init_process_group of attempt k (single node)
    agent-plan.json, agent.json, agent.log   the out-of-process agent's plan, outcome, output (nnodes > 1)

Only the standard library is imported here: the worker runtime and the tests use this module
without torch.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from distlab.folders import private
from distlab.folders.private import PRIVATE_DIR, check_private_dir

KEEP_NEWEST = 20
KEEP_YOUNGER_S = 24 * 3600
PRUNE_EVERY_S = 600  # pruning reads every run's logs (hundreds of runs after a day of work): not per launch
_LAST_PRUNE: dict[str, float] = {}  # root -> when this process last pruned it
SUBFOLDERS = ("logs", "stacks", "ready", "returns", "metrics", "stores")
RUN_NAME = re.compile(r"^\d{8}-\d{6}-")
RANK_FILE = re.compile(r"^rank(\d+)(\..*)?$")
ATTEMPT = re.compile(r"^attempt(\d+)$")


def store_name(attempt: int | str, call: int) -> str:
    """The FileStore of the ``call``-th ``init_process_group`` of attempt ``attempt`` (single node)."""
    return f"attempt{int(attempt)}-{int(call)}"


def rank_of(path: Path) -> int | None:
    """``rank3.out`` -> 3; None for a file that is not a rank's."""
    m = RANK_FILE.match(path.name)
    return int(m.group(1)) if m else None


class RunFolder:
    """One run's folder and every path in it (see the module docstring for the layout)."""

    def __init__(self, path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunFolder('{self.path}')"

    def __fspath__(self) -> str:
        return str(self.path)

    @classmethod
    def create(cls, name: str, root: Path | None = None, prune_old: bool = True) -> RunFolder:
        """A fresh private run folder in the checked root; prunes old runs first (on the first
        run of this process, then at most every ``PRUNE_EVERY_S``)."""
        root = private.private_root(root)
        if prune_old:
            prune_if_due(root)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:40] or "run"
        path = Path(tempfile.mkdtemp(prefix=f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}-", dir=root))
        for sub in SUBFOLDERS:
            os.mkdir(path / sub, PRIVATE_DIR)
        return cls(path)

    # files at the top
    @property
    def run_json(self) -> Path:
        return self.path / "run.json"

    def script(self, entry: str) -> Path:
        return self.path / f"{entry}.py"

    def data(self, name: str) -> Path:
        """``values.pt`` / ``args.pt``: found next to the script by ``worker.load_data``."""
        return self.path / f"{name}.pt"

    @property
    def agent_plan(self) -> Path:
        return self.path / "agent-plan.json"

    @property
    def agent_json(self) -> Path:
        return self.path / "agent.json"

    @property
    def agent_log(self) -> Path:
        return self.path / "agent.log"

    @staticmethod
    def node_file(path: Path, node: int | None) -> Path:
        """``path`` for node ``node`` of a run across :class:`distlab.Nodes`, whose agents share
        the folder: ``agent.json`` -> ``agent-node1.json``; ``path`` itself for ``None``."""
        return path if node is None else path.with_name(f"{path.stem}-node{node}{path.suffix}")

    # logs, one folder per torchelastic attempt
    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def attempt(self, k: int | str) -> Path:
        return self.logs / f"attempt{int(k)}"

    def make_attempt(self, k: int | str) -> Path:
        folder = self.attempt(k)
        try:
            os.mkdir(folder, PRIVATE_DIR)
        except FileExistsError:
            check_private_dir(folder)
        return folder

    def attempts(self) -> list[Path]:
        """Attempt folders, oldest first (``attempt10`` after ``attempt9``)."""
        found = [(int(m.group(1)), p) for p in self.logs.glob("attempt*") if (m := ATTEMPT.match(p.name))]
        return [p for _, p in sorted(found)]

    @staticmethod
    def rank_log(attempt: Path, rank: int, stream: str) -> Path:
        """``stream`` is ``out``, ``err`` or ``error.json``."""
        return attempt / f"rank{rank}.{stream}"

    def log_files(self, rank: int) -> list[Path]:
        """Every stdout/stderr file of a rank, oldest attempt first."""
        return [f for a in self.attempts() for s in ("out", "err") if (f := self.rank_log(a, rank, s)).exists()]

    def output_streams(self) -> list[tuple[int, Path]]:
        """(rank, file) for every rank output file so far, for live streaming."""
        return [(r, f) for a in self.attempts() for f in sorted(a.glob("rank*"))
                if f.suffix in (".out", ".err") and (r := rank_of(f)) is not None]

    # per-rank files
    def stack(self, rank: int) -> Path:
        return self.path / "stacks" / f"rank{rank}.txt"

    def ready(self, rank: int) -> Path:
        return self.path / "ready" / f"rank{rank}"

    def ready_pids(self) -> dict[int, int]:
        """rank -> the pid its runtime wrote (a hint only: verify before signalling it)."""
        out = {}
        for p in (self.path / "ready").glob("rank*"):
            try:
                out[rank_of(p)] = int(p.read_text())
            except (ValueError, OSError):
                pass
        return out

    def returned(self, rank: int) -> Path:
        return self.path / "returns" / f"rank{rank}.pt"

    def metrics(self, rank: int) -> Path:
        return self.path / "metrics" / f"rank{rank}.jsonl"

    def store(self, attempt: int | str, call: int) -> Path:
        return self.path / "stores" / store_name(attempt, call)

    def metric_streams(self) -> list[tuple[int, Path]]:
        return [(r, p) for p in sorted((self.path / "metrics").glob("rank*.jsonl")) if (r := rank_of(p)) is not None]

    def check(self) -> None:
        """Still a private folder of yours (checked again before anything in it is unpickled)."""
        check_private_dir(self.path)


def prune_if_due(root: Path | None = None) -> None:
    """:func:`prune` the (checked) root on this process's first call, then at most every
    ``PRUNE_EVERY_S`` (a notebook's first prune runs in the background: :mod:`distlab.forkserver.prestart`)."""
    root = private.private_root(root)
    if _prune_due(root):
        prune(root)


def _prune_due(root: Path, now: float | None = None) -> bool:
    """True (and noted) when this process has not pruned ``root`` in the last ``PRUNE_EVERY_S``."""
    now = time.monotonic() if now is None else now
    last = _LAST_PRUNE.get(str(root))
    if last is not None and now - last < PRUNE_EVERY_S:
        return False
    _LAST_PRUNE[str(root)] = now
    return True


def prune(root: Path, keep_newest: int = KEEP_NEWEST, younger_s: float = KEEP_YOUNGER_S,
          now: float | None = None) -> list[Path]:
    """Delete run folders that are neither among the newest ``keep_newest`` nor younger than
    ``younger_s`` (age = time since anything in the run last changed), and the private temporary
    folders (:mod:`distlab.folders.privtmp`) of processes that are gone. Returns what went."""
    now = time.time() if now is None else now
    runs = []
    for entry in os.scandir(root):
        if RUN_NAME.match(entry.name) and entry.is_dir(follow_symlinks=False):
            runs.append((last_change(Path(entry.path)), Path(entry.path)))
    runs.sort(reverse=True)
    gone = [p for i, (changed, p) in enumerate(runs) if i >= keep_newest and now - changed > younger_s]
    gone += private.stale_dirs(root)  # temporary folders of processes killed before they could clean up
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def last_change(run: Path) -> float:
    """The newest mtime of the folder, its logs and metrics: a long run that still writes is young.
    (``os.scandir``, not ``Path.glob``: a day of work leaves thousands of runs to look at.)"""
    newest = os.lstat(run).st_mtime
    for entry in _entries(os.path.join(run, "logs")):
        if entry.name.startswith("attempt"):
            newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
            if entry.is_dir(follow_symlinks=False):
                newest = max([newest, *(e.stat(follow_symlinks=False).st_mtime for e in _entries(entry.path))])
    for entry in _entries(os.path.join(run, "metrics")):
        newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    return newest


def _entries(folder: str) -> list:
    try:
        with os.scandir(folder) as it:
            return list(it)
    except OSError:
        return []


