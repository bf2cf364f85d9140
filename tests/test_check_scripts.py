"""distlab.check on real runs: each script in tests/check_scripts has exactly one mistake, marked
``# mistake`` on its line(s), and the check names it there; the book's own scripts check clean;
``python -m distlab.check`` exits 1 on a finding, 0 when clean."""
import subprocess
import sys
from pathlib import Path

import pytest
from book_scripts import write_all

import distlab

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).parent / "check_scripts"
TIMEOUT = {"hang": 10}


def marked_lines(path: Path) -> list[int]:
    return [n for n, line in enumerate(path.read_text().splitlines(), 1) if line.endswith("# mistake")]


@pytest.mark.parametrize("path", sorted(SCRIPTS.glob("*.py")), ids=lambda p: p.stem)
def test_each_mistake_is_named_at_its_line(path, tmp_path):
    kind = path.stem.replace("_", "-")
    report = distlab.check(path, 2, [str(tmp_path / "checkpoint.pt")], timeout=TIMEOUT.get(kind, 60))
    assert report.kinds == [kind], report.text()
    (finding,) = report.findings
    lines = sorted(line for _, line in finding.lines.values()) if finding.lines else [finding.line]
    assert lines == marked_lines(path), report.text()
    assert finding.file == "" and finding.ranks and finding.message
    if kind == "gradients-not-synchronized":  # written with mp.spawn: checked in the ranks it starts
        assert report.mode == "python" and report.world_size == 2


BOOK_ARGS = {
    "ddp_train.py": ["--epochs", "2", "--size", "256", "--checkpoint", "{tmp}/c7.pt"],
    "ddp_resumable.py": ["--epochs", "2", "--size", "256", "--checkpoint", "{tmp}/c13.pt"],
    "preemptible.py": ["4", "{tmp}/preempted.pt"],
    "article_train.py": ["{tmp}/model.pt"],
}


def test_the_book_scripts_check_clean(tmp_path):
    paths = write_all(tmp_path)
    assert {"ddp_train.py", "ddp_resumable.py", "train_min.py"} <= set(paths)
    runs = [(name, "auto") for name in paths if not name.startswith(("mistake_", "exercise_"))]
    runs.append(("ddp_train.py", "torchrun"))  # chapter 7's script runs both ways
    for name, mode in runs:
        args = [a.format(tmp=tmp_path) for a in BOOK_ARGS.get(name, [])]
        report = distlab.check(paths[name], 2, args, timeout=90, mode=mode)
        assert report.ok and not report.error, (name, report.text(), report.error)


def test_the_command_line_exits_1_on_a_finding_and_0_when_clean(tmp_path):
    clean = write_all(tmp_path)["train_min.py"]
    for script, code in ((SCRIPTS / "module_prefix.py", 1), (clean, 0)):
        run = subprocess.run([sys.executable, "-m", "distlab.check", str(script), str(tmp_path / "m.pt")],
                             capture_output=True, text=True, timeout=180)
        assert run.returncode == code, run.stdout + run.stderr
        assert ("[module-prefix] line 18" in run.stdout) == (code == 1), run.stdout


def test_steps_stops_every_rank_after_that_many_optimizer_steps():
    # 4 steps an epoch: stopped within the first epoch, no epoch repeats its order yet
    assert distlab.check(SCRIPTS / "set_epoch_missing.py", steps=3).ok
    assert distlab.check(SCRIPTS / "set_epoch_missing.py", steps=5).kinds == ["set-epoch-missing"]


def test_arguments_are_checked_before_any_process_starts(tmp_path):
    for bad in ({"nprocs": 0}, {"steps": 0}, {"timeout": None}, {"mode": "mpirun"}, {"args": "--epochs 2"}):
        with pytest.raises(distlab.LaunchArgumentError):
            distlab.check(SCRIPTS / "hang.py", **bad)
    with pytest.raises(distlab.LaunchArgumentError):
        distlab.check(tmp_path / "missing.py")
