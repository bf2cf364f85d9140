"""Bring every code cell of a chapter within the width the built book shows, without changing what it does.

The book's content column shows 77 characters of code at a 1280 px desktop window (measured in Chromium:
a 684 px code block, 14 px monospace at 8.43 px a character), so code lines are held to ``LIMIT`` = 76.
Longer lines sat behind a horizontal scroll bar, and their ends were often the comment that explained them.
The same width reads well in JupyterLab. On a phone (420 px: 41 characters) code scrolls inside its box, as
before: wrapped Python would read as other code, and 41 columns would make every cell a column of fragments.

    python book/fit_code.py book/11_ddp_in_practice.ipynb ...   # rewrite these chapters in place
    python book/fit_code.py --check book/*.ipynb                # list lines over the limit (exit 1 if any)

Four steps, the first three repeated until nothing changes (a fixed point, so a second run changes nothing):

1. Comments: a trailing comment that makes its line too long moves onto its own line above it, at the
   line's indentation (unless the line was long only for the spaces that aligned its comment); a comment
   line that is too long is wrapped into lines of about equal length (``reflow_comments``). Comments are
   found with ``tokenize``, so a ``#`` inside a string is never taken for one; ``# noqa`` and ``# type:`` stay.
   This comes first: ruff would rather split the code of a line than move the comment that makes it long.
2. ``ruff format`` with ``line-length = LIMIT`` and quotes preserved (``format_cells``). A cell that starts
   with a cell magic whose body is Python (``%%ranks``, ``%%needs``, ``%%time``, ``%%writefile x.py``) is
   formatted without its first line; other cell magics (``%%bash``) are left alone. Line magics and
   ``!commands`` inside a cell are IPython syntax ruff's notebook mode understands. ruff refuses to change
   a program's syntax tree, so the code does what it did.
3. A string literal that ruff left alone on a too-long line inside brackets is cut at spaces into
   adjacent literals (``split_strings``), which Python joins into the same string (outside an f-string's
   ``{...}``; a piece without a placeholder loses its ``f``).
   A docstring line that is too long is cut at spaces into lines of its indentation (``wrap_docstrings``):
   prose, so the check that the program is the same blanks docstrings.
4. What is left (a URL, a string with no room to cut, a ```bash block in markdown) is listed by
   ``--check`` for a person to fix by hand.

Notebooks are written back with the project's formatting (``json.dump(indent=1)``), cell ids kept. Only
code changes: code cells, and the ```python blocks of markdown cells (exercise solutions, which the test
suite runs); outputs are not stored. A ``%%needs`` cell whose code changes must be recorded again
(``book/record.py``): its recording is keyed by the cell's hash.
"""
from __future__ import annotations

import ast
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import tokenize
from pathlib import Path

LIMIT = 76
#: cell magics whose body is Python: formatted like any cell (``%%writefile`` only for a ``.py`` file)
PYTHON_BODY = {"%%ranks", "%%needs", "%%time", "%%timeit", "%%capture", "%%writefile"}
#: trailing comments that must stay where they are: they speak to a tool about their own line
PRAGMA = re.compile(r"#\s*(noqa|type:|pragma|fmt:|isort:)")
ESCAPE = re.compile(r"^\s*(%|!)")


def ruff() -> str:
    beside = Path(sys.executable).with_name("ruff")
    return str(beside) if beside.exists() else (shutil.which("ruff") or "ruff")


def split_magic(source: str) -> tuple[str, str] | None:
    """``(magic lines with their newlines, body)`` when the body is Python; ``("", source)`` for a plain
    cell; None when any of the cell's stacked magics has a body in another language."""
    magics, body = "", source
    while body.startswith("%%"):  # stacked: ``%%needs nodes`` then ``%%writefile x.sbatch``
        first, _, body = body.partition("\n")
        name = first.split()[0]
        if name not in PYTHON_BODY or (name == "%%writefile" and not first.rstrip().endswith(".py")):
            return None
        magics += first + "\n"
    return magics, body


def format_cells(sources: list[str]) -> list[str]:
    """``ruff format`` over cells, as one notebook in a temporary folder (ruff's notebook mode knows
    IPython's line magics and ``!commands``); a cell ruff cannot parse comes back unchanged."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cells.ipynb"
        cells = [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                  "source": s, "id": f"c{i}"} for i, s in enumerate(sources)]
        nb = {"cells": cells, "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
        path.write_text(json.dumps(nb))
        cmd = [ruff(), "format", "--no-cache", "--isolated", "--line-length", str(LIMIT),
               "--config", "format.quote-style='preserve'", str(path)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:  # one cell ruff cannot parse: format the others one at a time
            return sources if len(sources) == 1 else [format_cells([s])[0] for s in sources]
        out = json.loads(path.read_text())["cells"]
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in out]


def comment_columns(source: str) -> dict[int, int]:
    """``{line index: column}`` of each comment that follows code on its line (IPython lines are masked
    first, so that ``tokenize`` reads the rest as Python)."""
    lines = source.split("\n")
    masked = "\n".join("" if ESCAPE.match(line) else line for line in lines)
    found = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(masked).readline):
            if tok.type == tokenize.COMMENT:
                row, col = tok.start
                if lines[row - 1][:col].strip():
                    found[row - 1] = col
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return {}
    return found


def balanced_wrap(text: str, width: int) -> list[str]:
    """``text`` in as few lines as ``width`` allows, the lines made about equally long (no lone last word)."""
    def wrap(w):
        return textwrap.wrap(text, w, break_long_words=False, break_on_hyphens=False)

    lines = wrap(width)
    narrow = width
    while narrow > 20 and len(wrap(narrow - 1)) == len(lines):
        narrow -= 1
    return wrap(narrow)


def wrap_comment(indent: str, text: str) -> list[str]:
    """A ``# text`` comment as lines of at most LIMIT characters (a word longer than that stays whole)."""
    body = text.lstrip("#").strip()
    width = max(LIMIT - len(indent) - 2, 20)
    return [f"{indent}# {part}" for part in balanced_wrap(body, width)] or [f"{indent}#"]


def reflow_comments(source: str) -> str:
    """Step 2: trailing comments of long lines move above them; long comment lines are wrapped."""
    trailing = comment_columns(source)
    out = []
    for i, line in enumerate(source.split("\n")):
        if len(line) <= LIMIT:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        code, comment = line[: trailing.get(i, len(line))].rstrip(), line[trailing.get(i, len(line)):]
        if i in trailing and len(code) + 2 + len(comment) <= LIMIT:  # it was long for its padding only
            out.append(f"{code}  {comment}")
        elif i in trailing and not PRAGMA.match(comment):
            out += wrap_comment(indent, comment)
            out.append(code)
        elif line.lstrip().startswith("#") and not line.lstrip().startswith("#!") and not PRAGMA.match(line.lstrip()):
            out += wrap_comment(indent, line.lstrip())
        else:
            out.append(line)
    return "\n".join(out)


STRING = re.compile(r"^(?P<indent>\s*)(?P<prefix>[fFrRbB]{0,2})(?P<q>['\"])(?P<body>.*)(?P=q)(?P<tail>[,)]?)$")


def bracketed_lines(source: str) -> set[int]:
    """Indices of lines that start inside brackets (where adjacent string literals may stand on their
    own lines); empty when the cell is not plain Python."""
    lines = source.split("\n")
    masked = "\n".join("" if ESCAPE.match(line) else line for line in lines)
    depth, inside = 0, set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(masked).readline):
            if tok.type == tokenize.OP and tok.string in "([{":
                depth += 1
            elif tok.type == tokenize.OP and tok.string in ")]}":
                depth -= 1
            elif tok.type in (tokenize.NL, tokenize.NEWLINE) and depth > 0:
                inside.add(tok.start[0])  # the next line (0-based: tok.start[0]) starts inside
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return set()
    return inside


def split_points(body: str, fstring: bool) -> list[int]:
    """Positions just after a space where a string's body may be cut: outside ``{...}`` of an f-string,
    and not inside an escape."""
    points, depth, k = [], 0, 0
    while k < len(body):
        c = body[k]
        if c == "\\":
            k += 2
            continue
        if fstring and body.startswith(("{{", "}}"), k):
            k += 2
            continue
        depth += fstring and c == "{"
        depth -= fstring and c == "}"
        if c == " " and depth == 0:
            points.append(k + 1)
        k += 1
    return points


def split_string_line(line: str) -> list[str] | None:
    """A line that is one string literal (ruff put it on its own line inside brackets) as several
    adjacent literals of at most LIMIT characters, which Python joins back into the same string."""
    m = STRING.match(line)
    if not m or m["q"] in m["body"] or "b" in m["prefix"].lower():
        return None
    indent, prefix, q, body, tail = m["indent"], m["prefix"], m["q"], m["body"], m["tail"]
    room = LIMIT - len(indent) - len(prefix) - 2 - len(tail)
    pieces, start = [], 0
    points = split_points(body, "f" in prefix.lower())
    while len(body) - start > room:
        cut = max((p for p in points if start < p <= start + room), default=None)
        if cut is None:
            return None
        pieces.append(body[start:cut])
        start = cut
    pieces.append(body[start:])
    if len(pieces) == 1:
        return None

    def literal(piece: str) -> str:
        keep = prefix if "{" in piece or "}" in piece else prefix.replace("f", "").replace("F", "")
        return f"{indent}{keep}{q}{piece}{q}"

    return [literal(p) for p in pieces[:-1]] + [literal(pieces[-1]) + tail]


def split_strings(source: str) -> str:
    """Step 3: long string literals alone on a line inside brackets become adjacent literals."""
    inside = bracketed_lines(source)
    out = []
    for i, line in enumerate(source.split("\n")):
        parts = split_string_line(line) if len(line) > LIMIT and i in inside else None
        out += parts or [line]
    return "\n".join(out)


def parse(source: str):
    """The syntax tree of a cell, each IPython line read as a call holding its text; None if not Python."""
    lines = [f"{m[1]}_ipython({line.strip()!r})" if (m := re.match(r"^(\s*)[%!]", line)) else line
             for line in source.split("\n")]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def docstrings(tree) -> list[ast.Expr]:
    """The docstring statements of a module, its classes and functions."""
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    owners = [tree, *(n for n in ast.walk(tree) if isinstance(n, kinds))]
    return [o.body[0] for o in owners if o.body and isinstance(o.body[0], ast.Expr)
            and isinstance(o.body[0].value, ast.Constant) and isinstance(o.body[0].value.value, str)]


def program(source: str) -> str | None:
    """The tree as text, docstrings blanked: wrapping a docstring changes prose, not what the code does."""
    tree = parse(source)
    if tree is None:
        return None
    for doc in docstrings(tree):
        doc.value.value = ""
    return ast.dump(tree)


def wrap_docstrings(source: str) -> str:
    """Step 3b: a docstring line over LIMIT is cut at spaces into lines of the same indentation."""
    tree = parse(source)
    if tree is None:
        return source
    rows = {r for d in docstrings(tree) for r in range(d.lineno - 1, d.end_lineno)}
    out = []
    for i, line in enumerate(source.split("\n")):
        if i not in rows or len(line) <= LIMIT:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        width = LIMIT - len(indent)
        out += [indent + part for part in balanced_wrap(line.strip(), width)]
    return "\n".join(out)


def same_program(before: str, after: str) -> bool:
    """What makes the tool safe to run on every chapter: code it can parse must parse to the same tree."""
    tree = program(before)
    return tree is None or tree == program(after)


def fit_sources(sources: list[str]) -> list[str]:
    """Steps 1 and 2 over a notebook's code cells until they no longer change."""
    parts = [split_magic(s) for s in sources]
    todo = [i for i, p in enumerate(parts) if p is not None]
    bodies = [parts[i][1] for i in todo]
    for _ in range(4):  # comments first: ruff would split a line to keep its trailing comment on it
        new = [wrap_docstrings(split_strings(b)) for b in format_cells([reflow_comments(b) for b in bodies])]
        if new == bodies:
            break
        bodies = new
    result = list(sources)
    for i, body in zip(todo, bodies, strict=True):
        if not same_program(parts[i][1], body):
            raise RuntimeError(f"cell {i}: the fitted code is not the same program:\n{body}")
        result[i] = parts[i][0] + body.rstrip("\n")
    return result


FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def fenced(cell: dict) -> list[str]:
    """The code a cell shows: a code cell's source, or the ```python blocks of a markdown cell (an
    exercise's solution, which the test suite runs)."""
    source = "".join(cell["source"])
    if cell["cell_type"] == "code":
        return [source]
    return [m[1].rstrip("\n") for m in FENCE.finditer(source)] if cell["cell_type"] == "markdown" else []


def markdown_blocks(text: str) -> list[str]:
    """The contents of a markdown text's ``` blocks, directives (```{note}) left out."""
    blocks, fence, lines = [], None, []
    for line in text.split("\n"):
        if line.startswith("```"):
            if fence is None:
                fence, lines = line[3:], []
            else:
                blocks += [] if fence.startswith("{") else ["\n".join(lines)]
                fence = None
        elif fence is not None:
            lines.append(line)
    return blocks


def shown(cell: dict) -> list[str]:
    """Every piece of code a cell shows: ``fenced`` and a markdown cell's other blocks (```bash, ...),
    which the tool cannot format: a person fits those."""
    if cell["cell_type"] != "markdown":
        return fenced(cell)
    return markdown_blocks("".join(cell["source"]))


def long_lines(notebook: dict) -> list[tuple[int, str]]:
    """``(cell index, line)`` for every line of code a reader sees (code cells, code blocks in markdown)
    longer than LIMIT."""
    return [(k, line) for k, cell in enumerate(notebook["cells"]) for code in shown(cell)
            for line in code.split("\n") if len(line) > LIMIT]


def fit(path: Path) -> bool:
    """Rewrite ``path`` in place; True when anything changed."""
    text = path.read_text(encoding="utf-8")
    nb = json.loads(text)
    blocks = [(cell, code) for cell in nb["cells"] for code in fenced(cell)]
    for (cell, code), new in zip(blocks, fit_sources([code for _, code in blocks]), strict=True):
        if new.rstrip("\n") == code.rstrip("\n"):
            continue
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            new = source.replace(f"```python\n{code}\n```", f"```python\n{new}\n```", 1)
        cell["source"] = re.findall(r"[^\n]*\n|[^\n]+$", new)
    new_text = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    if new_text != text:
        path.write_text(new_text, encoding="utf-8")
    return new_text != text


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [Path(a) for a in argv if a != "--check"]
    over = 0
    for path in paths:
        if not check and fit(path):
            print(f"fitted {path}")
        for k, line in long_lines(json.loads(path.read_text(encoding="utf-8"))):
            over += 1
            print(f"{path}: cell {k}: {len(line)} > {LIMIT}: {line.strip()[:90]}")
    return 1 if check and over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
