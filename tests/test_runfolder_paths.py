"""A run folder's every path, name and edge of pruning, one by one (issue #60). No process."""
import os
import re
import stat
import time
from pathlib import Path

import pytest

from distlab.errors import RunFolderError
from distlab.folders import runfolder
from distlab.folders.private import private_root
from distlab.folders.runfolder import RunFolder, last_change, prune, rank_of, store_name


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_every_path_of_a_run_folder():
    f = RunFolder("/r")
    assert repr(f) == "RunFolder('/r')" and os.fspath(f) == "/r" and f.path == Path("/r")
    assert f.run_json == Path("/r/run.json") and f.script("main") == Path("/r/main.py")
    assert f.data("values") == Path("/r/values.pt")
    assert (f.agent_plan, f.agent_json, f.agent_log) == (Path("/r/agent-plan.json"), Path("/r/agent.json"),
                                                          Path("/r/agent.log"))
    assert RunFolder.node_file(f.agent_json, 1) == Path("/r/agent-node1.json")
    assert RunFolder.node_file(f.agent_log, 0) == Path("/r/agent-node0.log")
    assert RunFolder.node_file(f.agent_json, None) == f.agent_json
    assert f.logs == Path("/r/logs") and f.attempt("3") == Path("/r/logs/attempt3")
    assert f.attempt(0) == f.logs / "attempt0"
    assert RunFolder.rank_log(Path("/a"), 2, "error.json") == Path("/a/rank2.error.json")
    assert f.stack(1) == Path("/r/stacks/rank1.txt") and f.ready(2) == Path("/r/ready/rank2")
    assert f.returned(3) == Path("/r/returns/rank3.pt") and f.metrics(4) == Path("/r/metrics/rank4.jsonl")
    assert f.store("2", 5) == Path("/r/stores/attempt2-5") and store_name(1, "0") == "attempt1-0"
    assert [rank_of(Path(n)) for n in ("rank7", "rank12.out", "rank1.error.json", "rank", "xrank1", "rank1x")] == \
        [7, 12, 1, None, None, None]


def test_a_run_folder_is_made_private_with_a_name_that_says_when_and_what(tmp_path):
    root = tmp_path / "runs"
    before = time.strftime("%Y%m%d-%H%M%S")
    f = RunFolder.create("my run/1", root, prune_old=False)
    after = time.strftime("%Y%m%d-%H%M%S")
    assert f.path.parent == root and mode(f.path) == 0o700
    stamp, rest = f.path.name[:15], f.path.name[16:]
    assert before <= stamp <= after and f.path.name[15] == "-"
    assert rest.startswith("my_run_1-") and len(rest) > len("my_run_1-")
    assert sorted(p.name for p in f.path.iterdir()) == sorted(runfolder.SUBFOLDERS)
    assert all(mode(f.path / s) == 0o700 for s in runfolder.SUBFOLDERS) and "stores" in runfolder.SUBFOLDERS
    assert RunFolder.create("", root, prune_old=False).path.name[16:].startswith("run-")
    long = RunFolder.create("x" * 50 + "Z", root, prune_old=False).path.name[16:]
    assert long.startswith("x" * 40 + "-") and "Z" not in long  # mkdtemp draws lower case
    assert RunFolder.create("a.b_c-D9", root, prune_old=False).path.name[16:].startswith("a.b_c-D9-")


def test_creating_prunes_only_when_asked(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(runfolder, "prune_if_due", lambda root: calls.append(root))
    RunFolder.create("a", tmp_path / "runs", prune_old=False)
    assert calls == []
    RunFolder.create("a", tmp_path / "runs")
    assert calls == [tmp_path / "runs"]


def test_an_attempt_folder_is_made_once_and_checked_when_it_exists(tmp_path):
    f = RunFolder.create("a", tmp_path / "runs", prune_old=False)
    first = f.make_attempt(0)
    assert first == f.attempt(0) and mode(first) == 0o700
    (first / "rank0.out").write_text("kept\n")
    assert f.make_attempt("0") == first and (first / "rank0.out").read_text() == "kept\n"
    first.chmod(0o755)
    with pytest.raises(RunFolderError, match="other users can access it"):
        f.make_attempt(0)
    with pytest.raises(RunFolderError, match="other users can access it"):
        RunFolder(first).check()
    f.check()
    f.path.chmod(0o750)
    with pytest.raises(RunFolderError, match=re.escape(f"cannot use {f.path} for run folders")):
        f.check()


def test_logs_streams_and_pids_read_back(tmp_path):
    f = RunFolder.create("a", tmp_path / "runs", prune_old=False)
    a0, a1 = f.make_attempt(0), f.make_attempt(1)
    (f.logs / "attemptx").mkdir()  # not an attempt
    (f.logs / "other").mkdir()
    for a in (a0, a1):
        for name in ("rank0.out", "rank0.err", "rank0.error.json", "rank1.out", "rankx.out"):
            (a / name).write_text(name)
    assert f.attempts() == [a0, a1]
    assert f.log_files(0) == [a0 / "rank0.out", a0 / "rank0.err", a1 / "rank0.out", a1 / "rank0.err"]
    assert f.log_files(1) == [a0 / "rank1.out", a1 / "rank1.out"] and f.log_files(2) == []
    assert f.output_streams() == [(0, a0 / "rank0.err"), (0, a0 / "rank0.out"), (1, a0 / "rank1.out"),
                                  (0, a1 / "rank0.err"), (0, a1 / "rank0.out"), (1, a1 / "rank1.out")]
    for r in (2, 0, 10):
        f.metrics(r).write_text("{}\n")
    (f.path / "metrics" / "rankx.jsonl").write_text("{}\n")
    (f.path / "metrics" / "rank3.txt").write_text("{}\n")
    assert f.metric_streams() == [(0, f.metrics(0)), (10, f.metrics(10)), (2, f.metrics(2))]
    f.ready(1).write_text("77")
    f.ready(2).write_text("not a pid")
    f.ready(3).mkdir()  # unreadable as a file
    f.ready(4).write_text("88")
    assert f.ready_pids() == {1: 77, 4: 88}


def test_pruning_is_due_first_then_once_the_interval_has_passed():
    root = Path(f"/nowhere-{time.time()}")
    assert runfolder._prune_due(root, now=100.0)
    assert not runfolder._prune_due(root, now=100.0 + runfolder.PRUNE_EVERY_S - 1)
    assert runfolder._prune_due(root, now=100.0 + runfolder.PRUNE_EVERY_S)  # exactly the interval: due
    assert not runfolder._prune_due(root, now=100.0 + runfolder.PRUNE_EVERY_S + 1)
    assert runfolder._prune_due(Path(f"{root}-other"), now=101.0)  # per root
    assert runfolder.PRUNE_EVERY_S == 600 and runfolder.KEEP_NEWEST == 20 and runfolder.KEEP_YOUNGER_S == 86400


def test_prune_if_due_prunes_the_checked_root(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(runfolder, "prune", lambda root: calls.append(root))
    root = tmp_path / "runs"
    runfolder.prune_if_due(root)
    runfolder.prune_if_due(root)
    assert calls == [root] and mode(root) == 0o700


def test_pruning_edges(tmp_path):
    root = private_root(tmp_path / "runs")
    now = 10 * 86400.0
    runs = []
    for i in range(3):
        run = root / f"20250101-00000{i}-r-x"
        run.mkdir()
        os.utime(run, (now - 1000 + i, now - 1000 + i))
        runs.append(run)
    link = root / "20250101-000009-link-x"
    link.symlink_to(runs[0])  # a link with a run's name is not a run: never followed nor removed
    file = root / "20250101-000008-file-x"
    file.write_text("")
    assert prune(root, keep_newest=1, younger_s=1000, now=now) == []  # exactly as old as allowed: kept
    assert prune(root, keep_newest=1, younger_s=998, now=now) == [runs[1], runs[0]]
    assert runs[2].exists() and link.is_symlink() and file.exists()
    assert not runs[0].exists()


def test_defaults_keep_twenty_runs_and_a_day(tmp_path):
    root = private_root(tmp_path / "runs")
    now = time.time()
    runs = []
    for i in range(21):
        run = root / f"20250101-0000{i:02d}-r-x"
        run.mkdir()
        os.utime(run, (now - 3600 - i, now - 3600 - i))
        runs.append(run)
    assert prune(root, now=now) == []  # 21 runs, all younger than a day
    os.utime(runs[20], (now - 86400 + 60, now - 86400 + 60))
    assert prune(root, now=now) == []
    os.utime(runs[20], (now - 86400 - 60, now - 86400 - 60))
    os.utime(runs[19], (now - 86400 - 50, now - 86400 - 50))
    assert prune(root, now=now) == [runs[20]]  # the 20 newest stay, however old
    assert prune(root) == []


def test_a_runs_last_change_looks_at_attempts_their_files_and_metrics_only(tmp_path):
    run = tmp_path / "run"
    for d in ("logs/attempt0", "logs/other", "metrics"):
        (run / d).mkdir(parents=True)
    (run / "logs" / "attempt-note").write_text("")  # an attempt-named file counts by itself
    (run / "logs" / "attempt0" / "rank0.out").write_text("")
    (run / "logs" / "other" / "x").write_text("")
    (run / "metrics" / "rank0.jsonl").write_text("")
    (run / "returns").mkdir()

    def at(path, t):
        os.utime(path, (t, t))

    for p in [run, *run.rglob("*")]:
        at(p, 100)
    assert last_change(run) == 100
    at(run / "logs" / "other" / "x", 900)
    at(run / "logs" / "other", 900)
    at(run / "logs", 900)
    at(run / "returns", 900)
    assert last_change(run) == 100
    for path, t in ((run, 200), (run / "logs" / "attempt-note", 300), (run / "logs" / "attempt0", 400),
                    (run / "logs" / "attempt0" / "rank0.out", 500), (run / "metrics" / "rank0.jsonl", 600)):
        at(path, t)
        assert last_change(run) == t
    assert last_change(tmp_path) == os.lstat(tmp_path).st_mtime  # no logs, no metrics: the folder itself
    assert runfolder._entries(str(tmp_path / "missing")) == []


def test_a_link_in_logs_or_metrics_counts_by_its_own_time_not_its_targets(tmp_path):
    """A run's age is what the run wrote: a link inside it (placed there by hand, or by a script that links
    a log elsewhere) counts by the link's own time; what it points to, and whether that still exists, is
    not read (a dangling link must not make the run unreadable, and prune must not follow it out)."""
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "metrics").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "rank0.out").write_text("")
    os.symlink(elsewhere, run / "logs" / "attempt0")
    os.symlink(elsewhere / "rank0.out", run / "metrics" / "rank0.jsonl")
    os.symlink(tmp_path / "gone", run / "logs" / "attempt1")  # dangling
    os.symlink(tmp_path / "gone", run / "metrics" / "rank1.jsonl")
    (run / "logs" / "attempt2").mkdir()
    os.symlink(elsewhere / "rank0.out", run / "logs" / "attempt2" / "rank0.out")
    os.symlink(tmp_path / "gone", run / "logs" / "attempt2" / "rank1.out")
    for path in (elsewhere, elsewhere / "rank0.out"):
        os.utime(path, (900, 900))
    for path in (run / "logs" / "attempt0", run / "metrics" / "rank0.jsonl", run / "logs" / "attempt1",
                 run / "metrics" / "rank1.jsonl", run / "logs" / "attempt2" / "rank0.out",
                 run / "logs" / "attempt2" / "rank1.out", run / "logs" / "attempt2"):
        os.utime(path, (100, 100), follow_symlinks=False)
    os.utime(run, (50, 50))
    assert last_change(run) == 100
    os.utime(run / "metrics" / "rank1.jsonl", (300, 300), follow_symlinks=False)
    assert last_change(run) == 300


def test_a_run_folder_that_cannot_be_removed_does_not_stop_the_prune(tmp_path, monkeypatch):
    """Another user's file in a run (or a file system gone read-only) makes its removal fail: prune goes on
    with the other runs, and a later prune tries again."""
    root = private_root(tmp_path / "runs")
    now = time.time()
    runs = []
    for i in range(3):
        run = root / f"20250101-00000{i}-r-x"
        (run / "logs").mkdir(parents=True)
        (run / "logs" / ("stuck.out" if i == 0 else "rank0.out")).write_text("")
        for path in (run, run / "logs"):
            os.utime(path, (now - 5 * 86400, now - 5 * 86400))
        runs.append(run)
    unlink = os.unlink

    def refuse(path, *args, **kwargs):
        if os.fspath(path).endswith("stuck.out"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refuse)
    assert sorted(prune(root, keep_newest=0, now=now)) == runs
    assert (runs[0] / "logs" / "stuck.out").exists() and not runs[1].exists() and not runs[2].exists()


def test_a_link_named_like_a_run_is_never_pruned_nor_followed(tmp_path):
    """Only real folders are runs: a link in the root (a learner's shortcut to a run kept elsewhere) is
    neither counted nor removed, and what it points to stays."""
    root = private_root(tmp_path / "runs")
    now = time.time()
    kept = tmp_path / "kept-run"
    kept.mkdir()
    (kept / "rank0.out").write_text("")
    link = root / "20250101-000000-shortcut-x"
    os.symlink(kept, link)
    for path in (kept, kept / "rank0.out"):
        os.utime(path, (now - 5 * 86400, now - 5 * 86400))
    os.utime(link, (now - 5 * 86400, now - 5 * 86400), follow_symlinks=False)
    assert prune(root, keep_newest=0, now=now) == []
    assert link.is_symlink() and (kept / "rank0.out").exists()
