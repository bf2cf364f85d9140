"""A chapter opened alone installs what it needs: its first code cell is book/install_cell.py's block.

Whether the cell really installs distlab, on the platforms' software, from the built book, and leaves the
platform's packages as they were, is tests/test_platform_stack.py's part; here, that every chapter has the
very block, made from what is set once (``_config.yml``, ``pyproject.toml``, requirements.txt), and that
the launch buttons are configured.
"""
from __future__ import annotations

import json
import re
import sys

import pytest
import yaml
from book_copy import ROOT, chapter_files

sys.path.insert(0, str(ROOT / "book"))
import install_cell  # noqa: E402

CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())


@pytest.mark.parametrize("name", chapter_files())
def test_the_first_code_cell_is_the_install_cell(name):
    nb = json.loads((ROOT / f"{name}.ipynb").read_text())
    first = install_cell.first_code_cell(nb)
    stem = name.split("/")[-1]
    assert first is not None and "".join(first["source"]) == install_cell.cell_source(stem), (
        f"{name}: its first code cell is not the install cell: run .venv/bin/python book/install_cell.py {name}.ipynb")
    assert install_cell.TAG in first["metadata"].get("tags", [])


def test_the_cell_names_the_published_wheel_and_takes_an_override():
    text = install_cell.cell_source("01_dp_vs_ddp")
    assert f'BOOK = "{CONFIG["html"]["baseurl"].rstrip("/")}"' in text
    assert f"/_static/{install_cell.wheel_name()}" in text
    assert 'os.environ.get("DISTLAB_BOOK", BOOK)' in text
    assert "Colab" in text.splitlines()[0] and "Kaggle" in text.splitlines()[0]   # how to run it there


def test_only_chapter_8_adds_deepspeed_at_the_books_version():
    pinned = re.search(r"^deepspeed==\S+", (ROOT / "requirements.txt").read_text(), re.M).group(0)
    assert install_cell.cell_source("08_deepspeed").endswith(f"%pip install --quiet {pinned}")
    assert "deepspeed" not in install_cell.cell_source("07_two_gpu_training")


def test_the_install_never_asks_for_torch_ipython_or_ipykernel():
    """pip only installs what the cell names and what distlab requires; neither names these."""
    text = install_cell.cell_source("08_deepspeed")
    for name in ("torch", "ipython", "ipykernel", "--upgrade", "-U ", "--force-reinstall"):
        assert name not in text.replace("import distlab", "").lower().split("#")[0], name
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert not re.search(r"dependencies = \[[^\]]*(ipython|ipykernel)", pyproject, re.I)


def test_launch_buttons_open_the_chapter_from_the_repository_in_colab():
    repository = CONFIG["repository"]["url"]
    owner, name = re.fullmatch(r"https://github\.com/([\w.-]+)/([\w.-]+)", repository).groups()
    assert CONFIG["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    # the convention: the book is the repository's GitHub Pages site
    assert CONFIG["html"]["baseurl"].rstrip("/") == f"https://{owner}.github.io/{name}"


def test_the_cell_fits_the_books_width():
    for chapter in ("01_dp_vs_ddp", "08_deepspeed"):
        assert max(map(len, install_cell.cell_source(chapter).splitlines())) <= 76
