"""The platform stack: each chapter opened alone on the platforms' own software, in a default container.

Colab's GPU runtime and Kaggle's image are not the book's stack: torch 2.11.0, IPython 7.34, ipykernel 6.17,
ipywidgets 7.7, psutil 5.9.5 (tests/constraints-platform.txt), and no distlab. Here, for every chapter of the
toc (tests/platform_stack.py says how): a fresh copy of a venv with exactly those pins, the notebook alone
in an empty folder, a kernel on that venv's python, run as root inside the sandbox that refuses namespaces
as a default container does, with the built book served on 127.0.0.1. The chapter's first cell installs
distlab (and chapter 8 DeepSpeed) from there; Run All must reach the last cell. A chapter that stops is
reported with the cell and the error, and the session's summary lists every chapter's time.

Chapters 7, 9 and 14 there show their nodes sections as recorded, with the one-line reason, and chapter 13
its two-node lessons (all its Slurm cells where Slurm is not installed): the default-container checks of
``platform_run.check``. This is the book's only run in that container.

    pytest -m platform_stack            # only this (it executes and builds the book first, for the wheel)
    pytest -m "not platform_stack"      # all but this
    DISTLAB_BOOK_HTML=DIR pytest tests/test_platform_stack.py -k 07_   # serves DIR instead (see `html`)

The venv is cached per machine (tests/platform_venv.py); a new machine builds it, about 5 GB and 3 minutes.
Needs root, gcc and capsh (Debian: libcap2-bin), as CI has.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from book_copy import ROOT, chapter_files

from distlab.needs import probe
from distlab.slurm import accounting

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT / "book"))
import install_cell  # noqa: E402
import platform_stack  # noqa: E402
import platform_venv  # noqa: E402
from platform_run import budget, build_sandbox, check  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.platform_stack,
    pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="needs root on Linux, as CI has"),
    pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("capsh")), reason="needs gcc and capsh (libcap2-bin)"),
]
#: sections a default container refuses: shown as recorded, with their reason
REFUSED = {"07_two_gpu_training": {"nodes"}, "09_failure_lab": {"nodes"}, "14_network": {"nodes"}}


def refused(chapter: str) -> set[str]:
    if chapter != "13_slurm_cluster":
        return REFUSED.get(chapter, set())
    if probe.slurm_problem() is not None:                 # no Slurm here: every Slurm section is recorded
        return {"slurm", "slurm-nodes", "slurm-accounting"}
    return {"slurm-nodes"} | ({"slurm-accounting"} if accounting.problem() is not None else set())


@pytest.fixture(scope="session")
def platform():
    return platform_venv.ensure()


@pytest.fixture(scope="module")
def html(request) -> Path:
    """The built book: the session's executed build, or ``$DISTLAB_BOOK_HTML`` while iterating (a folder with
    at least ``_static/<the wheel>``: ``python book/wheel.py DIR/_static``)."""
    override = os.environ.get("DISTLAB_BOOK_HTML")
    return Path(override) if override else request.getfixturevalue("executed_book")["html"]


@pytest.fixture(scope="module")
def site(html):
    """The built book (its wheel under _static/), served on 127.0.0.1."""
    with platform_stack.serve(html) as url:
        yield url


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sandbox")
    yield build_sandbox(folder)
    shutil.rmtree(folder, ignore_errors=True)


def test_the_built_book_has_the_wheel_the_cell_installs(html):
    assert (html / "_static" / install_cell.wheel_name()).is_file()


def test_the_install_keeps_the_platforms_own_packages(platform, site):
    """What the cell's pip would install on the platform: distlab and what it lacks, none of the pins."""
    with tempfile.TemporaryDirectory(prefix="distlab-platform-") as work:
        python = platform_venv.layer(platform, Path(work) / "venv")
        report = Path(work) / "report.json"
        wheel = f"{site}/_static/{install_cell.wheel_name()}"
        done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--dry-run", "--report", str(report),
                               f"distlab[book] @ {wheel}"], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        install = {platform_venv.normalise(i["metadata"]["name"]): i["metadata"]["version"]
                   for i in json.loads(report.read_text())["install"]}
    assert "distlab" in install
    replaced = {name: (pin, install[name]) for name, pin in platform_venv.pins().items() if name in install}
    assert not replaced, f"the install would replace the platform's {replaced} (pin: platform's, new)"


@pytest.mark.parametrize("name", chapter_files())
def test_a_chapter_alone_reaches_its_last_cell(platform, site, sandbox, name):
    chapter = name.split("/")[-1]
    run = platform_stack.run_alone(chapter, platform, site, lambda command: [str(sandbox), command])
    platform_stack.RESULTS[chapter] = run
    assert not run["error"], f"{chapter} on the platforms' software stopped at {run['stopped']}"
    counts = check(run, refused(chapter))
    if refused(chapter):
        assert counts["skipped"] >= 2 and counts["reasons"] >= 1, counts
    if chapter == "13_slurm_cluster" and "slurm" not in refused(chapter):
        assert counts["ran"] >= 5          # the cluster, sinfo, hostnames, a drained node, the time limit, stop
    took = run["seconds"] - run["install_seconds"]
    assert took <= budget(chapter), f"{chapter}: {took:.0f} s after its install cell ({run['install_seconds']:.0f} s)"
