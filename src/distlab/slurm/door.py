"""The one-machine cluster's *door*: the one folder its job user reaches (conf, munged's socket, spool, jobs).

It is made in the system's temporary directory (short: munged's socket path must fit 107 bytes), root's,
mode 0700 plus a POSIX ACL entry that lets the job user alone enter it (``user:<job user>:--x``; the ACL's
group entry grants nothing, so ``ls -l`` shows ``rwx--x---``). A group would not do: whoever else has the
job user's gid (a second ``/etc/group`` entry with that gid, an LDAP group) would pass any check that lists
the group's members, get munge credentials and run jobs. The door keeps the job user's gid as its group
only as a marker (:func:`distlab.slurm.account.other_doors`).

:func:`system_tmp` picks where it goes: ``$TMPDIR``, ``/tmp`` or ``/var/tmp``, only when root owns the
folder and it is sticky: in a world-writable folder without the sticky bit, or one another user owns,
that user could rename the door or the database folder and plant a socket of its own in its place.

Runs in the kernel (and :func:`system_tmp` also in the watchdog). Pure but for the folder's making.
"""
from __future__ import annotations

import os
import pwd
import stat
import struct
import sys
import tempfile
from pathlib import Path

from distlab.folders.private import write_private

from .errors import ClusterError

DOOR_RECORD = "door"  # in the private folder: where the door is (removed with the cluster)
#: the folders a cluster's door and database may go to, in order (``$TMPDIR`` first)
SYSTEM_TMPS = ("/tmp", "/var/tmp")

#: POSIX ACL in its extended attribute's form (linux/posix_acl_xattr.h): version, then (tag, perm, id) entries
ACL_XATTR = "system.posix_acl_access"
ACL_VERSION = 2
ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_MASK, ACL_OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
ACL_UNDEFINED_ID = 0xFFFFFFFF


def acl_value(owner: int, uid: int, perm: int) -> bytes:
    """The ACL ``user::<owner>, user:<uid>:<perm>, group::---, mask::<perm>, other::---`` (pure: tests read it)."""
    entries = [(ACL_USER_OBJ, owner, ACL_UNDEFINED_ID), (ACL_USER, perm, uid), (ACL_GROUP_OBJ, 0, ACL_UNDEFINED_ID),
               (ACL_MASK, perm, ACL_UNDEFINED_ID), (ACL_OTHER, 0, ACL_UNDEFINED_ID)]
    return struct.pack("<I", ACL_VERSION) + b"".join(struct.pack("<HHI", *entry) for entry in entries)


def acl_users(value: bytes) -> dict[int, int]:
    """uid -> permission bits of the named-user entries of an ACL value (pure)."""
    found = {}
    for offset in range(4, len(value) - 7, 8):
        tag, perm, uid = struct.unpack_from("<HHI", value, offset)
        if tag == ACL_USER:
            found[uid] = perm
    return found


def grant_only(path: Path, uid: int, perm: int, owner: int = 7) -> None:
    """Let user ``uid`` (and root, the owner) alone use ``path`` with ``perm`` (1: enter, 4: read): its group
    and everybody else get nothing, whatever their groups."""
    try:
        os.setxattr(path, ACL_XATTR, acl_value(owner, uid, perm), follow_symlinks=False)
    except OSError as e:
        raise ClusterError(f"could not let its job user alone into {path} with a POSIX ACL ({e.strerror})",
                           f"Use a temporary directory on a file system with ACLs (TMPDIR=...), or mount "
                           f"{path.parent} with the acl option.") from None


def usable_tmp(path: str, lstat=os.lstat) -> str | None:
    """Why folder ``path`` may not hold a door or a database folder; None when it may (root's, sticky,
    enterable by everybody: a /tmp)."""
    try:
        st = lstat(path)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder" if not stat.S_ISLNK(st.st_mode) else "is a symbolic link"
    if st.st_uid != 0:
        return f"belongs to uid {st.st_uid}, not root"
    if not st.st_mode & stat.S_ISVTX:
        return "is not sticky (whoever may write there may rename what it holds)"
    if not st.st_mode & 0o001:
        return "not every user may enter it"
    return None


def system_tmp(environ=os.environ, lstat=os.lstat, say=None) -> str:
    """The folder for the door and the database folder: ``$TMPDIR`` when :func:`usable_tmp`, else the first
    usable system temp folder, saying (``say``, by default stderr) why ``$TMPDIR`` was passed over."""
    wanted = environ.get("TMPDIR")
    if wanted:
        why = usable_tmp(wanted, lstat)
        if why is None:
            return wanted
    for candidate in SYSTEM_TMPS:
        if usable_tmp(candidate, lstat) is None:
            if wanted and os.path.realpath(wanted) != os.path.realpath(candidate):
                (say or _say)(f"distlab.slurm: TMPDIR={wanted} {why}: the cluster's door and database go to "
                              f"{candidate} instead")
            return candidate
    raise ClusterError("no temporary directory that is root's, sticky and enterable by every user",
                       "Make /tmp root's and 1777 (chmod 1777 /tmp).")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def make_door(folder: Path, account: pwd.struct_passwd, node_spools=(), tmp: str | None = None) -> Path:
    """The door (see the module docstring), with ``spool/`` and ``jobs/`` (root's, 0711: the job user enters its
    own folders there but cannot rename or plant entries)."""
    door = Path(tempfile.mkdtemp(prefix="distlab-slurm-", dir=tmp or system_tmp()))
    write_private(folder / DOOR_RECORD, str(door))
    os.chown(door, 0, account.pw_gid)
    grant_only(door, account.pw_uid, 1)
    os.mkdir(door / "spool", 0o711)  # slurmd keeps each job's batch script in a folder of the job's user here
    os.chmod(door / "spool", 0o711)
    for host in node_spools:  # on nodes: one spool per slurmd (SlurmdSpoolDir=.../spool/%n)
        os.mkdir(door / "spool" / host, 0o711)
        os.chmod(door / "spool" / host, 0o711)
    os.mkdir(door / "jobs", 0o711)  # root's: the job user enters its own folders here, but renames nothing
    os.chmod(door / "jobs", 0o711)
    return door


def close_spools(door: Path, hosts) -> None:
    """Once slurmd runs: its spool (one per node: ``spool/<host>``) back to 0711. slurmd makes it 0755
    when it starts, and the job user could then list every job's folder there."""
    for spool in [door / "spool", *(door / "spool" / host for host in hosts)]:
        os.chmod(spool, 0o711)
