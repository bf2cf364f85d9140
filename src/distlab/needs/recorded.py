"""Recordings: what each ``%%needs`` cell printed when the book was built, and showing it again.

One JSON file per chapter in ``recorded/`` next to this module (written by ``book/record.py`` from
an executed chapter)::

    {"chapter": "07_two_gpu_training.ipynb",
     "recorded": {"date": "2026-12-05", "setting": "Linux as root, ..."},
     "cells": {"<key>": {"requirement": "nodes", "cell": 31, "outputs": [<nbformat outputs>]}}}

A cell is found by :func:`cell_key`, a hash of its requirement and code, so a recording never shows
under a cell whose code changed since (the test suite then asks for a new recording).
"""
from __future__ import annotations

import ast
import hashlib
import json
import sys
from functools import lru_cache
from pathlib import Path

FOLDER = Path(__file__).with_name("recorded")
MAGIC = "%%needs"
LABEL = "Recorded when the book was built ({date}; {setting}). Not run here."
DETAIL = "Why, technically"
CHECKED = "This cell checked, when the book was built: {claims}."
ITEM_LIMIT = 90          # characters of one claim in that line (an assert's code can be long)
NO_RECORDING = ("No recording of this cell: its code differs from the book's. Nothing ran and nothing is shown; "
                "run the chapter where {what} is available to see it.")


def cell_key(requirement: str, body: str) -> str:
    """The key of a ``%%needs <requirement>`` cell with code ``body`` (trailing blanks ignored)."""
    text = requirement.strip() + "\n" + "\n".join(line.rstrip() for line in body.rstrip().splitlines())
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def split(source: str) -> tuple[str, str] | None:
    """A notebook cell's ``(requirement, body)`` when it starts with ``%%needs``; else None."""
    first, _, body = source.partition("\n")
    if not first.startswith(MAGIC + " "):
        return None
    return first[len(MAGIC):].strip(), body


@lru_cache(maxsize=1)
def everything(folder: Path = FOLDER) -> dict[str, dict]:
    """key -> recording (its cell's entry, with the file's ``recorded`` and ``chapter``), from every file."""
    found = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        for key, entry in data["cells"].items():
            found[key] = {**entry, "recorded": data["recorded"], "chapter": data["chapter"]}
    return found


def find(requirement: str, body: str, folder: Path = FOLDER) -> dict | None:
    return everything(folder).get(cell_key(requirement, body))


def label(recording: dict) -> str:
    return LABEL.format(**recording["recorded"])


def show(recording: dict) -> None:
    """Show a recording in the current cell: its label, then each output as it was (text, images)."""
    from IPython.display import display

    note(label(recording))
    for out in recording["outputs"]:
        kind = out.get("output_type")
        if kind == "stream":
            stream = sys.stderr if out.get("name") == "stderr" else sys.stdout
            stream.write(out["text"])
            stream.flush()
        elif kind in ("display_data", "execute_result"):
            display(out["data"], raw=True, metadata=out.get("metadata") or {})


def note(text: str, detail: str | None = None) -> None:
    """One line set apart from the recorded output: plain text in a terminal or nbclient, a box in JupyterLab.

    ``detail`` (a technical cause) follows the line in plain text, and is folded under it in JupyterLab."""
    import html

    from IPython.display import display

    folded = (f'<details><summary style="font-style:normal">{DETAIL}</summary>{html.escape(detail)}</details>'
              if detail else "")
    box = ('<div style="border-left:4px solid #c90;padding:2px 8px;margin:2px 0;font-style:italic">'
           f"{html.escape(text)}{folded}</div>")
    plain = f"{text} {DETAIL}: {detail}" if detail else text
    display({"text/plain": plain, "text/html": box}, raw=True)


def checked(body: str) -> str | None:
    """The line that says what a recorded cell's asserts checked, read from its code here, so a recording made
    before this line existed shows it too. Each claim is the comment the chapter puts above or beside an
    assert, else the assert's own condition. Only the asserts the cell runs itself (not those in the functions
    it defines, which run where they are called). None for a cell without asserts. Pure."""
    from IPython.core.inputtransformer2 import TransformerManager

    code = TransformerManager().transform_cell(body)
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    lines = code.splitlines()
    claims = [claim(node, lines, code) for node in own_asserts(tree)]
    if not claims:
        return None
    return CHECKED.format(claims="; ".join(dict.fromkeys(claims)))


def own_asserts(tree: ast.AST) -> list[ast.Assert]:
    """The asserts of a module that run when it runs: not inside a function or class it defines."""
    found, todo = [], list(ast.iter_child_nodes(tree))
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Assert):
            found.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return sorted(found, key=lambda n: n.lineno)


def claim(node: ast.Assert, lines: list[str], code: str) -> str:
    """What one assert claims: its comment (the lines just above it, or its own line's end), else its code."""
    above, k = [], node.lineno - 2
    while k >= 0 and lines[k].strip().startswith("#"):
        above.insert(0, lines[k].strip().lstrip("#").strip())
        k -= 1
    beside = lines[node.lineno - 1].partition("  # ")[2].strip() if node.end_lineno == node.lineno else ""
    text = " ".join(above) or beside or " ".join((ast.get_source_segment(code, node.test) or "").split())
    text = text.rstrip(",;. ")
    return text if len(text) <= ITEM_LIMIT else text[:ITEM_LIMIT - 3].rstrip() + "..."

