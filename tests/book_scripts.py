"""The Python scripts the book's chapters write with ``%%writefile``, taken from the notebooks (never copied)."""
import json
import re
from pathlib import Path

BOOK = Path(__file__).resolve().parent.parent / "book"
_WRITEFILE = re.compile(r"^%%writefile\s+(\S+\.py)\s*$", re.M)


def book_scripts(book: Path = BOOK) -> dict[str, tuple[str, str]]:
    """``{file name: (chapter, source)}`` for every ``%%writefile NAME.py`` cell (its magic lines dropped)."""
    found = {}
    for notebook in sorted(book.glob("*.ipynb")):
        for cell in json.loads(notebook.read_text())["cells"]:
            text = "".join(cell["source"])
            match = _WRITEFILE.search(text) if cell["cell_type"] == "code" else None
            if match:
                body = "\n".join(line for line in text.splitlines() if not line.startswith("%%"))
                found[match.group(1).rsplit("/", 1)[-1]] = (notebook.stem, body + "\n")
    return found


def write_all(folder: Path, book: Path = BOOK) -> dict[str, Path]:
    """Every script into ``folder`` (they import each other, as chapter 13's imports chapter 7's)."""
    paths = {}
    for name, (_, source) in book_scripts(book).items():
        paths[name] = folder / name
        paths[name].write_text(source)
    return paths
