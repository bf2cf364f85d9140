"""Every chapter's first code cell: it installs distlab where it is missing (Colab, Kaggle, any Jupyter).

One block, the same in every chapter, made here from what is set once:

- where the book is published: ``html.baseurl`` in ``_config.yml`` (the GitHub Pages site of
  ``repository.url``); the book build puts the package's wheel under ``_static/`` there (book/wheel.py);
- the wheel's name, from ``pyproject.toml``'s name and version.

A chapter that needs more than distlab adds lines of its own (:data:`EXTRAS`: chapter 8 installs DeepSpeed,
at requirements.txt's version). The cell installs with pip's default strategy, which changes nothing that
already satisfies distlab's requirements, so a platform keeps its torch, IPython and ipykernel (tested
on the platforms' pins: tests/test_platform_stack.py). ``DISTLAB_BOOK`` points the cell at another copy of
the built book (the tests serve it on 127.0.0.1).

    .venv/bin/python book/install_cell.py book/*.ipynb           # writes the cell into each chapter
    .venv/bin/python book/install_cell.py --check book/*.ipynb   # only reports
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]
TAG = "install-distlab"     # the cell's tag: it is replaced, not inserted again
BOOK_VARIABLE = "DISTLAB_BOOK"

CELL = '''\
# Alone on Colab or Kaggle (Internet on): open this notebook, Run All.
# This cell installs distlab if it is missing; it keeps the platform's
# torch, IPython and ipykernel.
import os

BOOK = "{book}"  # where the book is published
try:
    import distlab
except ImportError:
    book = os.environ.get("{variable}", BOOK)
    wheel = f"{{book}}/_static/{wheel}"
    %pip install --quiet "distlab[book] @ {{wheel}}"
    import distlab'''

EXTRA = '''
try:
    import {module}
except ImportError:
    %pip install --quiet {requirement}'''

#: chapter -> (module, requirements.txt's name) of what it needs beyond distlab
EXTRAS = {"08_deepspeed": ("deepspeed", "deepspeed")}


def published_book() -> str:
    """The address of the published book, without a trailing slash (``html.baseurl``)."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    return config["html"]["baseurl"].rstrip("/")


def wheel_name() -> str:
    """The file name ``pip wheel`` gives the package: ``distlab-<version>-py3-none-any.whl``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return f"{project['name'].replace('-', '_')}-{project['version']}-py3-none-any.whl"


def pinned(name: str) -> str:
    """requirements.txt's line for ``name`` (``deepspeed==0.19.8``)."""
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if re.match(rf"{re.escape(name)}\s*==", line):
            return line.split("#")[0].strip()
    raise LookupError(f"requirements.txt pins no {name}")


def cell_source(chapter: str) -> str:
    """The first code cell of ``book/<chapter>.ipynb``."""
    text = CELL.format(variable=BOOK_VARIABLE, book=published_book(), wheel=wheel_name())
    if chapter in EXTRAS:
        module, requirement = EXTRAS[chapter]
        text += "\n" + EXTRA.format(module=module, requirement=pinned(requirement))
    return text


def first_code_cell(nb: dict) -> dict | None:
    return next((c for c in nb["cells"] if c["cell_type"] == "code"), None)


def is_current(nb: dict, chapter: str) -> bool:
    cell = first_code_cell(nb)
    return cell is not None and "".join(cell["source"]) == cell_source(chapter)


def write(path: Path) -> bool:
    """Put the cell into the chapter (after its opening markdown cell, or in place of an older one)."""
    nb = json.loads(path.read_text())
    if is_current(nb, path.stem):
        return False
    lines = cell_source(path.stem).splitlines(keepends=True)
    cell = first_code_cell(nb)
    if cell is not None and TAG in cell["metadata"].get("tags", []):
        cell["source"] = lines
    else:
        nb["cells"].insert(1, {"cell_type": "code", "execution_count": None, "id": f"{TAG}",
                               "metadata": {"tags": [TAG]}, "outputs": [], "source": lines})
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return True


def main(args: list[str]) -> int:
    check = "--check" in args
    stale = []
    for name in (a for a in args if a != "--check"):
        path = Path(name)
        if check:
            if not is_current(json.loads(path.read_text()), path.stem):
                stale.append(name)
        elif write(path):
            print("updated", name)
    for name in stale:
        print(f"{name}: its first code cell is not the install cell (run book/install_cell.py {name})")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
