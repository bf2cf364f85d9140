"""The run folder's layout, privacy checks and pruning. No worker processes.

The checks are tested here by making the bad cases with this user's own powers (a symlink, a
file, loose modes, an ownership change where root can make one); test_shared_machine.py does the
same with a real second user.
"""
import os
import stat
import time

import pytest

from distlab import engine
from distlab.errors import RunFolderError
from distlab.runfolder import RunFolder, check_private_file, private_root, prune, rank_of


@pytest.fixture
def tmp_root(tmp_path, monkeypatch):
    """A /tmp-like sticky world-writable folder as tempfile's directory; DISTLAB_RUNS unset."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setattr("tempfile.tempdir", str(shared))
    monkeypatch.delenv("DISTLAB_RUNS", raising=False)
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


@pytest.mark.parametrize("make, problem", [
    (lambda p: p.symlink_to(p.parent), "it is a symbolic link"),
    (lambda p: p.write_text("x"), "it is not a directory"),
    (lambda p: (p.mkdir(), p.chmod(0o755)), "other users can access it (mode 0755)"),
    (lambda p: (p.mkdir(), p.chmod(0o1777)), "other users can access it (mode 1777)"),
])
def test_a_root_that_is_not_private_is_refused_with_a_clear_error(tmp_root, make, problem):
    root = tmp_root / f"distlab-{os.getuid()}"
    make(root)
    with pytest.raises(RunFolderError, match="distlab: cannot use .* for run folders: ") as e:
        engine.new_run_dir("demo")
    assert problem in str(e.value) and str(root) in str(e.value)
    assert "DISTLAB_RUNS" in str(e.value) or "chmod 700" in str(e.value)


def test_distlab_runs_wins_and_is_checked_the_same_way(tmp_path, monkeypatch):
    chosen = tmp_path / "my-runs" / "deeper"
    monkeypatch.setenv("DISTLAB_RUNS", str(chosen))
    run = engine.new_run_dir("demo")
    assert run.parent == chosen and mode(chosen) == 0o700
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
    from distlab.runfolder import open_private, write_private

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


def test_creating_a_run_prunes_old_ones(tmp_root):
    root = private_root()
    stale = root / "20200101-000000-stale-x"
    stale.mkdir()
    os.utime(stale, (0, 0))
    for _ in range(20):
        RunFolder.create("fresh")
    assert stale.exists()  # the 20 newest so far
    RunFolder.create("fresh")
    assert not stale.exists()
