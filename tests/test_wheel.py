"""A wheel built from the tree installs, and runs a 2-rank spawn and a Ranks(2) outside the checkout.

A folder without ``__init__.py`` is silently left out of a wheel, and a module named in a string
(an ``-m`` entry point, the server's preload list) can exist in the checkout and not in the
install: this test sees what a ``pip install`` would give.
"""
from __future__ import annotations

import os
import shutil
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
    """Built from a copy of what the package is made of: setuptools writes build/ and *.egg-info
    next to the sources, which must not land in the checkout."""
    tree, out = tmp_path_factory.mktemp("tree"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)
    shutil.copytree(REPO / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(tree)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return next(out.glob("distlab-*.whl"))


def test_the_wheel_holds_every_module_of_the_tree(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tree = {str(p.relative_to(REPO / "src")) for p in (REPO / "src" / "distlab").rglob("*.py")}
    assert tree and tree <= names, sorted(tree - names)


@pytest.mark.slow
def test_the_installed_wheel_spawns_and_keeps_warm_ranks_outside_the_checkout(wheel, tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--target", str(site),
                           str(wheel)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "program.py").write_text(PROGRAM)
    env = {**os.environ, "PYTHONPATH": str(site), "DISTLAB_RUNS": str(tmp_path / "runs")}
    done = subprocess.run([sys.executable, "program.py", str(site)], cwd=outside, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.startswith(f"ok {site}")
