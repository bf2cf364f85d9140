"""Build distlab's wheel and put it beside the built book's pages, where every chapter's first cell installs
it from (``_static/<wheel>``: book/install_cell.py names the same file).

The wheel is built from a copy of what the package is made of: setuptools writes build/ and *.egg-info
next to the sources, which must not land in the checkout.

    .venv/bin/python book/wheel.py _build/html/_static     # book/build.sh does this after the build
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(dest: Path) -> Path:
    """``dest/distlab-<version>-py3-none-any.whl``, built now from the tree (pip wheel, no dependencies)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="distlab-wheel-") as scratch:
        tree, out = Path(scratch) / "tree", Path(scratch) / "out"
        tree.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(ROOT / name, tree / name)
        shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out),
                               str(tree)], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"pip wheel failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        (wheel,) = out.glob("distlab-*.whl")
        return Path(shutil.copy(wheel, dest / wheel.name))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(build(Path(sys.argv[1])))
