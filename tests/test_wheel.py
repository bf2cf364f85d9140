"""A wheel built from the tree installs, and runs a 2-rank spawn and a Ranks(2) outside the checkout.

A folder without ``__init__.py`` is silently left out of a wheel, and a module named in a string
(an ``-m`` entry point, the server's preload list) can exist in the checkout and not in the
install: this test sees what a ``pip install`` would give.
"""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

PROGRAM = '''
import os, sys
import distlab

SITE = sys.argv[1]


def where(rank):
    import distlab
    return distlab.__file__


def warm():
    import distlab
    return distlab.__file__


if __name__ == "__main__":
    assert distlab.__file__.startswith(SITE), distlab.__file__
    result = distlab.spawn(where, nprocs=2, view=None)
    assert all(path.startswith(SITE) for path in result.returns.values()), result.returns
    with distlab.Ranks(2) as ranks:
        values = ranks.run(warm)
    assert all(path.startswith(SITE) for path in dict(values).values()), values
    print("ok", distlab.__file__)
'''


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built as the book build builds it (book/wheel.py: from a copy of the tree, so that setuptools' build/
    and *.egg-info do not land in the checkout)."""
    sys.path.insert(0, str(REPO / "book"))
    import wheel as book_wheel

    return book_wheel.build(tmp_path_factory.mktemp("wheel"))


def test_the_wheel_is_the_file_every_chapter_installs(wheel):
    sys.path.insert(0, str(REPO / "book"))
    import install_cell

    assert wheel.name == install_cell.wheel_name()


def test_the_wheel_holds_every_module_of_the_tree(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tree = {str(p.relative_to(REPO / "src")) for p in (REPO / "src" / "distlab").rglob("*.py")}
    assert tree and tree <= names, sorted(tree - names)


@pytest.fixture(scope="module")
def site(wheel, tmp_path_factory):
    """The wheel installed once, as pip installs it, into a folder outside the checkout."""
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--target", str(site),
                           str(wheel)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return site


@pytest.mark.slow
def test_the_installed_wheel_spawns_and_keeps_warm_ranks_outside_the_checkout(site, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "program.py").write_text(PROGRAM)
    env = {**os.environ, "PYTHONPATH": str(site), "DISTLAB_RUNS": str(tmp_path / "runs")}
    done = subprocess.run([sys.executable, "program.py", str(site)], cwd=outside, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.startswith(f"ok {site}")


@pytest.mark.slow
def test_chapter_10s_benchmark_runs_from_the_installed_package_alone(site, tmp_path):
    """Chapter 10 runs bench/launch_latency.py through perf.run_bench; opened alone, no bench/ lies beside it."""
    alone = tmp_path / "alone"
    alone.mkdir()
    code = "from distlab.teach import perf; print(perf.run_bench('launch_latency.py', '--help'))"
    done = subprocess.run([sys.executable, "-c", code], cwd=alone, env={**os.environ, "PYTHONPATH": str(site)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "--quick" in done.stdout
