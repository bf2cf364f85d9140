"""The runs root, and what "private" means for it and for every folder and file distlab keeps there.

distlab unpickles what its folders hold and runs the scripts in them, so a folder must be a real
directory of yours that nobody else can enter (0700), on a path no other user can rename it out
of, and a file distlab reads back must be a regular file only you can write. Every check raises
:class:`~distlab.errors.RunFolderError` with what is wrong and what to do.

* **Root.** ``$DISTLAB_RUNS`` if set, else ``$XDG_RUNTIME_DIR/distlab-runs`` where that per-user
  folder exists, else ``<tempfile.gettempdir()>/distlab-<uid>``. distlab creates it with mode
  0700. It refuses (:class:`~distlab.errors.RunFolderError`) a root that is a symbolic link, not a
  directory, owned by another user, or open to group/others; and a root below a folder that
  another user could rename it out of (an ancestor owned by someone other than you or root, or
  writable by others without the sticky bit that ``/tmp`` has). A ``<tmp>`` root someone else
  created first is not a dead end: distlab warns and uses ``~/.cache/distlab-runs`` instead.
* **Inside the nodes' user namespace** (an ordinary user's :class:`distlab.Nodes`), where you are
  uid 0 and the host's root and every other user show as ``nobody``: the root keeps the name the
  kernel gave it (``distlab-<your uid outside>``), and folders above it that show as ``nobody`` are
  trusted only on the mark a check outside left in the root (:func:`ancestor_problem`, :func:`vouch`).
* **What lives in the root.** Run folders (:mod:`distlab.folders.runfolder`) and each process's
  private temporary folder, ``proc-<host>-<pid>-<random>`` (:mod:`distlab.folders.privtmp`); the
  names of the latter are read here, so that pruning the root never needs that module.

Standard library only: the worker runtime and the tests use this module without torch.
"""
from __future__ import annotations

import os
import re
import socket
import stat
import tempfile
from pathlib import Path

from distlab.errors import RUN_FOLDER, RunFolderError
from distlab.folders import owner, userns

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700
ENV = "DISTLAB_RUNS"
_WARNED: set[str] = set()  # fallback roots already announced in this process
PREFIX = "proc-"
NAME = re.compile(r"^proc-(?P<host>.+)-(?P<pid>\d+)-[^-]+$")  # mkdtemp's random part has no "-"
VOUCHED = ".checked-outside-namespaces"  # see vouch()
HOST_CHARS = 16  # a folder name stays short: the forkserver's socket path inside it must fit 107 bytes


def is_private_dir(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def resolved_folder(folder: Path) -> Path:
    """``folder`` with every symbolic link on the way resolved; refused if one of those links
    belongs to another user (who could re-point it at a folder of theirs at any time)."""
    real, links = follow_links(str(folder))
    for link, uid in links:
        if uid not in (0, os.geteuid()):
            refuse(Path(link), f"it is a symbolic link that belongs to {_user(uid)}, who could point it elsewhere",
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
            refuse(Path(path), "it goes through too many symbolic links", "Set DISTLAB_RUNS to a plain folder.")
        target = readlink(candidate)
        if target.startswith("/"):
            current = "/"
        parts.extend([p for p in target.split("/") if p][::-1])
    return current, links


def check_private_dir(path: Path) -> None:
    """A real directory of yours that nobody else can enter, list or write."""
    st = _lstat(path)
    if stat.S_ISLNK(st.st_mode):
        refuse(path, f"it is a symbolic link (to {os.readlink(path)})",
                "Another user may have planted it: remove it, or set DISTLAB_RUNS to a folder of yours.")
    if not stat.S_ISDIR(st.st_mode):
        refuse(path, "it is not a directory", "Remove it, or set DISTLAB_RUNS to a folder of yours.")
    if st.st_uid != os.geteuid():
        refuse(path, f"it belongs to {_user(st.st_uid)}, not to you ({_user(os.geteuid())})",
                "Someone else created it first: set DISTLAB_RUNS to a folder of yours "
                "(for example ~/.cache/distlab-runs), or ask its owner to remove it.")
    if st.st_mode & 0o077:
        refuse(path, f"other users can access it (mode {stat.S_IMODE(st.st_mode):04o})",
                f"If it is yours and holds nothing of anyone else's, run `chmod 700 {path}`; "
                "or set DISTLAB_RUNS to a private folder.")


def check_ancestors(folder: Path, vouched: bool = False) -> None:
    """No other user may rename things inside ``folder`` or any folder above it.

    An ancestor must belong to you or root, and must not be writable by group/others unless it
    has the sticky bit (``/tmp``): otherwise someone could move your root away and put theirs.
    ``vouched``: the root below these folders was checked outside the user namespace this process
    runs in (see :func:`ancestor_problem`).
    """
    view = userns.current()
    folder = Path(os.path.realpath(folder))
    for f in (folder, *folder.parents):
        try:
            st = os.stat(f)
        except FileNotFoundError:
            continue  # created later, by you, 0700
        problem = ancestor_problem(st.st_uid, st.st_mode, os.geteuid(), view, vouched)
        if problem == HIDDEN_OWNER:
            refuse(f, problem.format(uid=st.st_uid), HIDDEN_OWNER_HINT)
        if problem:
            refuse(f, problem.format(user=_user(st.st_uid), mode=stat.S_IMODE(st.st_mode)),
                    "Set DISTLAB_RUNS to a folder inside your home directory.")


HIDDEN_OWNER = ("it shows as owned by uid {uid} (nobody): inside this user namespace (distlab's nodes) "
                "the host's root and every other user look alike, so distlab cannot tell who could replace "
                "what it puts there")
HIDDEN_OWNER_HINT = ("Use distlab outside the namespace first (in the notebook: a launch or distlab.Nodes() "
                     "checks the runs root with real owners), or set DISTLAB_RUNS to that root.")


def ancestor_problem(uid: int, mode: int, me: int, view: userns.UidView, vouched: bool) -> str | None:
    """Why a folder that owns ``uid`` with ``mode`` may not sit above your runs root (a template
    with ``{user}``, ``{mode}`` or ``{uid}``), or None. Pure.

    On the host, owners are real: root or you, and nobody else may write there (sticky ``/tmp``
    aside). Inside the nodes' user namespace (:mod:`distlab.folders.userns`) the host's root and
    every other user show as the same overflow uid, so ``/`` and ``/tmp`` cannot be told from
    alice's home. Such a folder is trusted only when both hold:

    * ``vouched``: the runs root below it carries the mark a check *outside* the namespace left
      (:func:`vouch`). That check saw the real owners of these same folders and refused alice's;
      a folder of root's cannot have changed hands since (only root can chown), and the root itself,
      0700 and yours, cannot have been moved there by anyone else. The notebook always checks
      first: every launch and ``distlab.Nodes()`` itself make their files in the runs root before
      any process starts on a node, and those processes inherit that root.
    * its mode bits still refuse group and others writing (or it is sticky, like ``/tmp``): the
      part of the rule this side can still see.

    Without the mark (a root first made inside the namespace) the folder is refused, as before.
    """
    if uid not in (0, me):
        if not view.hides(uid):
            return "it belongs to {user}, who could replace what distlab puts there"
        if not vouched:
            return HIDDEN_OWNER
    if mode & 0o022 and not mode & stat.S_ISVTX:
        return "others can write to it and it has no sticky bit (mode {mode:04o})"
    return None


def check_private_file(path: Path) -> None:
    """Before unpickling: a regular file of yours that nobody else can write, in a private folder."""
    st = _lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        refuse(path, f"it is not a regular file of yours that only you can write "
                      f"(owner {_user(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o})",
                "distlab will not unpickle it: someone else may have written it.")


def _lstat(path: Path) -> os.stat_result:
    try:
        return os.lstat(path)
    except PermissionError as e:
        refuse(path, f"you may not even look at it ({e.strerror})",
                "It belongs to someone else: set DISTLAB_RUNS to a folder of yours.")


def refuse(path, problem: str, hint: str):
    raise RunFolderError(RUN_FOLDER.format(path=path, problem=problem, hint=hint))


def _user(uid: int) -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def open_private(path: Path, mode: str = "w", **kwargs):
    """Open for writing a file only you can read (0600); never follows a symbolic link.

    ``open`` calls the opener and owns the descriptor from then on: it closes it itself where the file
    object cannot be made (an unknown codec, say), so that error is the one raised. A descriptor closed
    here as well would be closed twice (EBADF in place of the real error, or another thread's file)."""
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= os.O_APPEND if mode.startswith("a") else os.O_TRUNC
    return open(path, mode, opener=lambda name, _flags: os.open(name, flags, PRIVATE_FILE), **kwargs)


def write_private(path: Path, data: str | bytes) -> None:
    with open_private(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


def default_root() -> Path:
    """Where runs go unless told: ``$DISTLAB_RUNS``; else ``$XDG_RUNTIME_DIR/distlab-runs`` when
    that folder of yours exists (a per-user folder nobody else can create anything in); else
    ``<tmp>/distlab-<uid>``. While ``tempfile`` points at a private temporary folder (a launch in
    progress, :mod:`distlab.folders.privtmp`), ``<tmp>`` is not that folder: the root is the one it lives in."""
    chosen = os.environ.get(ENV)
    if chosen:
        return Path(chosen).expanduser()
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and is_private_dir(Path(runtime)):
        return Path(runtime) / "distlab-runs"
    temp = tempfile.gettempdir()
    return root_of(temp) or Path(temp) / f"distlab-{userns.current().outer_uid(os.getuid())}"


def fallback_root() -> Path:
    """Where runs go when someone else took ``<tmp>/distlab-<uid>`` first: your cache folder."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "distlab-runs"


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
    vouched = not userns.current().initial and is_vouched(path)
    check_ancestors(path.parent, vouched)
    try:
        try:
            os.mkdir(path, PRIVATE_DIR)
        except FileNotFoundError:
            os.makedirs(path.parent, PRIVATE_DIR, exist_ok=True)  # the user's own DISTLAB_RUNS path
            check_ancestors(path.parent, vouched)
            os.mkdir(path, PRIVATE_DIR)
    except FileExistsError:
        pass  # checked below, whoever made it
    except PermissionError as e:
        refuse(path, f"you cannot create it ({e.strerror})", "Set DISTLAB_RUNS to a folder of yours.")
    check_private_dir(path)
    if not vouched:
        vouch(path)
    return path


def vouch(root: Path) -> None:
    """Leave in ``root`` (checked, with every folder above it, by the caller) the mark that says
    so: processes inside the nodes' user namespace, where the owners of those folders cannot be
    seen, trust them on its strength (:func:`ancestor_problem`). Written once; only you can write
    in the root, so only your own check can have left it."""
    mark = root / VOUCHED
    if not is_vouched(root):
        write_private(mark, vouch_mark(root))


def vouch_mark(root: Path) -> bytes:
    """What the mark holds: the root's path as the file system spells it, one line. Bytes, written and
    read as they are: no codec (the locale's or UTF-8) stands between, and any name a folder can have fits."""
    return os.fsencode(root) + b"\n"


def is_vouched(root: Path) -> bool:
    """``root`` is a private folder of yours holding the mark of a check of this very path (a mark
    that names another path is from a root that was moved: it vouches for nothing here)."""
    mark = root / VOUCHED
    try:
        st = os.lstat(mark)
        if not (is_private_dir(root) and stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
                and not st.st_mode & 0o077):
            return False
        with open(mark, "rb") as f:
            return f.read() == vouch_mark(root)
    except OSError:
        return False


def host_name(name: str | None = None) -> str:
    """This machine's name as it goes into a folder name (no "/", nothing odd, at most
    :data:`HOST_CHARS`: a longer name keeps its start and a hash of the whole, so two long names
    that share a start, ``gpu-node-0017.cluster...`` and ``gpu-node-0018.cluster...``, stay apart)."""
    import hashlib

    name = socket.gethostname() if name is None else name
    clean = re.sub(r"[^A-Za-z0-9._-]", "_", name) or "host"
    if len(clean) <= HOST_CHARS:
        return clean
    return f"{clean[:HOST_CHARS - 9]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def folder_prefix(pid: int, host: str | None = None) -> str:
    """``proc-<host>-<pid>-``: how the private temporary folder of process ``pid`` starts."""
    return f"{PREFIX}{host_name() if host is None else host}-{pid}-"


def owner_of(name: str) -> tuple[str, int] | None:
    """(host, pid) of a private temporary folder's name; None for any other name, including the
    ``proc-<pid>-*`` of distlab before the host went into the name (whose host is unknown)."""
    m = NAME.match(name)
    return (m.group("host"), int(m.group("pid"))) if m else None


def root_of(folder: str) -> Path | None:
    """The runs root a private temporary folder lives in, when ``folder`` is one (of this process,
    or passed down as ``TMPDIR``): runs started while ``tempfile`` points there belong in that root,
    not in a new root nested inside the folder (and removed with it)."""
    path = Path(folder)
    if owner_of(path.name) is None:
        return None
    return path.parent if is_private_dir(path) and is_private_dir(path.parent) else None


def stale_dirs(root: Path, alive=None, host: str | None = None) -> list[Path]:
    """``proc-<host>-<pid>-*`` folders in ``root`` whose process no longer runs (killed without
    cleanup). Judged by the stamp the process left in its folder (:mod:`distlab.folders.owner`)
    whatever host name it ran under (a node's of :class:`distlab.Nodes` too); a folder without a
    stamp of this machine by its name: this host's, and its pid gone or reused since the folder
    last changed. Another machine's folders are never touched: their pids mean nothing here."""
    alive = pid_alive if alive is None else alive
    host = host_name() if host is None else host
    here = owner.machine()
    stale = []
    for entry in os.scandir(root):
        who = owner_of(entry.name)
        if who is None or not entry.is_dir(follow_symlinks=False):
            continue
        gone = owner.verdict(Path(entry.path), who[1], here)
        if gone is None and who[0] == host:
            gone = not alive(who[1]) or owner.reused(who[1], entry.stat(follow_symlinks=False).st_mtime)
        if gone:
            stale.append(Path(entry.path))
    return stale


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: the folder may still be in use by a pid reuse; keep it
    return True
