"""A container started the default way, as root (Kaggle, Colab, JupyterHub on Kubernetes), played here.

Such a container refuses namespaces: Docker's default seccomp profile makes unshare, setns, mount and
clone with a CLONE_NEW* flag fail with EPERM (clone3 with ENOSYS), and CAP_SYS_ADMIN and CAP_NET_ADMIN
are dropped. ``container_sandbox.c`` does the same to one command (built here with gcc). These tests check
the sandbox itself and what distlab says there; the chapters run in it in tests/test_platform_stack.py,
each alone on the platforms' software (chapters 7, 9, 13 and 14 there show their multi-machine sections as
recorded, with the one-line reason). Needs root, gcc and capsh (Debian: libcap2-bin), as CI has.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from platform_run import build_sandbox  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="needs root on Linux, as CI has"),
    pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("capsh")), reason="needs gcc and capsh (libcap2-bin)"),
]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """The built sandbox, checked to refuse what a default container refuses."""
    folder = tmp_path_factory.mktemp("sandbox")
    yield build_sandbox(folder)
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
