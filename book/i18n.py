"""The Chinese edition: gettext catalogs for every chapter, and the build that applies them.

The English notebooks are the only source. Sphinx's gettext builder extracts every prose string of
the book (markdown cells, titles, captions, alt text) into one ``.pot`` template per chapter; each
chapter has a catalog ``locales/zh_CN/LC_MESSAGES/book/<chapter>.po`` holding its translations. Code
cells and their outputs are not in the catalogs: both editions show the same executed cells.

    python book/i18n.py update   # after editing a chapter: refresh the templates and the catalogs
    python book/i18n.py check    # list untranslated, fuzzy or malformed entries (exit 1 if any)
    bash book/build-zh.sh        # build the Chinese edition into _build/zh/html (after book/build.sh)

``update`` keeps existing translations, adds new strings untranslated and marks changed ones
*fuzzy*; ``check`` (and the test suite) fails until each of those has a reviewed translation.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LANGUAGE = "zh_CN"
LOCALES = "locales"
TITLE_ZH = "distlab：分布式数据并行，可执行的教程"
NUMBERED = re.compile(r"^\d+\. ")


def jupyter_book() -> str:
    return str(Path(sys.executable).with_name("jupyter-book"))


def write_config(source: Path, dest: Path, language: str | None) -> Path:
    """A copy of ``source``'s _config.yml with execution off (the notebooks are already executed, or
    only their text is needed) and, for a translated edition, its language and title."""
    config = yaml.safe_load((source / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "off"
    if language:
        config["sphinx"]["config"]["language"] = language
        config["title"] = TITLE_ZH
    dest.write_text(yaml.safe_dump(config, allow_unicode=True))
    return dest


def extract_templates(source: Path, out: Path) -> Path:
    """Run Sphinx's gettext builder over the book in ``source``, and add the figures' captions and
    alt text (cell metadata, which Sphinx never sees as text); returns the folder of .pot files."""
    config = write_config(source, out / "_config.gettext.yml", None)
    cmd = [jupyter_book(), "build", str(source), "--config", str(config), "--path-output", str(out),
           "--builder", "custom", "--custom-builder", "gettext"]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    templates = out / "_build" / "gettext"
    write_figure_templates(source, templates / FIGURES)
    return templates


# --- captions and alt text: MyST-NB reads them from each figure cell's metadata ----------------------
FIGURES = "figures"
FIGURE_KEYS = (("figure", "caption"), ("image", "alt"))


def figure_strings(notebook: dict) -> list[str]:
    """Every caption and alt text of a notebook's figure cells, in order, each once."""
    found: list[str] = []
    for cell in notebook["cells"]:
        meta = cell.get("metadata", {}).get("mystnb", {})
        for group, key in FIGURE_KEYS:
            text = meta.get(group, {}).get(key)
            if text and text not in found:
                found.append(text)
    return found


def write_figure_templates(source: Path, folder: Path) -> None:
    """``figures/<chapter>.pot``: the captions and alt text, a template like Sphinx's own."""
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import write_po

    folder.mkdir(parents=True, exist_ok=True)
    for path in sorted((source / "book").glob("*.ipynb")):
        catalog = Catalog()
        for text in figure_strings(json.loads(path.read_text())):
            catalog.add(text)
        with open(folder / f"{path.stem}.pot", "wb") as f:
            write_po(f, catalog)


def translate_figures(source: Path, language: str = LANGUAGE) -> None:
    """Replace captions and alt text in ``source``'s notebooks by their translations."""
    from babel.messages.pofile import read_po

    for path in sorted((source / "book").glob("*.ipynb")):
        po = source / LOCALES / language / "LC_MESSAGES" / FIGURES / f"{path.stem}.po"
        if not po.exists():
            continue
        with open(po, "rb") as f:
            table = {m.id: m.string for m in read_po(f) if m.id and m.string and not m.fuzzy}
        notebook = json.loads(path.read_text())
        for cell in notebook["cells"]:
            meta = cell.get("metadata", {}).get("mystnb", {})
            for group, key in FIGURE_KEYS:
                text = meta.get(group, {}).get(key)
                if text in table:
                    meta[group][key] = table[text]
        path.write_text(json.dumps(notebook, ensure_ascii=False, indent=1))


def build_edition(source: Path, out_html: Path, language: str = LANGUAGE, strict: bool = True):
    """Build the book in ``source`` (notebooks already executed) in ``language`` into ``out_html``.

    The build reads a copy in ``<out_html>/../src`` (the figures' captions are translated in it)."""
    work = out_html.parent
    src = work / "src"
    work.mkdir(parents=True, exist_ok=True)
    if source.resolve() != src.resolve():
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(source, src, ignore=shutil.ignore_patterns("_build", ".jupyter_cache", ".ipynb_checkpoints"))
    translate_figures(src, language)
    config = write_config(src, work / f"_config.{language}.yml", language)
    cmd = [jupyter_book(), "build", str(src), "--config", str(config), "--path-output", str(work)]
    if strict:
        cmd += ["-W", "--keep-going"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if (work / "_build" / "html").exists():
        shutil.rmtree(out_html, ignore_errors=True)
        (work / "_build" / "html").rename(out_html)
    return done


def problems(templates: Path, locales: Path, language: str = LANGUAGE) -> list[str]:
    """Every entry of every template that is missing, untranslated or fuzzy in its catalog, and every
    numbered title whose translation would be read as a list (``1\\.`` keeps it a title)."""
    from babel.messages.pofile import read_po

    found = []
    for pot in sorted(templates.rglob("*.pot")):
        rel = pot.relative_to(templates).with_suffix(".po")
        po_path = locales / language / "LC_MESSAGES" / rel
        if not po_path.exists():
            found.append(f"{rel}: no catalog (run: python book/i18n.py update)")
            continue
        with open(pot, "rb") as f:
            wanted = [m.id for m in read_po(f) if m.id]
        with open(po_path, "rb") as f:
            catalog = read_po(f)
        for msgid in wanted:
            found += [f"{rel}: {p}: {msgid[:80]!r}" for p in _entry_problems(catalog.get(msgid), msgid)]
    return found


def _entry_problems(message, msgid: str) -> list[str]:
    if message is None:
        return ["missing"]
    if message.fuzzy:
        return ["fuzzy"]
    if not message.string:
        return ["untranslated"]
    if NUMBERED.match(msgid) and not re.match(r"^\d+\\\. ", message.string):
        return ["numbered title must start with 'N\\. ' in the translation"]
    return []


def assemble_executed_copy(dest: Path, executed: Path, root: Path = ROOT) -> None:
    """``dest`` = the book's sources with each notebook replaced by its executed copy from ``executed``
    (one execution serves both editions: outputs are the same in every language)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy(root / name, dest / name)
    shutil.copytree(root / "book", dest / "book", ignore=shutil.ignore_patterns(".ipynb_checkpoints", "*.pt"))
    shutil.copytree(root / LOCALES, dest / LOCALES)
    for notebook in (dest / "book").glob("*.ipynb"):
        ran = executed / notebook.name
        if not ran.exists() or ran.stat().st_mtime < notebook.stat().st_mtime:
            raise FileNotFoundError(f"{ran} is missing or older than {notebook.name}: run bash book/build.sh first")
        shutil.copy(ran, notebook)


def build_zh(root: Path = ROOT) -> int:
    """``bash book/build-zh.sh``: the Chinese edition from the English build's executed notebooks."""
    assemble_executed_copy(root / "_build" / "zh" / "src", root / "_build" / "jupyter_execute" / "book", root)
    done = build_edition(root / "_build" / "zh" / "src", root / "_build" / "zh" / "html")
    sys.stdout.write(done.stdout[-3000:] + done.stderr[-3000:])
    return done.returncode


def update(source: Path = ROOT) -> None:
    """Refresh templates from the English text and merge them into the catalogs (sphinx-intl)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        templates = extract_templates(source, Path(tmp))
        cmd = [str(Path(sys.executable).with_name("sphinx-intl")), "update", "-p", str(templates),
               "-l", LANGUAGE, "-d", str(source / LOCALES), "-w", "0"]
        subprocess.run(cmd, check=True)
    for po in (source / LOCALES).rglob("*.po"):
        po.write_text(drop_format_flags(po.read_text()))


FORMAT_FLAGS = re.compile(r"(no-)?python(-brace)?-format")


def drop_format_flags(text: str) -> str:
    """gettext guesses that prose with a "%" ("2% of fp32's loss") is a printf format and then
    ``msgfmt --check`` rejects its translation; the book's text is never a format string."""
    out = []
    for line in text.splitlines(keepends=True):
        if line.startswith("#,"):
            flags = [f.strip() for f in line[2:].split(",") if f.strip() and not FORMAT_FLAGS.fullmatch(f.strip())]
            if not flags:
                continue
            line = "#, " + ", ".join(flags) + "\n"
        out.append(line)
    return "".join(out)


def check(source: Path = ROOT) -> list[str]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        return problems(extract_templates(source, Path(tmp)), source / LOCALES)


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "update":
        update()
    elif command == "build-zh":
        sys.exit(build_zh())
    elif command == "check":
        issues = check()
        print("\n".join(issues) or "every entry is translated")
        sys.exit(1 if issues else 0)
    else:
        sys.exit(__doc__)
