"""The runs root inside the nodes' user namespace, where the host's root and other users all show as nobody.

An ordinary user's :class:`distlab.Nodes` run in a user namespace that maps only that user (as 0):
``/`` and ``/tmp`` show as owned by the overflow uid there. These tests play that view with a made-up
:class:`~distlab.folders.userns.UidView` on real folders: no namespace, no process.
"""
import os
from pathlib import Path

import pytest

from distlab.errors import RunFolderError
from distlab.folders import private, userns
from distlab.folders.userns import UidView, parse_uid_map, read_view

HOST = UidView()
NODES = UidView(((0, 1001, 1),), overflow=65534)  # `unshare --user --map-root-user` by uid 1001
CONTAINER = UidView(((0, 100000, 65536),), overflow=65534)  # a rootless container's range


def test_the_uid_map_says_where_a_process_is():
    assert parse_uid_map("         0          0 4294967295\n") == ((0, 0, 4294967295),)
    assert read_view(lambda p: "0 1001 1\n" if p == userns.UID_MAP else "65534\n") == NODES
    assert read_view(lambda p: (_ for _ in ()).throw(FileNotFoundError(p))) == HOST  # no /proc uid map
    assert HOST.initial and not NODES.initial and not CONTAINER.initial
    assert NODES.hides(65534) and not NODES.hides(0) and not NODES.hides(1002)
    assert not HOST.hides(65534)  # on the host, nobody is a real user like any other
    assert not CONTAINER.hides(65534)  # mapped there: a real uid of the container


def test_the_root_is_named_for_the_user_outside_the_nodes_namespace():
    assert NODES.outer_uid(0) == 1001  # inside the nodes you are 0; the kernel that made them is 1001
    assert HOST.outer_uid(1001) == 1001 and HOST.outer_uid(0) == 0
    assert CONTAINER.outer_uid(1000) == 1000  # a range map is a container, not distlab's nodes


@pytest.mark.parametrize("view, uid, mode, vouched, expected", [
    (HOST, 0, 0o755, False, None),
    (HOST, 0, 0o1777, False, None),                      # /tmp
    (HOST, 0, 0o777, False, "others can write"),
    (HOST, 1002, 0o755, False, "it belongs to"),         # alice's folder
    (HOST, 65534, 0o755, True, "it belongs to"),         # a real nobody: a mark never vouches on the host
    (NODES, 0, 0o700, False, None),                      # yours, seen from inside
    (NODES, 65534, 0o755, False, private.HIDDEN_OWNER),  # root's or alice's: cannot tell without the mark
    (NODES, 65534, 0o755, True, None),                   # the kernel checked it outside
    (NODES, 65534, 0o1777, True, None),                  # /tmp, checked outside
    (NODES, 65534, 0o775, True, "others can write"),     # what the mode bits still show is still refused
    (NODES, 65534, 0o757, True, "others can write"),
    (CONTAINER, 65534, 0o755, True, "it belongs to"),
])
def test_which_ancestors_a_runs_root_may_have(view, uid, mode, vouched, expected):
    problem = private.ancestor_problem(uid, mode, 0, view, vouched)
    assert (problem is None) if expected is None else (expected in problem)


@pytest.fixture
def host_folder(tmp_path, monkeypatch):
    """A folder of root's (0755) for a runs root to live in, as /tmp is; tempfile points at it."""
    base = tmp_path / "host"
    base.mkdir(mode=0o755)
    base.chmod(0o755)
    monkeypatch.delenv(private.ENV, raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(base))
    return base


def seen_from_the_nodes(monkeypatch, base: Path) -> None:
    """What a process on the nodes sees: a user namespace that maps only you, where ``base``, a
    folder of the host's root, shows as owned by the overflow uid."""
    os.chown(base, 65534, -1)
    monkeypatch.setattr(userns, "current", lambda: NODES)


def test_a_root_checked_outside_is_trusted_inside_under_folders_that_show_as_nobody(host_folder, monkeypatch):
    root = private.private_root(host_folder / "runs")  # the kernel, outside: real owners
    assert (root / private.VOUCHED).read_text() == f"{root}\n"
    seen_from_the_nodes(monkeypatch, host_folder)
    assert private.private_root(host_folder / "runs") == root  # an agent or rank on a node


def test_the_mark_holds_the_roots_own_bytes_whatever_the_locale_and_the_name(host_folder, monkeypatch):
    """Written in the locale's codec and read as UTF-8, the mark of a root whose name is not UTF-8 (or under a
    non-UTF-8 locale, any non-ASCII name) could not be written or never matched: both sides use the path's bytes."""
    runs = host_folder / os.fsdecode(b"runs-\xff-\xc3\xa9")
    root = private.private_root(runs)
    assert (root / private.VOUCHED).read_bytes() == os.fsencode(root) + b"\n"
    assert private.is_vouched(root)
    seen_from_the_nodes(monkeypatch, host_folder)
    assert private.private_root(runs) == root


def test_without_the_mark_of_an_outside_check_a_folder_that_shows_as_nobody_is_refused(host_folder, monkeypatch):
    seen_from_the_nodes(monkeypatch, host_folder)
    with pytest.raises(RunFolderError) as refused:
        private.private_root(host_folder / "runs")  # made first inside: nobody saw who owns host_folder
    assert "inside this user namespace (distlab's nodes)" in str(refused.value)
    assert "outside the namespace first" in str(refused.value)
    assert not (host_folder / "runs").exists()


@pytest.mark.parametrize("spoil", ["missing", "other path", "writable", "a link"])
def test_a_mark_that_does_not_prove_the_outside_check_vouches_for_nothing(host_folder, monkeypatch, spoil):
    root = private.private_root(host_folder / "runs")
    mark = root / private.VOUCHED
    if spoil == "missing":
        mark.unlink()
    elif spoil == "other path":  # a root moved here from where it was checked
        mark.write_text(f"{host_folder}/elsewhere\n")
    elif spoil == "writable":
        mark.chmod(0o666)
    else:
        other = root / "mark-copy"
        other.write_text(mark.read_text())
        mark.unlink()
        mark.symlink_to(other)
    seen_from_the_nodes(monkeypatch, host_folder)
    with pytest.raises(RunFolderError, match="inside this user namespace"):
        private.private_root(host_folder / "runs")


def test_a_vouched_root_under_a_folder_others_can_write_is_still_refused(host_folder, monkeypatch):
    private.private_root(host_folder / "runs")
    seen_from_the_nodes(monkeypatch, host_folder)
    host_folder.chmod(0o777)
    with pytest.raises(RunFolderError, match="others can write"):
        private.private_root(host_folder / "runs")


def test_inside_the_nodes_the_default_root_is_the_kernels(host_folder, monkeypatch):
    monkeypatch.setattr(userns, "current", lambda: NODES)
    assert private.default_root() == host_folder / "distlab-1001"  # not distlab-0: you are 0 only in there


def test_a_views_edges():
    """Issue #60: where a map starts and ends, and what is read when /proc says less than usual."""
    assert HOST.initial and HOST.covered() == 4294967295
    assert not UidView(((0, 0, 4294967294),)).initial  # every uid as it is, but not all of them
    assert not UidView(((0, 1, 4294967295),)).initial  # all of them, shifted
    assert not NODES.initial and UidView(((0, 0, 10), (10, 10, 4294967285))).initial
    assert CONTAINER.maps(0) and CONTAINER.maps(65535) and not CONTAINER.maps(65536)
    assert not UidView(((5, 0, 1),)).maps(4) and UidView(((5, 0, 1),)).maps(5)
    assert UidView(((0, 1001, 1),), overflow=7).hides(7) and not UidView(((0, 1001, 1),), overflow=7).hides(65534)
    assert UidView(((0, 1001, 1), (1, 2000, 1))).outer_uid(0) == 0  # two single maps: not distlab's nodes
    assert UidView(((3, 1001, 1),)).outer_uid(0) == 0 and UidView(((3, 1001, 1),)).outer_uid(3) == 1001
    assert parse_uid_map("\n 0 1001 1\n\n 1 2000 5\n") == ((0, 1001, 1), (1, 2000, 5))
    with pytest.raises(ValueError):
        parse_uid_map("0 1001\n")
    assert read_view(lambda p: "0 1001 1\n" if p == userns.UID_MAP else "4242\n").overflow == 4242
    assert read_view(lambda p: "0 1001 1\n" if p == userns.UID_MAP else "x\n").overflow == 65534
    unreadable = {userns.UID_MAP: "0 1001 1\n"}
    assert read_view(lambda p: unreadable.get(p) or (_ for _ in ()).throw(OSError(p))) == NODES
    assert read_view(lambda p: "" if p == userns.UID_MAP else "65534\n") == HOST  # an empty map: the host's
    assert read_view(lambda p: "0 x 1\n") == HOST
    assert userns.current() is userns.current() and userns.current() == read_view()


def test_the_view_is_read_once_per_process_and_again_in_a_forked_child(monkeypatch):
    reads = []
    monkeypatch.setattr(userns, "read_view", lambda: reads.append(1) or NODES)
    userns._cached.cache_clear()
    try:
        assert userns.current() is NODES and userns.current() is NODES and len(reads) == 1
        monkeypatch.setattr(os, "getpid", lambda: -7)  # what a forked child sees: another pid
        assert userns.current() is NODES and len(reads) == 2
    finally:
        userns._cached.cache_clear()
