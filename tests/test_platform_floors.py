"""The floors pyproject.toml declares are the versions tested: the platforms' own Jupyter, psutil and
matplotlib (tests/constraints-platform.txt, run by tests/test_platform_jupyter.py)."""
from __future__ import annotations

import re
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
FLOORED = ("ipython", "ipykernel", "ipywidgets", "jupyter_client", "psutil", "matplotlib")


def pins() -> dict[str, str]:
    text = (REPO / "tests" / "constraints-platform.txt").read_text()
    return dict(re.findall(r"^([\w.-]+)==([\w.]+)$", text, re.M))


def floors() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["book"]
    return dict(m.groups() for d in declared if (m := re.match(r"^([\w.-]+)>=([\w.]+)$", d)))


def test_each_declared_floor_is_the_platforms_tested_version():
    tested, declared = pins(), floors()
    for name in FLOORED:
        assert name in declared, f"pyproject.toml declares no floor for {name} (tested: {tested[name]})"
        wanted = ".".join(tested[name].split(".")[:2])
        assert declared[name] == wanted, f"{name}>={declared[name]}, but the oldest tested is {tested[name]}"
