"""The magics, the live view, warm ranks and a knob on the platforms' own Jupyter (Colab's IPython
7.34, ipykernel 6.17, ipywidgets 7.7, jupyter_client 7.4, psutil 5.9), in a real kernel of that
stack: tests/platform_jupyter.py drives it as JupyterLab does.

The stack's Python comes from ``DISTLAB_PLATFORM_PYTHON`` (CI's platform-stack venv, built from
tests/constraints-platform.txt). Unset, this test builds one itself, once, under the user's cache
folder: the Jupyter pins of that file with this machine's torch 2.13.0 (the Jupyter differences
apart from torch's). Nothing is skipped: a venv that cannot be built fails the test.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "tests" / "constraints-platform.txt"
OWN_TORCH = "torch==2.13.0"
STACK = {"IPython": "7.34.0", "ipykernel": "6.17.1", "ipywidgets": "7.7.1", "jupyter_client": "7.4.9",
         "psutil": "5.9.5"}


def jupyter_pins() -> list[str]:
    """The constraints file's pins, but torch's (a CUDA build of 2.11 is GBs: this test is about Jupyter)."""
    lines = [line.strip() for line in CONSTRAINTS.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#") and not line.startswith("torch==")]


def build_venv() -> Path:
    """A venv with the platforms' Jupyter and torch 2.13.0, made once under the cache folder."""
    pins = [OWN_TORCH, *jupyter_pins(), "tqdm"]
    tag = hashlib.sha256("\n".join(pins).encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    venv = cache / "distlab" / f"platform-jupyter-{tag}"
    python = venv / "bin" / "python"
    if (venv / "complete").exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *pins], check=True, timeout=1800)
    (venv / "complete").touch()
    return python


def platform_python() -> Path:
    given = os.environ.get("DISTLAB_PLATFORM_PYTHON")
    return Path(given) if given else build_venv()


def test_the_platforms_jupyter_runs_the_magics_live_view_warm_ranks_and_knobs(tmp_path):
    python = platform_python()
    probe = "import importlib, json; print(json.dumps({m: importlib.import_module(m).__version__ for m in %r}))"
    versions = subprocess.run([str(python), "-c", probe % sorted(STACK)], capture_output=True, text=True,
                              check=True).stdout
    import json

    assert json.loads(versions) == STACK, f"{python} is not the platforms' Jupyter: {versions}"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
    env.pop("JUPYTER_PATH", None)
    done = subprocess.run([str(python), str(REPO / "tests" / "platform_jupyter.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    shown = done.stdout + done.stderr[-4000:]
    assert done.returncode == 0 and done.stdout.rstrip().endswith("all checks passed"), shown
    for check in ("%%ranks", "%%needs", "the live view", "main thread", "Kernel > Interrupt"):
        assert check in done.stdout, shown
