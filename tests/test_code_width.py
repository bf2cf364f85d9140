"""Code that fits the page (issue #50): no code line of a chapter is wider than the built book shows.

The limit and the tool that brings a chapter within it are ``book/fit_code.py`` (its docstring says how
the limit was measured). A chapter that fails here: ``.venv/bin/python book/fit_code.py book/<chapter>.ipynb``,
then fix by hand what ``--check`` still lists, and run the chapter (``tests/nbrun.py``).
"""
from __future__ import annotations

import json
import sys

import pytest
from book_copy import ROOT

sys.path.insert(0, str(ROOT / "book"))
import fit_code  # noqa: E402

NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_code_line_is_wider_than_the_page(path):
    over = fit_code.long_lines(json.loads(path.read_text(encoding="utf-8")))
    shown = "\n".join(f"  cell {k}: {len(line)} chars: {line.strip()[:70]}" for k, line in over[:10])
    assert not over, (f"{path.name}: {len(over)} code lines longer than {fit_code.LIMIT} characters:\n{shown}\n"
                      f"run: .venv/bin/python book/fit_code.py book/{path.name}")


def fenced_lines(markdown: str) -> list[str]:
    """Lines inside ``` blocks of a page, but not inside directives (```{eval-rst} ...)."""
    return [line for block in fit_code.markdown_blocks(markdown) for line in block.split("\n")]


@pytest.mark.parametrize("path", sorted((ROOT / "book").glob("*.md")), ids=lambda p: p.stem)
def test_no_code_block_line_of_a_page_is_wider_than_the_page(path):
    """The appendix's pages (markdown, fitted by hand)."""
    over = [line for line in fenced_lines(path.read_text(encoding="utf-8")) if len(line) > fit_code.LIMIT]
    assert not over, f"{path.name}: code lines longer than {fit_code.LIMIT} characters: {over}"


def test_fenced_lines_skip_directives():
    page = "text\n```{eval-rst}\n.. autofunction:: x\n```\nmore\n```python\nx = 1\n```\n"
    assert fenced_lines(page) == ["x = 1"]


def test_a_long_trailing_comment_moves_above_its_line():
    line = "    total = compute_everything(x)" + " " * 4 + "# " + "why this line exists " * 4
    out = fit_code.reflow_comments("def f(x):\n" + line + "\n    return total")
    lines = out.split("\n")
    assert all(len(x) <= fit_code.LIMIT for x in lines), out
    assert lines[1].startswith("    # why this line") and lines[-2] == "    total = compute_everything(x)"
    assert fit_code.same_program("def f(x):\n" + line + "\n    return total", out)


def test_a_hash_inside_a_string_is_not_a_comment():
    note = "# " + "a note " * 10
    out = fit_code.reflow_comments('print("a # b")  ' + note)
    assert out.split("\n") == [note.rstrip(), 'print("a # b")'], out


def test_a_comment_long_only_for_its_alignment_stays_on_its_line():
    out = fit_code.reflow_comments("x = 1" + " " * 80 + "# changed")
    assert out == "x = 1  # changed"


def test_long_strings_are_cut_into_literals_that_join_to_the_same_string():
    source = 'print(\n    f"rank {rank}: loss {loss:.4f} " + "x"\n)'
    long = 'print(\n    f"rank {rank}: the loss after every step is {loss:.4f}, and the words go on for a while"\n)'
    out = fit_code.split_strings(long)
    assert all(len(x) <= fit_code.LIMIT for x in out.split("\n")), out
    assert fit_code.same_program(long, out) and len(out.split("\n")) == 4
    assert fit_code.split_strings(source) == source  # short lines stay as they are


def test_cell_magics_keep_their_line_and_other_languages_are_left_alone():
    ranks = "%%ranks 0,1\nt = torch.ones(1) * (rank + 1); dist.all_reduce(t)"
    bash = "%%bash\necho " + "word " * 30
    needs = "%%needs nodes\nres=distlab.spawn(f,nprocs=1,nodes=nodes)"
    fitted = fit_code.fit_sources([ranks, bash, "%load_ext distlab\nx=1", "x=1\n!echo hi\nfiles = !ls", needs])
    assert fitted[0] == "%%ranks 0,1\nt = torch.ones(1) * (rank + 1)\ndist.all_reduce(t)"
    assert fitted[1] == bash
    assert fitted[2] == "%load_ext distlab\nx = 1"
    assert fitted[3] == "x = 1\n!echo hi\nfiles = !ls"
    assert fitted[4] == "%%needs nodes\nres = distlab.spawn(f, nprocs=1, nodes=nodes)"


def test_stacked_magics_are_fitted_only_when_every_body_is_python():
    sbatch = ("%%needs slurm-nodes\n%%writefile job.sbatch\n#!/bin/bash\n"
              "#SBATCH --nodes=2                      # two machines, and a comment long enough to wrap it\n")
    script = "%%needs slurm-nodes\n%%writefile job.py\nx=1\n"
    fitted = fit_code.fit_sources([sbatch, script])
    assert fitted[0] == sbatch  # a #SBATCH line is a directive, never a comment to reflow
    assert fitted[1] == "%%needs slurm-nodes\n%%writefile job.py\nx = 1"


def test_fitting_is_idempotent_and_keeps_the_program():
    cell = ("def f(a, b):\n    \"\"\"" + "A docstring that says a great deal about what f does. " * 2 + "\"\"\"\n"
            "    return {'sum': a + b, 'difference': a - b, 'product': a * b}  # " + "every result " * 3)
    once = fit_code.fit_sources([cell])
    assert fit_code.fit_sources(once) == once
    assert fit_code.same_program(cell, once[0])
    assert all(len(x) <= fit_code.LIMIT for x in once[0].split("\n")), once[0]


def test_a_changed_program_is_refused():
    assert not fit_code.same_program("x = 1", "x = 2")
    assert fit_code.same_program('def f():\n    """one line"""', 'def f():\n    """one\n    line"""')
