"""Run All on a machine without Slurm's packages: chapter 13 (the one that uses Slurm) reaches its last cell.

Slurm's and munge's programs are really hidden, not only left off PATH (``slurm.local_cluster`` also
looks in /usr/sbin and /sbin): the chapter runs in a private mount namespace where /dev/null, which
nobody may execute, is bound over each of them. There every Slurm cell shows its section's reason
(the packages to install) and its recording, the rest runs, nothing lands in the book's folder, and the
chapter stays within its budget. Needs root and util-linux's unshare, as CI has.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distlab.slurm.slurmconf import PROGRAMS

sys.path.insert(0, str(Path(__file__).parent))
from platform_run import budget, check, run_chapter  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="needs root on Linux, as CI has"),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare"),
]
FOLDERS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
PACKAGES = ("slurm-client", "slurmctld", "slurmd", "slurm-wlm", "munge", "slurmdbd")


def slurm_programs() -> list[str]:
    """Every installed program of Slurm's and munge's packages (dpkg's lists), and those distlab looks for."""
    found = {str(Path(folder) / name) for folder in FOLDERS for name in PROGRAMS if (Path(folder) / name).exists()}
    if shutil.which("dpkg-query"):
        for package in PACKAGES:
            listed = subprocess.run(["dpkg-query", "-L", package], capture_output=True, text=True).stdout.split()
            found |= {p for p in listed if Path(p).parent.as_posix() in FOLDERS and Path(p).is_file()}
    return sorted({os.path.realpath(p) for p in found})


def without_slurm(command: str) -> list[str]:
    hide = "".join(f"mount --bind /dev/null {shlex.quote(p)} && " for p in slurm_programs())
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", f"{hide}exec sh -c {shlex.quote(command)}"]


def test_slurm_is_really_hidden():
    check_code = ("from distlab.slurm.slurmconf import missing_programs; from distlab.needs import probe; "
                  "print(sorted(missing_programs())); print(probe.facts().slurm_problem)")
    done = subprocess.run(without_slurm(shlex.join([sys.executable, "-c", check_code])), capture_output=True,
                          text=True, timeout=60)
    missing, problem = done.stdout.splitlines()[:2]
    assert missing == str(sorted(PROGRAMS)), done.stdout + done.stderr
    assert "these programs are missing" in problem and "apt-get install munge slurm-wlm" in problem


def test_chapter_13_reaches_its_last_cell_without_slurm(tmp_path):
    run = run_chapter(without_slurm, "13_slurm_cluster", tmp_path)
    counts = check(run, {"slurm", "slurm-nodes", "slurm-accounting"})
    print(f"13_slurm_cluster without Slurm: {run['seconds']:.1f} s, {counts}")
    assert counts["ran"] == 0 and counts["skipped"] >= 20
    assert run["seconds"] <= budget("13_slurm_cluster")
