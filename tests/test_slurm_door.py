"""The one-machine cluster's door (distlab.slurm.door), in this process (issue #60: mutated; starts no process):
its ACL, the temporary folder it goes to, and the folders made in it."""
import errno
import os
import stat
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest

from distlab.slurm import door
from distlab.slurm.errors import ClusterError

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the door is root's: chown to root needs root")


def entry(tag: int, perm: int, uid: int = door.ACL_UNDEFINED_ID) -> bytes:
    return struct.pack("<HHI", tag, perm, uid)


def test_an_acl_value_is_the_kernel_s_form():
    value = door.acl_value(7, 1234, 1)
    assert value == (struct.pack("<I", 2) + entry(door.ACL_USER_OBJ, 7) + entry(door.ACL_USER, 1, 1234)
                     + entry(door.ACL_GROUP_OBJ, 0) + entry(door.ACL_MASK, 1) + entry(door.ACL_OTHER, 0))
    assert (door.ACL_USER_OBJ, door.ACL_USER, door.ACL_GROUP_OBJ, door.ACL_MASK, door.ACL_OTHER) == (1, 2, 4, 16, 32)
    assert door.ACL_UNDEFINED_ID == 2**32 - 1 and door.ACL_XATTR == "system.posix_acl_access"


def test_every_named_user_entry_is_read_to_the_last_whole_one():
    head = struct.pack("<I", 2)
    assert door.acl_users(head + entry(door.ACL_USER_OBJ, 7) + entry(door.ACL_USER, 4, 10)
                          + entry(door.ACL_USER, 1, 11)) == {10: 4, 11: 1}
    assert door.acl_users(head + entry(door.ACL_USER, 1, 11) + entry(door.ACL_USER, 5, 12)[:7]) == {11: 1}
    assert door.acl_users(head + entry(door.ACL_GROUP_OBJ, 1, 11)) == {} and door.acl_users(head) == {}
    assert door.acl_users(door.acl_value(7, 4_000_000_000, 2)) == {4_000_000_000: 2}  # uids past 2**31 too
    # read entry by entry: a mask of 2 read from the middle of its entry would look like a named user
    assert door.acl_users(head + entry(door.ACL_MASK, 2) + entry(door.ACL_OTHER, 2)) == {}


def test_the_kernel_keeps_the_acl_that_lets_one_user_in(tmp_path):
    folder = tmp_path / "door"
    folder.mkdir(mode=0o700)
    door.grant_only(folder, 1234, 1)
    assert os.getxattr(folder, door.ACL_XATTR) == door.acl_value(7, 1234, 1)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o710  # the mask shows as the group's bits
    door.grant_only(folder, 99, 4, owner=5)
    assert os.getxattr(folder, door.ACL_XATTR) == door.acl_value(5, 99, 4)


def test_a_file_system_without_acls_is_said_with_its_fix(tmp_path, monkeypatch):
    def unsupported(*args, **kwargs):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "setxattr", unsupported)
    with pytest.raises(ClusterError) as refused:
        door.grant_only(tmp_path / "door", 1234, 1)
    assert str(refused.value) == str(ClusterError(
        f"could not let its job user alone into {tmp_path / 'door'} with a POSIX ACL "
        f"({os.strerror(errno.EOPNOTSUPP)})",
        f"Use a temporary directory on a file system with ACLs (TMPDIR=...), or mount {tmp_path} with the acl option."))
    assert refused.value.__suppress_context__


def test_a_link_gets_no_acl(tmp_path):
    """follow_symlinks=False: the ACL would go to whatever the link names (Linux refuses ACLs on links)."""
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(ClusterError):
        door.grant_only(tmp_path / "link", 1234, 1)
    with pytest.raises(OSError):
        os.getxattr(target, door.ACL_XATTR)


def dir_stat(uid: int, mode: int, kind: int = stat.S_IFDIR):
    return SimpleNamespace(st_uid=uid, st_mode=kind | mode)


@pytest.mark.parametrize("found, expected", [
    (dir_stat(0, 0o1777), None), (dir_stat(0, 0o1711), None),
    (dir_stat(0, 0o1776), "not every user may enter it"),
    (dir_stat(0, 0o777), "is not sticky (whoever may write there may rename what it holds)"),
    (dir_stat(1, 0o1777), "belongs to uid 1, not root"),
    (dir_stat(0, 0o1777, stat.S_IFLNK), "is a symbolic link"),
    (dir_stat(0, 0o1777, stat.S_IFREG), "is not a folder"),
])
def test_which_temporary_folders_may_hold_a_door(found, expected):
    assert door.usable_tmp("/t", lambda path: found) == expected


def test_a_folder_that_cannot_be_read(tmp_path):
    assert door.usable_tmp(str(tmp_path / "none")) == f"cannot be read ({os.strerror(errno.ENOENT)})"
    assert door.SYSTEM_TMPS == ("/tmp", "/var/tmp")


def test_tmpdir_that_is_only_a_link_to_the_system_one_is_not_said(tmp_path):
    link = tmp_path / "tmp"
    link.symlink_to(os.path.realpath("/tmp"))
    folders = {"/tmp": dir_stat(0, 0o1777), str(link): dir_stat(0, 0o777, stat.S_IFLNK)}
    said: list = []
    assert door.system_tmp({"TMPDIR": str(link)}, folders.__getitem__, said.append) == "/tmp" and said == []


def test_why_tmpdir_was_passed_over_goes_to_stderr_by_default(capsys):
    folders = {"/tmp": dir_stat(0, 0o1777), "/open": dir_stat(0, 0o777)}
    assert door.system_tmp({"TMPDIR": "/open"}, folders.__getitem__) == "/tmp"
    assert capsys.readouterr().err == ("distlab.slurm: TMPDIR=/open is not sticky (whoever may write there may rename "
                                       "what it holds): the cluster's door and database go to /tmp instead\n")


def test_no_usable_temporary_folder_is_an_error_with_its_fix():
    with pytest.raises(ClusterError) as refused:
        door.system_tmp({"TMPDIR": "/open"}, lambda path: dir_stat(0, 0o777), print)
    assert str(refused.value) == str(ClusterError("no temporary directory that is root's, sticky and enterable by "
                                                  "every user", "Make /tmp root's and 1777 (chmod 1777 /tmp)."))


def test_the_real_environment_and_folders_are_the_defaults(monkeypatch):
    monkeypatch.setenv("TMPDIR", "/")  # root's, but not sticky
    said: list = []
    assert door.system_tmp(say=said.append) in door.SYSTEM_TMPS and said[0].startswith("distlab.slurm: TMPDIR=/ ")


def modes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): stat.S_IMODE(p.stat().st_mode) for p in sorted(folder.rglob("*"))}


@as_root
def test_the_door_is_root_s_with_its_spools_and_jobs(tmp_path):
    account = SimpleNamespace(pw_uid=1234, pw_gid=4321)
    (tmp_path / "private").mkdir()
    made = door.make_door(tmp_path / "private", account, ("node1", "node2"), tmp=str(tmp_path))
    assert made.parent == tmp_path and made.name.startswith("distlab-slurm-")
    assert (tmp_path / "private" / "door").read_text() == str(made)
    assert (made.stat().st_uid, made.stat().st_gid) == (0, 4321)
    assert door.acl_users(os.getxattr(made, door.ACL_XATTR)) == {1234: 1}
    assert modes(made) == {"jobs": 0o711, "spool": 0o711, "spool/node1": 0o711, "spool/node2": 0o711}
    for sub in ("spool", "spool/node1", "spool/node2"):
        os.chmod(made / sub, 0o755)  # slurmd, when it starts
    door.close_spools(made, ("node1",))
    assert modes(made) == {"jobs": 0o711, "spool": 0o711, "spool/node1": 0o711, "spool/node2": 0o755}


@as_root
def test_a_door_made_with_a_restrictive_umask_still_lets_the_job_user_in(tmp_path, monkeypatch):
    """os.mkdir's mode is cut by the umask: each folder is set to 0711 afterwards."""
    monkeypatch.setattr(door, "system_tmp", lambda: str(tmp_path))
    old = os.umask(0o077)
    try:
        made = door.make_door(tmp_path, SimpleNamespace(pw_uid=1234, pw_gid=4321), ("node1",))
    finally:
        os.umask(old)
    assert made.parent == tmp_path
    assert modes(made) == {"jobs": 0o711, "spool": 0o711, "spool/node1": 0o711}
