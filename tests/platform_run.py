"""Execute a chapter the way a learner on another platform would, and check what Run All gave them.

Used by tests/test_platform_container.py (a default container, as root) and tests/test_platform_no_slurm.py
(a machine without Slurm's packages). The chapter runs from a copy of ``book/`` in a temporary folder
(its own cwd, as nbclient and JupyterLab give), wrapped in the platform's command; the executed
notebook comes back for :func:`check`, and the copy's files before and after tell whether a skipped
section wrote anything.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

from distlab.needs import recorded, verdict

REPO = Path(__file__).resolve().parents[1]
SANDBOX_SOURCE = Path(__file__).with_name("container_sandbox.c")
RUNNER = ("import json, sys; sys.path.insert(0, sys.argv[3]); from pathlib import Path; from nbrun import execute; "
          "ex = execute(Path(sys.argv[1]), Path(sys.argv[2])); "
          "print('RESULT ' + json.dumps({'seconds': ex.seconds, 'error': ex.error}))")
REASON_START = verdict.START                          # "Not run here: " (the full line and the short)
LABEL_START = recorded.LABEL.split("(")[0]           # "Recorded when the book was built "


def build_sandbox(folder: Path) -> Path:
    """``container_sandbox.c`` built into ``folder`` (gcc): ``[binary, command]`` runs a shell command the way
    a container started the default way runs it."""
    binary = folder / "container_sandbox"
    subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-o", str(binary), str(SANDBOX_SOURCE)], check=True)
    return binary


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if "__pycache__" not in p.parts}


def run_chapter(wrap, chapter: str, work: Path, timeout: float = 900, env: dict | None = None,
                alone: bool = False) -> dict:
    """Execute ``book/<chapter>.ipynb`` from a copy under ``work`` inside ``wrap(command) -> argv``.

    The copy is of ``book/`` (or, ``alone``, of the notebook only, in an empty folder, as a learner who
    downloaded it has it); ``env`` adds to the environment (the kernel inherits it). Returns seconds, error,
    the executed notebook and the files a run added to the copy."""
    book = work / "book"
    if alone:
        book.mkdir()
        shutil.copy(REPO / "book" / f"{chapter}.ipynb", book)
    else:
        shutil.copytree(REPO / "book", book, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "*.pt", "_build"))
    before = files_under(book)
    out = work / f"{chapter}.executed.ipynb"
    command = shlex.join([sys.executable, "-c", RUNNER, str(book / f"{chapter}.ipynb"), str(out),
                          str(REPO / "tests")])
    done = subprocess.run(wrap(command), capture_output=True, text=True, timeout=timeout, cwd=work,
                          env={**os.environ, **(env or {})})
    result = next((json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert result is not None and out.exists(), f"it did not run:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return {**result, "notebook": nbformat.read(out, as_version=4), "added": files_under(book) - before}


def check(run: dict, skipped: set[str]) -> dict[str, int]:
    """Every cell ran, without error (but those tagged ``raises-exception``); a ``%%needs`` cell whose
    requirement is in ``skipped`` ran nothing and showed its recording (the first of each run of them, the
    reason); any other ran for real. Counts."""
    nb = run["notebook"]
    assert run["error"] is None, run["error"]
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), "a code cell did not run"
    counts = {"skipped": 0, "ran": 0, "reasons": 0}
    full_lines = []
    previous = None
    for cell in code:
        got = recorded.split(cell.source)
        if "raises-exception" not in cell.get("metadata", {}).get("tags", []):     # it raises on purpose
            assert not any(o["output_type"] == "error" for o in cell.outputs), cell.source[:200]
        if got and got[0] in skipped:
            counts["skipped"] += 1
            outputs = cell.outputs
            if previous != got[0]:                   # the first cell of a section says why, in one line
                why = outputs[0].get("data", {}).get("text/plain", "")
                assert why.startswith(verdict.START.split(":")[0]) and "\n" not in why, why[:300]
                lead = why.split(recorded.DETAIL)[0]   # what a notebook user reads first: no operator's flags
                assert "--privileged" not in lead and "CAP_SYS_ADMIN" not in lead and len(lead) < 400, lead
                if why.startswith(verdict.START):
                    full_lines.append(lead)
                counts["reasons"] += 1
                outputs = outputs[1:]
            shown = recorded.find(*got)
            assert shown is not None, cell.source[:200]
            said = recorded.checked(got[1]) or ""                       # what its asserts checked, when recorded
            assert text_of(outputs) == recorded.label(shown) + text_of(shown["outputs"]) + said   # nothing ran
        else:
            counts["ran"] += bool(got)
            text = text_of(cell.outputs)
            assert REASON_START not in text and LABEL_START not in text, cell.source[:200]   # a real run
        previous = got[0] if got and got[0] in skipped else None
    assert len(full_lines) == len(set(full_lines)), full_lines   # the full line once per chapter, then short
    assert not run["added"], f"files written into the book's folder: {sorted(run['added'])}"
    return counts


def text_of(outputs) -> str:
    return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)


def budget(chapter: str) -> float:
    from nbrun import CHAPTER_BUDGET_S
    from test_notebooks import BUDGETS_S

    return float(os.environ.get("DISTLAB_CHAPTER_BUDGET_S", BUDGETS_S.get(f"book/{chapter}", CHAPTER_BUDGET_S)))
