"""The magics, the live view, warm ranks and a knob on the platforms' own Jupyter (Colab's IPython
7.34, ipykernel 6.17, ipywidgets 7.7, jupyter_client 7.4, psutil 5.9), in a real kernel of that
stack: tests/platform_jupyter.py drives it as JupyterLab does.

The stack's Python comes from ``DISTLAB_PLATFORM_PYTHON`` (CI's platform-stack venv, built from
tests/constraints-platform.txt). Unset, it is that same venv, the one the platform-stack run uses
(tests/platform_venv.py: built once per machine under the user's cache folder, torch 2.11.0 with the
platforms' Jupyter). Nothing is skipped: a venv that cannot be built fails the test.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
STACK = {"IPython": "7.34.0", "ipykernel": "6.17.1", "ipywidgets": "7.7.1", "jupyter_client": "7.4.9",
         "psutil": "5.9.5"}


def platform_python() -> Path:
    given = os.environ.get("DISTLAB_PLATFORM_PYTHON")
    if given:
        return Path(given)
    import platform_venv

    return platform_venv.ensure() / "bin" / "python"


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
