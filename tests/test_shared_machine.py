"""Another user of the same machine, played by a real second account.

The tests run as root (as CI does): a fixture creates an unprivileged user with ``useradd`` and
runs the attacker's side as that user (``runuser``), with plain shell commands. Each attack
below worked against distlab's old fixed ``<tmp>/distlab-runs`` folder.
"""
import os
import stat
from pathlib import Path

import pytest
import torch
from fake_kernel import run_cells
from second_user import OTHER, as_other, other_python

import distlab
from distlab.errors import RunFolderError
from distlab.folders import private
from distlab.folders.runfolder import RunFolder
from distlab.launch import engine

CELLS = run_cells(
    """
    import torch
    SCALE = torch.full((3,), 2.0)
    """,
    """
    def scaled(rank, x):
        print("secret output", flush=True)
        return SCALE * x + rank
    """,
)


def my_root(shared_tmp: Path) -> Path:
    return shared_tmp / f"distlab-{os.getuid()}"


def test_another_user_cannot_take_the_runs_root_first(other_user, shared_tmp):
    """Before: a RunFolderError, so another user could stop all your runs (a denial of service).
    Now their folder is left alone and your runs go to your cache folder."""
    trap = my_root(shared_tmp)
    old_trap = shared_tmp / "distlab-runs"  # the old fixed name
    assert as_other(f"mkdir -m 777 {trap} {old_trap}").returncode == 0
    with pytest.warns(RuntimeWarning, match=rf"it belongs to user {OTHER} \(uid {other_user.pw_uid}\), not to you"):
        res = distlab.spawn(CELLS["scaled"], args=(torch.ones(3),), nprocs=1, view=None)
    assert res.run_dir.parent == shared_tmp / "root-cache" / "distlab-runs"
    assert list(trap.iterdir()) == [] and list(old_trap.iterdir()) == []  # nothing of ours went there


def test_a_symlink_planted_as_the_root_is_not_followed(other_user, shared_tmp):
    theirs = shared_tmp / "theirs"
    assert as_other(f"mkdir -m 777 {theirs} && ln -s {theirs} {my_root(shared_tmp)}").returncode == 0
    with pytest.warns(RuntimeWarning, match=f"it is a symbolic link \\(to {theirs}\\)"):
        run = engine.new_run_dir("demo")
    assert list(theirs.iterdir()) == [] and run.parent == shared_tmp / "root-cache" / "distlab-runs"


def test_a_root_owned_by_someone_else_is_a_clear_error_not_a_permission_error(other_user, shared_tmp, monkeypatch,
                                                                              readable_src):
    theirs = shared_tmp / "their-runs"
    assert as_other(f"mkdir -m 700 {theirs}").returncode == 0
    monkeypatch.setenv("DISTLAB_RUNS", str(theirs))
    with pytest.raises(RunFolderError, match=rf"{theirs} for run folders: it belongs to user {OTHER}"):
        engine.new_run_dir("demo")

    monkeypatch.delenv("DISTLAB_RUNS")
    mine = RunFolder.create("demo").path.parent
    probe = (  # the other user, running distlab's run-folder code with a system Python (no torch needed)
        "import sys, types\n"
        f"pkg = types.ModuleType('distlab'); pkg.__path__ = [{str(readable_src / 'distlab')!r}]; "
        "sys.modules['distlab'] = pkg\n"
        "from distlab.folders.runfolder import RunFolder\n"
        "from distlab.errors import RunFolderError\n"
        "print('OWN:', RunFolder.create('x').path)\n"
        "try:\n"
        f"    RunFolder.create('x', root={str(mine)!r})\n"
        "except RunFolderError as e:\n"
        "    print('CLEAR:', e)\n"
    )
    out = as_other(f"{other_python()} -c \"$PROBE\"", env={"PROBE": probe, "TMPDIR": shared_tmp})
    assert f"CLEAR: distlab: cannot use {mine} for run folders: it belongs to user root" in out.stdout, out
    own = Path(out.stdout.split("OWN: ")[1].split()[0])
    assert own.parent == shared_tmp / f"distlab-{other_user.pw_uid}"  # each user has a root of their own
    assert os.stat(own.parent).st_uid == other_user.pw_uid and stat.S_IMODE(os.stat(own.parent).st_mode) == 0o700


def test_distlab_runs_through_another_users_link_is_refused(other_user, shared_tmp, monkeypatch):
    """Before: accepted (the link led to a folder of yours), and the path kept as written: the other
    user could re-point the link at a folder of theirs between runs, or between the check and use."""
    mine = shared_tmp / "mine"
    mine.mkdir(mode=0o700)
    link = shared_tmp / "link"
    assert as_other(f"ln -s {mine} {link}").returncode == 0
    monkeypatch.setenv("DISTLAB_RUNS", str(link / "runs"))
    with pytest.raises(RunFolderError, match=rf"cannot use {link} for run folders: it is a symbolic link that "
                                             rf"belongs to user {OTHER} \(uid {other_user.pw_uid}\)"):
        engine.new_run_dir("demo")
    assert list(mine.iterdir()) == []


ATTACKS = {
    "list the root": "ls {root}",
    "read the script": "cat {run}/scaled.py",
    "read values.pt": "cat {run}/values.pt",
    "read args.pt": "cat {run}/args.pt",
    "read a return value": "cat {run}/returns/rank0.pt",
    "read a log": "cat {run}/logs/attempt0/rank0.out",
    "plant a return value": "echo planted > {run}/returns/rank1.pt",
    "replace values.pt": "echo planted > {run}/values.pt",
    "replace the script": "echo 'import os' > {run}/scaled.py",
    "plant a run folder": "mkdir {root}/20990101-000000-planted-x",
    "move the run folder away": "mv {run} {run}.moved",
    "delete the run folder": "rm -rf {run}",
}


@pytest.mark.slow
def test_another_user_can_neither_read_nor_plant_anything_in_a_run(other_user, shared_tmp):
    res = distlab.spawn(CELLS["scaled"], args=(torch.ones(3),), nprocs=1, view=None)
    run, root = res.run_dir, res.run_dir.parent
    assert (run / "values.pt").exists() and (run / "args.pt").exists() and (run / "returns/rank0.pt").exists()
    succeeded = [name for name, cmd in ATTACKS.items()
                 if as_other(cmd.format(run=run, root=root)).returncode == 0]
    assert succeeded == []
    modes = {str(p.relative_to(run)): stat.S_IMODE(p.lstat().st_mode) for p in [run, *run.rglob("*")]}
    assert {name for name, m in modes.items() if m & 0o077} == set(), modes  # 0700 folders, 0600 files
    assert torch.equal(res.returns[0], torch.full((3,), 2.0))
    assert "secret output" in (run / "logs/attempt0/rank0.out").read_text()
    assert stat.S_IMODE((root / private.VOUCHED).lstat().st_mode) == 0o600  # the mark of the root's check
    others = [p for p in root.iterdir() if p.name not in (run.name, private.VOUCHED)]  # this process's temp folder
    assert all(p.name.startswith(private.folder_prefix(os.getpid())) and stat.S_IMODE(p.stat().st_mode) == 0o700
               for p in others), others
