"""The run folder's layout, privacy checks and pruning. No worker processes.

The checks are tested here by making the bad cases with this user's own powers (a symlink, a
file, loose modes, an ownership change where root can make one); test_shared_machine.py does the
same with a real second user.
"""
import os
import stat
import time

import pytest

from distlab.errors import RunFolderError
from distlab.folders import private
from distlab.folders.private import check_private_file, private_root
from distlab.folders.runfolder import RunFolder, prune, rank_of
from distlab.launch import engine


@pytest.fixture
def tmp_root(tmp_path, monkeypatch):
    """A /tmp-like sticky world-writable folder as tempfile's directory; DISTLAB_RUNS unset."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setattr("tempfile.tempdir", str(shared))
    monkeypatch.delenv("DISTLAB_RUNS", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return shared


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_runs_go_to_a_private_per_user_root_made_with_mkdtemp(tmp_root):
    run = engine.new_run_dir("demo")
    root = tmp_root / f"distlab-{os.getuid()}"
    assert run.parent == root
    assert mode(root) == 0o700 and mode(run) == 0o700
    assert all(mode(run / sub) == 0o700 for sub in ("logs", "stacks", "ready", "returns", "metrics"))
    assert run.name.split("-")[2] == "demo" and len(run.name.split("-")[-1]) >= 6
    assert engine.new_run_dir("demo") != run  # a new name each time, never an existing folder


NOT_YOURS = "Someone else created it first: set DISTLAB_RUNS to a folder of yours (for example ~/.cache/distlab-runs)"


@pytest.mark.parametrize("make, problem, hint", [
    (lambda p: p.symlink_to(p.parent), "it is a symbolic link",
     "Another user may have planted it: remove it, or set DISTLAB_RUNS to a folder of yours."),
    (lambda p: p.write_text("x"), "it is not a directory", "Remove it, or set DISTLAB_RUNS to a folder of yours."),
    (lambda p: (p.mkdir(), p.chmod(0o755)), "other users can access it (mode 0755)",
     "run `chmod 700 {root}`; or set DISTLAB_RUNS to a private folder."),
    (lambda p: (p.mkdir(), p.chmod(0o1777)), "other users can access it (mode 1777)", "chmod 700"),
])
def test_a_root_that_is_not_private_is_refused_with_a_clear_error(tmp_root, make, problem, hint):
    root = tmp_root / f"distlab-{os.getuid()}"
    make(root)
    with pytest.raises(RunFolderError, match="distlab: cannot use .* for run folders: ") as e:
        engine.new_run_dir("demo")
    assert problem in str(e.value) and str(root) in str(e.value)
    assert hint.format(root=root) in str(e.value)


def test_a_root_of_another_uid_names_both_owners(tmp_root):
    from distlab.folders.private import check_private_dir

    root = tmp_root / "theirs"
    root.mkdir(mode=0o700)
    if os.geteuid() != 0:
        pytest.skip("only root can give a folder away; test_shared_machine.py covers it with a second user")
    os.chown(root, 65534, 65534)
    with pytest.raises(RunFolderError) as e:
        check_private_dir(root)
    import pwd

    me = f"user {pwd.getpwuid(os.geteuid()).pw_name} (uid {os.geteuid()})"
    assert f"it belongs to user {pwd.getpwuid(65534).pw_name} (uid 65534), not to you ({me})" in str(e.value)
    assert str(e.value).endswith(NOT_YOURS + ", or ask its owner to remove it.")


def test_a_folder_you_may_not_look_at_or_create_is_refused_with_its_reason(tmp_root, monkeypatch):
    from distlab.folders import runfolder

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(runfolder.os, "mkdir", denied)
    with pytest.raises(RunFolderError) as e:
        private.private_root(tmp_root / "runs")
    assert f"{tmp_root / 'runs'}" in str(e.value)
    assert "you cannot create it (Permission denied)" in str(e.value)
    assert str(e.value).endswith("Set DISTLAB_RUNS to a folder of yours.")
    monkeypatch.undo()
    monkeypatch.setattr(private.os, "lstat", denied)
    with pytest.raises(RunFolderError) as e:
        private.check_private_dir(tmp_root)
    assert "you may not even look at it (Permission denied)" in str(e.value)
    assert str(e.value).endswith("It belongs to someone else: set DISTLAB_RUNS to a folder of yours.")


def test_open_private_appends_or_truncates_and_never_follows_a_link(tmp_path):
    from distlab.folders.private import open_private

    path = tmp_path / "log"
    with open_private(path) as f:
        f.write("first\n")
    with open_private(path, "a") as f:
        f.write("second\n")
    assert path.read_text() == "first\nsecond\n"
    with open_private(path) as f:  # "w" by default: starts over
        f.write("new\n")
    assert path.read_text() == "new\n" and mode(path) == 0o600
    (tmp_path / "link").symlink_to(path)
    with pytest.raises(OSError):
        open_private(tmp_path / "link", "a")
    assert path.read_text() == "new\n"


def test_distlab_runs_wins_and_is_checked_the_same_way(tmp_path, monkeypatch):
    chosen = tmp_path / "my-runs" / "deeper"
    monkeypatch.setenv("DISTLAB_RUNS", str(chosen))
    run = engine.new_run_dir("demo")
    assert run.parent == chosen and mode(chosen) == 0o700
    assert mode(chosen.parent) == 0o700  # created for DISTLAB_RUNS too, private from the start
    chosen.chmod(0o750)
    with pytest.raises(RunFolderError, match="other users can access it"):
        engine.new_run_dir("demo")


def test_a_root_below_a_folder_others_can_write_without_sticky_bit_is_refused(tmp_path, monkeypatch):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # anyone could rename our root away and put theirs there
    monkeypatch.setenv("DISTLAB_RUNS", str(open_dir / "runs"))
    with pytest.raises(RunFolderError, match="others can write to it and it has no sticky bit"):
        engine.new_run_dir("demo")
    assert not (open_dir / "runs").exists()


def test_files_distlab_writes_are_private(tmp_root):
    from distlab.folders.private import open_private, write_private

    folder = RunFolder.create("demo")
    write_private(folder.run_json, "{}")
    with open_private(folder.metrics(0), "a") as f:
        f.write("{}\n")
    assert mode(folder.run_json) == 0o600 and mode(folder.metrics(0)) == 0o600
    link = folder.path / "link"
    link.symlink_to(folder.run_json)
    with pytest.raises(OSError):
        write_private(link, "planted")  # never follows a symlink
    assert folder.run_json.read_text() == "{}"


def test_nothing_is_unpickled_from_a_file_others_can_write(tmp_root):
    folder = RunFolder.create("demo")
    path = folder.returned(0)
    path.write_bytes(b"x")
    path.chmod(0o666)
    with pytest.raises(RunFolderError, match="distlab will not unpickle it"):
        check_private_file(path)
    path.chmod(0o600)
    check_private_file(path)


def test_layout_lives_in_one_place(tmp_root):
    folder = RunFolder.create("demo")
    for k in (0, 2, 10, 9):
        attempt = folder.make_attempt(k)
        folder.rank_log(attempt, 1, "out").write_text(f"a{k}\n")
    assert [p.name for p in folder.attempts()] == ["attempt0", "attempt2", "attempt9", "attempt10"]
    assert [f.read_text() for f in folder.log_files(1)] == ["a0\n", "a2\n", "a9\n", "a10\n"]
    assert folder.output_streams()[0] == (1, folder.attempt(0) / "rank1.out")
    assert (rank_of(folder.stack(12)), rank_of(folder.metrics(3)), rank_of(folder.run_json)) == (12, 3, None)
    folder.ready(5).write_text("4321")
    assert folder.ready_pids() == {5: 4321}


def test_prune_keeps_the_newest_and_anything_younger_than_a_day(tmp_path):
    root = private_root(tmp_path / "runs")
    now = time.time()
    old = []
    for i in range(25):
        run = root / f"20250101-0000{i:02d}-old-x{i}"
        run.mkdir()
        os.utime(run, (now - 3 * 86400 + i, now - 3 * 86400 + i))
        old.append(run)
    (root / "notes").mkdir()  # not a run folder: never touched
    young = root / "20250101-235959-young-x"
    young.mkdir()
    os.utime(young, (now - 3600, now - 3600))
    gone = prune(root, keep_newest=20, now=now)
    assert sorted(gone) == old[:6]  # the 20 newest are young + the 19 newest old ones
    assert young.exists() and (root / "notes").exists() and all(p.exists() for p in old[6:])


def test_a_long_run_that_still_writes_is_not_pruned(tmp_path):
    root = private_root(tmp_path / "runs")
    now = time.time()
    run = root / "20250101-000000-long-x"
    (run / "logs" / "attempt0").mkdir(parents=True)
    log = run / "logs" / "attempt0" / "rank0.out"
    log.write_text("still going\n")
    for p in (run, run / "logs", run / "logs" / "attempt0"):
        os.utime(p, (now - 5 * 86400, now - 5 * 86400))
    assert prune(root, keep_newest=0, now=now) == []
    os.utime(log, (now - 5 * 86400, now - 5 * 86400))
    assert prune(root, keep_newest=0, now=now) == [run]


def test_a_run_is_as_young_as_its_newest_metrics_file_or_attempt_folder(tmp_path):
    root = private_root(tmp_path / "runs")
    now, old = time.time(), time.time() - 5 * 86400
    runs = {name: root / f"20250101-00000{i}-{name}-x" for i, name in enumerate(("metrics", "attempt", "stale"))}
    for run in runs.values():
        (run / "logs" / "attempt0").mkdir(parents=True)
        (run / "metrics").mkdir()
        (run / "metrics" / "rank0.jsonl").write_text("{}\n")
    young = {"metrics": runs["metrics"] / "metrics" / "rank0.jsonl", "attempt": runs["attempt"] / "logs" / "attempt0"}
    for run in runs.values():
        for p in [run, *run.rglob("*")]:
            if p not in young.values():
                os.utime(p, (old, old))
    assert prune(root, keep_newest=0, now=now) == [runs["stale"]]


def test_creating_a_run_prunes_old_ones(tmp_root, monkeypatch):
    monkeypatch.setattr("distlab.folders.runfolder.PRUNE_EVERY_S", 0)
    root = private_root()
    stale = root / "20200101-000000-stale-x"
    stale.mkdir()
    os.utime(stale, (0, 0))
    for _ in range(20):
        RunFolder.create("fresh")
    assert stale.exists()  # the 20 newest so far
    RunFolder.create("fresh")
    assert not stale.exists()


def test_a_process_prunes_a_root_on_its_first_run_then_at_most_every_ten_minutes(tmp_root, monkeypatch):
    from distlab.folders import runfolder

    calls = []
    monkeypatch.setattr(runfolder, "prune", lambda root: calls.append(root))
    clock = [1000.0]
    monkeypatch.setattr(runfolder.time, "monotonic", lambda: clock[0])
    for _ in range(3):
        RunFolder.create("launch")
    assert calls == [private_root()]  # a launch does not read hundreds of old runs each time
    clock[0] += runfolder.PRUNE_EVERY_S
    RunFolder.create("launch")
    assert len(calls) == 2


def test_a_private_xdg_runtime_dir_is_preferred_to_the_shared_temp_dir(tmp_root, tmp_path, monkeypatch):
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert engine.new_run_dir("demo").parent == runtime / "distlab-runs"
    runtime.chmod(0o755)  # not a private runtime dir: not used
    assert engine.new_run_dir("demo").parent == tmp_root / f"distlab-{os.getuid()}"


def test_a_temp_root_someone_else_created_first_falls_back_to_the_cache_folder(tmp_root, tmp_path):
    """A denial of service no more: the other user's folder is left alone and runs go elsewhere."""
    if os.geteuid() != 0:
        pytest.skip("only root can give a folder away; test_shared_machine.py covers it with a second user")
    theirs = tmp_root / f"distlab-{os.getuid()}"
    theirs.mkdir(mode=0o777)
    os.chown(theirs, 65534, 65534)
    with pytest.warns(RuntimeWarning, match=r"it belongs to user .*Using .*distlab-runs instead"):
        run = engine.new_run_dir("demo")
    assert run.parent == tmp_path / "cache" / "distlab-runs" and mode(run.parent) == 0o700
    assert list(theirs.iterdir()) == []


def test_the_walk_to_the_root_names_every_link_and_its_owner():
    """``follow_links`` on a made-up file system: absolute and relative links, ``..`` after a link,
    parts that do not exist yet."""
    from distlab.folders.private import follow_links

    links = {"/a/l1": ("/b/c", 1001), "/b/c/l2": ("../d", 0)}

    def lstat(path):
        if path in links:
            return os.stat_result((stat.S_IFLNK | 0o777, 0, 0, 1, links[path][1], 0, 0, 0, 0, 0))
        if path in ("/a", "/b", "/b/c", "/b/d", "/b/d/e"):
            return os.stat_result((stat.S_IFDIR | 0o755, 0, 0, 1, 0, 0, 0, 0, 0, 0))
        raise FileNotFoundError(path)

    def readlink(path):
        return links[path][0]

    assert follow_links("/a/l1/l2/e", lstat, readlink) == ("/b/d/e", [("/a/l1", 1001), ("/b/c/l2", 0)])
    assert follow_links("/a/l1/new/deeper", lstat, readlink) == ("/b/c/new/deeper", [("/a/l1", 1001)])
    assert follow_links("/b/./c/../d", lstat, readlink) == ("/b/d", [])


def test_a_link_of_another_uid_on_the_way_to_distlab_runs_is_refused_and_yours_is_resolved(tmp_path, monkeypatch):
    """Before: DISTLAB_RUNS through another user's link was accepted, and kept as written (they
    could re-point the link after the check)."""
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    theirs = tmp_path / "their-link"
    theirs.symlink_to(mine)
    os.lchown(theirs, os.geteuid() + 12345, -1)
    monkeypatch.setenv("DISTLAB_RUNS", str(theirs / "runs"))
    with pytest.raises(RunFolderError, match=rf"cannot use {theirs} for run folders: it is a symbolic link that "
                                             rf"belongs to uid {os.geteuid() + 12345}, who could point it elsewhere"):
        private_root()
    assert not (mine / "runs").exists()
    own = tmp_path / "my-link"
    own.symlink_to(mine)
    monkeypatch.setenv("DISTLAB_RUNS", str(own / "runs"))
    assert private_root() == mine / "runs"  # the checked path, with no link left to re-point
    assert RunFolder.create("demo", prune_old=False).path.parent == mine / "runs"
