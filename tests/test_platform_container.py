"""Run All in a container started the default way, as root (Kaggle, Colab, JupyterHub on Kubernetes).

Such a container refuses namespaces: Docker's default seccomp profile makes unshare, setns, mount and
clone with a CLONE_NEW* flag fail with EPERM (clone3 with ENOSYS), and CAP_SYS_ADMIN and CAP_NET_ADMIN
are dropped. ``container_sandbox.c`` does the same to one command (built here with gcc), which then
executes chapters 7, 9, 13 and 14: every cell runs, none fails, each multi-machine cell shows its
section's one-line reason and its recording instead of running, nothing lands in the book's folder,
and each chapter stays within its time budget. Chapter 13 there: Slurm's one-node cluster needs no
namespace, so where Slurm is installed (CI) its one-node lessons run for real; the two-node ones are
recorded. Needs root, gcc and capsh (Debian: libcap2-bin), as CI has.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distlab.needs import probe
from distlab.slurm import accounting

sys.path.insert(0, str(Path(__file__).parent))
from platform_run import budget, check, run_chapter  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="needs root on Linux, as CI has"),
    pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("capsh")), reason="needs gcc and capsh (libcap2-bin)"),
]
SOURCE = Path(__file__).with_name("container_sandbox.c")


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """The built sandbox, checked to refuse what a default container refuses."""
    folder = tmp_path_factory.mktemp("sandbox")
    binary = folder / "container_sandbox"
    subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-o", str(binary), str(SOURCE)], check=True)
    yield binary
    shutil.rmtree(folder, ignore_errors=True)


def inside(sandbox: Path, command: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(sandbox), command], capture_output=True, text=True, timeout=60)


def test_the_sandbox_refuses_namespaces_and_links_as_a_default_container_does(sandbox):
    for command in ("unshare -Urn true", "unshare --net true", "ip link add distlab-t0 type dummy"):
        done = inside(sandbox, command)
        assert done.returncode != 0 and "Operation not permitted" in done.stderr, (command, done.stderr)
    status = inside(sandbox, "grep CapEff /proc/self/status").stdout.split()[1]
    effective = int(status, 16)
    assert not effective & (1 << 21) and not effective & (1 << 12)   # CAP_SYS_ADMIN, CAP_NET_ADMIN
    assert inside(sandbox, "true").returncode == 0 and inside(sandbox, "id -u").stdout.strip() == "0"


def test_distlab_says_why_there_and_what_would_allow_it(sandbox):
    code = "from distlab.needs import probe; print(probe.facts().nodes_problem)"
    done = inside(sandbox, f"{sys.executable} -c '{code}'")
    assert "this machine refuses a network namespace" in done.stdout, done.stdout + done.stderr
    assert "--cap-add SYS_ADMIN" in done.stdout and "never falls back to loopback" in done.stdout


def slurm_here() -> bool:
    return probe.slurm_problem() is None


@pytest.mark.parametrize("chapter, skipped", [
    ("07_two_gpu_training", {"nodes"}),
    ("09_failure_lab", {"nodes"}),
    ("14_network", {"nodes"}),
    ("13_slurm_cluster", None),   # decided by whether Slurm is installed here
])
def test_run_all_reaches_the_last_cell(sandbox, tmp_path, chapter, skipped):
    if skipped is None:
        skipped = {"slurm-nodes"} if slurm_here() else {"slurm", "slurm-nodes", "slurm-accounting"}
        if slurm_here() and accounting.problem() is not None:   # no slurmdbd or MariaDB here: sacct's section
            skipped.add("slurm-accounting")
    run = run_chapter(lambda command: [str(sandbox), command], chapter, tmp_path)
    counts = check(run, skipped)
    print(f"{chapter} in a default container: {run['seconds']:.1f} s, {counts}")
    assert counts["skipped"] >= 2 and counts["reasons"] >= 1
    if chapter == "13_slurm_cluster" and slurm_here():
        assert counts["ran"] >= 5          # the cluster, sinfo, hostnames, a drained node, the time limit, stop
    assert run["seconds"] <= budget(chapter), f"{chapter}: {run['seconds']:.0f} s"
