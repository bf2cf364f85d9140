"""The run folder: where one launch keeps its script, data, logs and results, private to you.

distlab unpickles what a run folder holds (return values, shipped values) and the workers run
the script in it, so nobody else may be able to write there, or even read it. The rules:

* **Root.** ``$DISTLAB_RUNS`` if set, else ``$XDG_RUNTIME_DIR/distlab-runs`` where that per-user
  folder exists, else ``<tempfile.gettempdir()>/distlab-<uid>``. distlab creates it with mode
  0700. It refuses (:class:`~distlab.errors.RunFolderError`) a root that is a symbolic link, not a
  directory, owned by another user, or open to group/others; and a root below a folder that
  another user could rename it out of (an ancestor owned by someone other than you or root, or
  writable by others without the sticky bit that ``/tmp`` has). A ``<tmp>`` root someone else
  created first is not a dead end: distlab warns and uses ``~/.cache/distlab-runs`` instead.
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
import stat
import tempfile
import time
from pathlib import Path

from .errors import RUN_FOLDER, RunFolderError

ENV = "DISTLAB_RUNS"
KEEP_NEWEST = 20
KEEP_YOUNGER_S = 24 * 3600
PRUNE_EVERY_S = 600  # pruning reads every run's logs (hundreds of runs after a day of work): not per launch
_WARNED: set[str] = set()  # fallback roots already announced in this process
_LAST_PRUNE: dict[str, float] = {}  # root -> when this process last pruned it
SUBFOLDERS = ("logs", "stacks", "ready", "returns", "metrics", "stores")
RUN_NAME = re.compile(r"^\d{8}-\d{6}-")
RANK_FILE = re.compile(r"^rank(\d+)(\..*)?$")
ATTEMPT = re.compile(r"^attempt(\d+)$")
PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


def default_root() -> Path:
    """Where runs go unless told: ``$DISTLAB_RUNS``; else ``$XDG_RUNTIME_DIR/distlab-runs`` when
    that folder of yours exists (a per-user folder nobody else can create anything in); else
    ``<tmp>/distlab-<uid>``. While ``tempfile`` points at a private temporary folder (a launch in
    progress, :mod:`distlab.privtmp`), ``<tmp>`` is not that folder: the root is the one it lives in."""
    chosen = os.environ.get(ENV)
    if chosen:
        return Path(chosen).expanduser()
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and _is_private_dir(Path(runtime)):
        return Path(runtime) / "distlab-runs"
    temp = tempfile.gettempdir()
    from .privtmp import root_of

    return root_of(temp) or Path(temp) / f"distlab-{os.getuid()}"


def fallback_root() -> Path:
    """Where runs go when someone else took ``<tmp>/distlab-<uid>`` first: your cache folder."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "distlab-runs"


def _is_private_dir(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def private_root(path: Path | None = None) -> Path:
    """The checked runs root: created 0700 if missing, refused if anyone else could use it.

    Without an explicit ``path`` or ``$DISTLAB_RUNS``, a shared-temp root that another user
    created first (to stop you, or to catch your runs) is not a dead end: distlab warns once and
    uses :func:`fallback_root` instead, which only you can create.
    """
    if path is not None or os.environ.get(ENV):
        return _checked_root(path)
    try:
        return _checked_root(None)
    except RunFolderError as e:
        if not _taken_by_someone_else(default_root()):
            raise
        fallback = fallback_root()
        if str(fallback) not in _WARNED:
            _WARNED.add(str(fallback))
            import warnings

            warnings.warn(f"{e} Using {fallback} instead.", RuntimeWarning, stacklevel=3)
        return _checked_root(fallback)


def _taken_by_someone_else(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return st.st_uid != os.geteuid()  # a folder, file or link: someone else's name in the shared temp dir


def _checked_root(path: Path | None) -> Path:
    """The root, checked, as a path with no symbolic link in it: what is checked is what is used
    (a link someone could re-point later would send the next run elsewhere)."""
    path = Path(default_root() if path is None else path).expanduser().absolute()
    path = resolved_folder(path.parent) / path.name  # the root itself, if a link, is refused below
    check_ancestors(path.parent)
    try:
        try:
            os.mkdir(path, PRIVATE_DIR)
        except FileNotFoundError:
            os.makedirs(path.parent, PRIVATE_DIR, exist_ok=True)  # the user's own DISTLAB_RUNS path
            check_ancestors(path.parent)
            os.mkdir(path, PRIVATE_DIR)
    except FileExistsError:
        pass  # checked below, whoever made it
    except PermissionError as e:
        _refuse(path, f"you cannot create it ({e.strerror})", "Set DISTLAB_RUNS to a folder of yours.")
    check_private_dir(path)
    return path


def resolved_folder(folder: Path) -> Path:
    """``folder`` with every symbolic link on the way resolved; refused if one of those links
    belongs to another user (who could re-point it at a folder of theirs at any time)."""
    real, links = follow_links(str(folder))
    for link, uid in links:
        if uid not in (0, os.geteuid()):
            _refuse(Path(link), f"it is a symbolic link that belongs to {_user(uid)}, who could point it elsewhere",
                    "Set DISTLAB_RUNS to a path without other users' links (the folder it leads to, if it is yours).")
    return Path(real)


def follow_links(path: str, lstat=os.lstat, readlink=os.readlink, limit: int = 40) -> tuple[str, list]:
    """Resolve ``path`` (absolute) as the kernel would; returns the real path and every symbolic
    link met on the way as (link, owner uid). Parts that do not exist yet are kept as written
    (distlab creates them, as you). ``lstat``/``readlink`` are parameters so the walk can be
    tested on a made-up file system."""
    parts = [p for p in path.split("/") if p][::-1]  # a stack: the next part last
    current, links = "/", []
    while parts:
        name = parts.pop()
        if name == ".":
            continue
        if name == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        try:
            st = lstat(candidate)
        except FileNotFoundError:
            return os.path.normpath(os.path.join(candidate, *parts[::-1])), links
        if not stat.S_ISLNK(st.st_mode):
            current = candidate
            continue
        links.append((candidate, st.st_uid))
        if len(links) > limit:
            _refuse(Path(path), "it goes through too many symbolic links", "Set DISTLAB_RUNS to a plain folder.")
        target = readlink(candidate)
        if target.startswith("/"):
            current = "/"
        parts.extend([p for p in target.split("/") if p][::-1])
    return current, links


def check_private_dir(path: Path) -> None:
    """A real directory of yours that nobody else can enter, list or write."""
    st = _lstat(path)
    if stat.S_ISLNK(st.st_mode):
        _refuse(path, f"it is a symbolic link (to {os.readlink(path)})",
                "Another user may have planted it: remove it, or set DISTLAB_RUNS to a folder of yours.")
    if not stat.S_ISDIR(st.st_mode):
        _refuse(path, "it is not a directory", "Remove it, or set DISTLAB_RUNS to a folder of yours.")
    if st.st_uid != os.geteuid():
        _refuse(path, f"it belongs to {_user(st.st_uid)}, not to you ({_user(os.geteuid())})",
                "Someone else created it first: set DISTLAB_RUNS to a folder of yours "
                "(for example ~/.cache/distlab-runs), or ask its owner to remove it.")
    if st.st_mode & 0o077:
        _refuse(path, f"other users can access it (mode {stat.S_IMODE(st.st_mode):04o})",
                f"If it is yours and holds nothing of anyone else's, run `chmod 700 {path}`; "
                "or set DISTLAB_RUNS to a private folder.")


def check_ancestors(folder: Path) -> None:
    """No other user may rename things inside ``folder`` or any folder above it.

    An ancestor must belong to you or root, and must not be writable by group/others unless it
    has the sticky bit (``/tmp``): otherwise someone could move your root away and put theirs.
    """
    folder = Path(os.path.realpath(folder))
    for f in (folder, *folder.parents):
        try:
            st = os.stat(f)
        except FileNotFoundError:
            continue  # created later, by you, 0700
        if st.st_uid not in (0, os.geteuid()):
            _refuse(f, f"it belongs to {_user(st.st_uid)}, who could replace what distlab puts there",
                    "Set DISTLAB_RUNS to a folder inside your home directory.")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            _refuse(f, f"others can write to it and it has no sticky bit (mode {stat.S_IMODE(st.st_mode):04o})",
                    "Set DISTLAB_RUNS to a folder inside your home directory.")


def check_private_file(path: Path) -> None:
    """Before unpickling: a regular file of yours that nobody else can write, in a private folder."""
    st = _lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        _refuse(path, f"it is not a regular file of yours that only you can write "
                      f"(owner {_user(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o})",
                "distlab will not unpickle it: someone else may have written it.")


def _lstat(path: Path) -> os.stat_result:
    try:
        return os.lstat(path)
    except PermissionError as e:
        _refuse(path, f"you may not even look at it ({e.strerror})",
                "It belongs to someone else: set DISTLAB_RUNS to a folder of yours.")


def _refuse(path, problem: str, hint: str):
    raise RunFolderError(RUN_FOLDER.format(path=path, problem=problem, hint=hint))


def _user(uid: int) -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def open_private(path: Path, mode: str = "w", **kwargs):
    """Open for writing a file only you can read (0600); never follows a symbolic link."""
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= os.O_APPEND if mode.startswith("a") else os.O_TRUNC
    fd = os.open(path, flags, PRIVATE_FILE)
    try:
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def write_private(path: Path, data: str | bytes) -> None:
    with open_private(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


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
        root = private_root(root)
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
    ``PRUNE_EVERY_S`` (a notebook's first prune runs in the background: :mod:`distlab.prestart`)."""
    root = private_root(root)
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
    folders (:mod:`distlab.privtmp`) of processes that are gone. Returns what went."""
    now = time.time() if now is None else now
    runs = []
    for entry in os.scandir(root):
        if RUN_NAME.match(entry.name) and entry.is_dir(follow_symlinks=False):
            runs.append((last_change(Path(entry.path)), Path(entry.path)))
    runs.sort(reverse=True)
    gone = [p for i, (changed, p) in enumerate(runs) if i >= keep_newest and now - changed > younger_s]
    from .privtmp import stale_dirs

    gone += stale_dirs(root)  # temporary folders of processes killed before they could clean up
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
