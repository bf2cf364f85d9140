"""What distlab.folders.private refuses, message by message and path by path (issue #60). No process.

Owners other than you are played with a made-up ``os.geteuid`` or a made-up ``os.stat`` result for
one path, so these tests say the same as root and as an ordinary user.
"""
import os
import stat
from pathlib import Path

import pytest

from distlab.errors import RUN_FOLDER, RunFolderError
from distlab.folders import private, userns
from distlab.folders.userns import UidView

HOST = UidView()
NODES = UidView(((0, 1001, 1),), overflow=65534)
OTHER = 4242  # a uid with no user name (on any machine these tests run on)
ANCESTOR_HINT = "Set DISTLAB_RUNS to a folder inside your home directory."


def user(uid: int) -> str:
    """How a message names ``uid`` (written out here, not asked of the module under test)."""
    import pwd

    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def refused(call, *args) -> str:
    with pytest.raises(RunFolderError) as e:
        call(*args)
    return str(e.value)


def message(path, problem: str, hint: str) -> str:
    return RUN_FOLDER.format(path=path, problem=problem, hint=hint)


@pytest.fixture
def someone_else(monkeypatch):
    """Everything on disk now belongs to another user: you are uid OTHER."""
    real = os.geteuid()
    monkeypatch.setattr(private.os, "geteuid", lambda: OTHER)
    return real


def fake_owner(monkeypatch, path: Path, uid: int, mode: int | None = None, call: str = "stat") -> None:
    """``os.stat`` (or ``call``: ``lstat``) of ``path`` says it belongs to ``uid`` (and has ``mode``), whatever it
    really is."""
    real_stat = getattr(os, call)

    def stat_(p, *args, **kwargs):
        st = real_stat(p, *args, **kwargs)
        if os.fspath(p) != os.fspath(path):
            return st
        fields = list(st)
        fields[stat.ST_UID] = uid
        if mode is not None:
            fields[stat.ST_MODE] = stat.S_IFMT(st.st_mode) | mode
        return os.stat_result(fields)

    monkeypatch.setattr(private.os, call, stat_)


def temp_like(tmp_path, monkeypatch):
    """A sticky world-writable folder as tempfile's directory, no DISTLAB_RUNS or XDG_RUNTIME_DIR, and the
    cache folder under ``tmp_path``: where the default runs root and its fallback are decided."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setattr("tempfile.tempdir", str(shared))
    monkeypatch.delenv(private.ENV, raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return shared


def test_a_private_dir_is_refused_with_its_path_and_the_whole_reason(tmp_path, monkeypatch):
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    assert refused(private.check_private_dir, link) == message(
        link, f"it is a symbolic link (to {tmp_path})",
        "Another user may have planted it: remove it, or set DISTLAB_RUNS to a folder of yours.")
    file = tmp_path / "file"
    file.write_text("x")
    assert refused(private.check_private_dir, file) == message(
        file, "it is not a directory", "Remove it, or set DISTLAB_RUNS to a folder of yours.")
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o700)
    for bits in (0o710, 0o701, 0o720, 0o702, 0o740, 0o704):
        loose.chmod(bits)
        assert refused(private.check_private_dir, loose) == message(
            loose, f"other users can access it (mode {bits:04o})",
            f"If it is yours and holds nothing of anyone else's, run `chmod 700 {loose}`; "
            "or set DISTLAB_RUNS to a private folder.")
    loose.chmod(0o700)
    private.check_private_dir(loose)


def test_a_private_dir_of_another_user_names_both(tmp_path, someone_else):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    assert refused(private.check_private_dir, folder) == message(
        folder, f"it belongs to {user(someone_else)}, not to you ({user(OTHER)})",
        "Someone else created it first: set DISTLAB_RUNS to a folder of yours "
        "(for example ~/.cache/distlab-runs), or ask its owner to remove it.")


def test_a_folder_you_may_not_look_at_is_refused_with_its_path(tmp_path, monkeypatch):
    def denied(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(private.os, "lstat", denied)
    for check in (private.check_private_dir, private.check_private_file):
        assert refused(check, tmp_path / "x") == message(
            tmp_path / "x", "you may not even look at it (Permission denied)",
            "It belongs to someone else: set DISTLAB_RUNS to a folder of yours.")


def test_a_file_to_unpickle_is_refused_with_its_owner_and_mode(tmp_path, monkeypatch):
    file = tmp_path / "rank0.pt"
    file.write_bytes(b"x")
    hint = "distlab will not unpickle it: someone else may have written it."
    for bits in (0o600, 0o644, 0o755, 0o711, 0o400, 0o604, 0o640):  # only writing by others is refused
        file.chmod(bits)
        private.check_private_file(file)
    me = user(os.geteuid())
    for bits in (0o620, 0o602, 0o622, 0o660, 0o606):
        file.chmod(bits)
        assert refused(private.check_private_file, file) == message(
            file, f"it is not a regular file of yours that only you can write (owner {me}, mode {bits:04o})", hint)
    file.chmod(0o600)
    folder = tmp_path / "folder"
    folder.mkdir(mode=0o700)
    assert refused(private.check_private_file, folder) == message(
        folder, f"it is not a regular file of yours that only you can write (owner {me}, mode 0700)", hint)
    monkeypatch.setattr(private.os, "geteuid", lambda: OTHER)
    assert refused(private.check_private_file, file) == message(
        file, f"it is not a regular file of yours that only you can write (owner {me}, mode 0600)", hint)


def test_what_an_ancestor_may_be_word_for_word():
    others = "others can write to it and it has no sticky bit (mode {mode:04o})"
    owned = "it belongs to {user}, who could replace what distlab puts there"
    assert private.ancestor_problem(1002, 0o755, 1001, HOST, False) == owned
    assert private.ancestor_problem(1002, 0o755, 1001, HOST, True) == owned
    for uid in (0, 1001):  # root's and yours
        for mode in (0o755, 0o700, 0o1777, 0o1757, 0o1775, 0o711, 0o751, 0o715):
            assert private.ancestor_problem(uid, mode, 1001, HOST, False) is None
        for mode in (0o775, 0o757, 0o777, 0o2777):
            assert private.ancestor_problem(uid, mode, 1001, HOST, False) == others
    assert private.ancestor_problem(1, 0o755, 1001, HOST, False) is not None  # uid 1 is not root
    assert private.ancestor_problem(1001, 0o755, 1002, HOST, False) is not None
    assert private.ancestor_problem(65534, 0o755, 0, NODES, False) is private.HIDDEN_OWNER
    assert private.ancestor_problem(65534, 0o755, 0, NODES, True) is None
    assert private.ancestor_problem(65534, 0o777, 0, NODES, True) == others


def test_an_ancestor_others_can_write_is_refused_by_its_path_even_above_missing_folders(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    expected = message(open_dir, "others can write to it and it has no sticky bit (mode 0777)", ANCESTOR_HINT)
    assert refused(private.check_ancestors, open_dir) == expected
    assert refused(private.check_ancestors, open_dir / "missing" / "deeper") == expected  # the walk goes on
    open_dir.chmod(0o1777)
    private.check_ancestors(open_dir / "missing")


def test_an_ancestor_of_another_user_is_refused_by_its_name(tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    (theirs / "mine").mkdir(parents=True, mode=0o700)
    fake_owner(monkeypatch, theirs, OTHER)
    assert refused(private.check_ancestors, theirs / "mine") == message(
        theirs, f"it belongs to uid {OTHER}, who could replace what distlab puts there", ANCESTOR_HINT)


def test_inside_the_nodes_an_ancestor_that_shows_as_nobody_needs_the_mark(tmp_path, monkeypatch):
    host = tmp_path / "host"
    (host / "runs").mkdir(parents=True, mode=0o700)
    host.chmod(0o755)
    fake_owner(monkeypatch, host, 65534)
    monkeypatch.setattr(userns, "current", lambda: NODES)
    expected = message(host, private.HIDDEN_OWNER.format(uid=65534), private.HIDDEN_OWNER_HINT)
    assert refused(private.check_ancestors, host / "runs") == expected  # not vouched unless told
    assert refused(private.check_ancestors, host / "runs", False) == expected
    private.check_ancestors(host / "runs", True)
    assert "(nobody): inside this user namespace" in expected and "uid 65534" in expected


def test_a_taken_name_in_the_shared_temp_folder_is_someone_elses_only_when_it_is(tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    assert not private._taken_by_someone_else(mine)
    assert not private._taken_by_someone_else(tmp_path / "missing")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")  # a dangling link is a name too
    assert not private._taken_by_someone_else(link)
    monkeypatch.setattr(private.os, "geteuid", lambda: OTHER)
    assert private._taken_by_someone_else(mine) and private._taken_by_someone_else(link)
    assert not private._taken_by_someone_else(tmp_path / "missing")


def test_a_root_you_cannot_use_is_not_replaced_by_the_cache_folder(tmp_path, monkeypatch):
    """Only another user's name in the temp folder sends runs to the cache folder; a loose
    folder of yours is an error to fix."""
    shared = temp_like(tmp_path, monkeypatch)
    root = shared / f"distlab-{os.getuid()}"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    with pytest.raises(RunFolderError, match="other users can access it"):
        private.private_root()
    assert not (tmp_path / "cache").exists()


def test_folders_made_for_distlab_runs_are_checked_once_made(tmp_path, monkeypatch):
    """``DISTLAB_RUNS`` below folders that do not exist yet: they are made, then checked like any
    other (a umask that lets the group write leaves the folders between open to it)."""
    chosen = tmp_path / "a" / "b" / "runs"
    monkeypatch.setenv(private.ENV, str(chosen))
    old = os.umask(0o002)
    try:
        assert refused(private.private_root) == message(
            tmp_path / "a", "others can write to it and it has no sticky bit (mode 0775)", ANCESTOR_HINT)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(tmp_path / "a" / "b").st_mode) == 0o700 and not chosen.exists()
    (tmp_path / "a").chmod(0o755)
    assert private.private_root() == chosen
    assert stat.S_IMODE(os.lstat(chosen).st_mode) == 0o700


def test_a_link_of_another_user_on_the_way_is_refused_by_its_path(monkeypatch):
    walks = {"/a/b": ("/real/b", [("/a", 0), ("/real/l", OTHER)]), "/c": ("/real/c", [("/c", 0), ("/d", 1234)])}
    monkeypatch.setattr(private, "follow_links", lambda path: walks[path])
    monkeypatch.setattr(private.os, "geteuid", lambda: 1234)
    assert private.resolved_folder(Path("/c")) == Path("/real/c")  # root's links and yours are followed
    assert refused(private.resolved_folder, Path("/a/b")) == message(
        "/real/l", f"it is a symbolic link that belongs to {user(OTHER)}, who could point it elsewhere",
        "Set DISTLAB_RUNS to a path without other users' links (the folder it leads to, if it is yours).")


def test_a_walk_gives_up_after_forty_links_as_the_kernel_does():
    def chain(n):
        links = {f"/l{i}": f"/l{i + 1}" for i in range(n)}

        def lstat(path):
            kind = stat.S_IFLNK if path in links else stat.S_IFDIR
            return os.stat_result((kind | 0o755, 0, 0, 1, 0, 0, 0, 0, 0, 0))

        return lstat, links.__getitem__

    assert private.follow_links("/l0", *chain(40))[0] == "/l40"
    assert refused(lambda: private.follow_links("/l0", *chain(41))) == message(
        "/l0", "it goes through too many symbolic links", "Set DISTLAB_RUNS to a plain folder.")
    assert private.follow_links("/l0", *chain(3), limit=3)[0] == "/l3"
    with pytest.raises(RunFolderError):
        private.follow_links("/l0", *chain(4), limit=3)


def test_private_files_take_text_or_bytes(tmp_path):
    private.write_private(tmp_path / "t", "text")
    private.write_private(tmp_path / "b", b"\x00bytes")
    assert (tmp_path / "t").read_text() == "text" and (tmp_path / "b").read_bytes() == b"\x00bytes"
    with private.open_private(tmp_path / "t", "a", encoding="latin-1") as f:
        f.write("\u00e9")
    assert (tmp_path / "t").read_bytes() == b"text\xe9"
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    with pytest.raises(ValueError, match="invalid mode"):  # no file object: the descriptor is closed, the error kept
        private.open_private(tmp_path / "t", "wq")
    assert fds is None or len(os.listdir("/proc/self/fd")) == fds


def test_a_file_object_that_cannot_be_made_raises_its_own_error_and_leaves_no_descriptor(tmp_path):
    """The descriptor is open()'s once it exists: closing it again raised EBADF in place of the real error."""
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(LookupError, match="no-such-codec"):
        private.open_private(tmp_path / "t", "w", encoding="no-such-codec")
    assert len(os.listdir("/proc/self/fd")) == fds
    assert stat.S_IMODE((tmp_path / "t").stat().st_mode) == 0o600  # made private before the codec was looked up


def test_where_the_root_goes_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(private.ENV, "~/runs")
    assert private.default_root() == tmp_path / "home" / "runs"
    monkeypatch.delenv(private.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert private.fallback_root() == tmp_path / "cache" / "distlab-runs"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert private.fallback_root() == tmp_path / "home" / ".cache" / "distlab-runs"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert private.fallback_root() == tmp_path / "home" / ".cache" / "distlab-runs"


def test_a_process_is_alive_unless_the_kernel_says_it_is_gone(monkeypatch):
    signals = []

    def kill(pid, sig, error=None):
        signals.append((pid, sig))
        if error:
            raise error

    monkeypatch.setattr(private.os, "kill", lambda pid, sig: kill(pid, sig, ProcessLookupError()))
    assert not private.pid_alive(123)
    monkeypatch.setattr(private.os, "kill", lambda pid, sig: kill(pid, sig, PermissionError()))
    assert private.pid_alive(124)
    assert signals == [(123, 0), (124, 0)]  # signal 0: asked, never sent
    monkeypatch.undo()
    assert private.pid_alive(os.getpid())  # last: any other signal would end this very process


def test_a_temp_root_someone_else_took_sends_runs_to_the_cache_folder_and_says_so_once(tmp_path, monkeypatch):
    """Played with a made-up owner of that one name, so that it holds as an ordinary user too."""
    import warnings

    shared = temp_like(tmp_path, monkeypatch)
    monkeypatch.setattr(private, "_WARNED", set())
    theirs = shared / f"distlab-{os.getuid()}"
    theirs.mkdir(mode=0o700)
    fake_owner(monkeypatch, theirs, OTHER, call="lstat")
    fallback = tmp_path / "cache" / "distlab-runs"

    def a_caller():  # as RunFolder.create is: the warning points at whoever called it
        return private.private_root()

    with pytest.warns(RuntimeWarning) as caught:
        assert a_caller() == fallback  # the line the warning names
    assert len(caught) == 1
    if "MUTANT_UNDER_TEST" not in os.environ:  # mutmut calls every function through frames of its own
        named = open(__file__).read().splitlines()[caught[0].lineno - 1]
        assert caught[0].filename == __file__ and "# the line the warning names" in named
    levels: list = []  # and the level asked for, which holds under mutation too
    with monkeypatch.context() as m:
        m.setattr(private, "_WARNED", set())
        m.setattr(warnings, "warn", lambda *args, stacklevel=1: levels.append(stacklevel))
        assert a_caller() == fallback and levels == [3]  # private_root <- RunFolder.create <- its caller
    assert str(caught[0].message) == message(
        theirs, f"it belongs to {user(OTHER)}, not to you ({user(os.geteuid())})",
        "Someone else created it first: set DISTLAB_RUNS to a folder of yours "
        f"(for example ~/.cache/distlab-runs), or ask its owner to remove it. Using {fallback} instead.")
    assert stat.S_IMODE(os.lstat(fallback).st_mode) == 0o700 and list(theirs.iterdir()) == []
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        assert a_caller() == fallback
    assert again == []
    monkeypatch.setenv(private.ENV, str(theirs))  # asked for by name: no way around it
    with pytest.raises(RunFolderError, match="it belongs to"):
        private.private_root()
    monkeypatch.delenv(private.ENV)
    with pytest.raises(RunFolderError, match="it belongs to"):
        private.private_root(theirs)


def test_the_walk_follows_links_after_dots_and_inside_a_links_target():
    links = {"/a/l1": ("../b/l2", 1001), "/b/l2": ("/c", 0)}

    def lstat(path):
        if path in links:
            return os.stat_result((stat.S_IFLNK | 0o777, 0, 0, 1, links[path][1], 0, 0, 0, 0, 0))
        if path in ("/a", "/b", "/c", "/b/c"):
            return os.stat_result((stat.S_IFDIR | 0o755, 0, 0, 1, 0, 0, 0, 0, 0, 0))
        raise FileNotFoundError(path)

    def readlink(path):
        return links[path][0]

    both = [("/a/l1", 1001), ("/b/l2", 0)]
    assert private.follow_links("/a/l1", lstat, readlink) == ("/c", both)
    assert private.follow_links("/a/./l1", lstat, readlink) == ("/c", both)
    assert private.follow_links("/b/c/../../a/l1", lstat, readlink) == ("/c", both)
    assert private.follow_links("/a/new/x/y", lstat, readlink) == ("/a/new/x/y", [])


def test_an_ancestor_of_yours_is_fine_whoever_you_are(tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    (mine / "runs").mkdir(parents=True, mode=0o700)
    monkeypatch.setattr(private.os, "geteuid", lambda: OTHER)
    fake_owner(monkeypatch, mine, OTHER)
    private.check_ancestors(mine / "runs")


def test_stale_folders_are_judged_by_the_given_liveness_and_never_through_a_link(tmp_path, monkeypatch):
    real_scandir = os.scandir
    monkeypatch.setattr(private.os, "scandir", lambda root: sorted(real_scandir(root), key=lambda e: e.name))
    (tmp_path / "a-note").mkdir()  # not a process folder, listed first
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / f"proc-h-{os.getpid()}-link").symlink_to(target)  # a link with such a name is not a folder of distlab's
    mine = tmp_path / f"proc-h-{os.getpid()}-x"
    mine.mkdir()
    assert private.stale_dirs(tmp_path, alive=lambda pid: pid != os.getpid(), host="h") == [mine]
    assert private.stale_dirs(tmp_path, alive=lambda pid: True, host="h") == []
