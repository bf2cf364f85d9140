"""The Chinese edition: gettext catalogs for every chapter, and the build that applies them.

The English notebooks are the only source. Sphinx's gettext builder extracts every prose string of
the book (markdown cells, titles) into one ``.pot`` template per chapter; each chapter has a catalog
``locales/zh_CN/LC_MESSAGES/book/<chapter>.po`` holding its translations. What Sphinx never sees as
text (figure captions, alt text, raw HTML such as ``<summary>Solution</summary>``) has its own
catalog, ``.../figures/<chapter>.po``, applied to a copy of the notebooks when the edition is built.
Code cells and their outputs are not in the catalogs: both editions show the same executed cells.
Each term has one Chinese rendering, ``locales/zh_CN/glossary.tsv`` (checked by ``glossary.py``).

    python book/i18n.py update   # after editing a chapter: refresh the templates and the catalogs
    python book/i18n.py check    # list untranslated, fuzzy or malformed entries, and glossary misses (exit 1 if any)
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
TITLE_ZH = "distlab：把分布式数据并行跑起来"
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
    for page, marker in ENGLISH_AFTER.items():
        keep_head(templates / f"{page}.pot", marker)
    write_figure_templates(source, templates / FIGURES)
    return templates


#: pages that stay English in a translated edition after the entry that says so (the generated reference:
#: autodoc's text is the package's docstrings, which live in the code)
ENGLISH_AFTER = {"book/reference": "stays in English"}


def keep_head(pot: Path, marker: str) -> None:
    """Drop every entry of ``pot`` after the first one whose English contains ``marker`` (Sphinx writes a
    page's entries in the order they appear); no entry has the marker -> an error, not a silent skip."""
    from babel.messages.pofile import read_po, write_po

    with open(pot, "rb") as f:
        catalog = read_po(f)
    ids = [m.id for m in catalog if m.id]
    hits = [i for i, msgid in enumerate(ids) if marker in msgid]
    if not hits:
        raise ValueError(f"{pot.name}: no entry says {marker!r}; the page would stay untranslated unannounced")
    for msgid in ids[hits[0] + 1:]:
        del catalog[msgid]
    with open(pot, "wb") as f:
        write_po(f, catalog, width=0, omit_header=False)


# --- captions and alt text: MyST-NB reads them from each figure cell's metadata; with the raw HTML's
# text below, they make the ``figures`` catalogs (text Sphinx's gettext builder never sees) -----------
FIGURES = "figures"
FIGURE_KEYS = (("figure", "caption"), ("image", "alt"))


def figure_strings(notebook: dict) -> list[str]:
    """Every caption and alt text of a notebook's figure cells, in order, each once; then the text of
    its raw-HTML elements (see ``raw_html_spans``), each once."""
    found: list[str] = []
    for cell in notebook["cells"]:
        meta = cell.get("metadata", {}).get("mystnb", {})
        for group, key in FIGURE_KEYS:
            text = meta.get(group, {}).get(key)
            if text and text not in found:
                found.append(text)
    for cell in notebook["cells"]:
        for _, _, text in raw_html_spans(cell):
            if text not in found:
                found.append(text)
    return found


# --- raw HTML in markdown cells: MyST passes it through untouched, so Sphinx never extracts its text ---
# (``<details><summary>Solution</summary>``: without this the Chinese pages said "Solution" 40 times)
RAW_HTML = re.compile(r"<(?P<tag>[a-z][a-z0-9]*)(?:\s[^<>]*)?>(?P<text>[^<>]*[A-Za-z][^<>]*)</(?P=tag)>")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def raw_html_spans(cell: dict) -> list[tuple[int, int, str]]:
    """(start, end, text) of the text of each raw-HTML element in a markdown cell outside code (a
    ``<rank>`` in `` `cuda:<rank>` `` is code), whose text has a letter (``<sup>10</sup>`` has none)."""
    if cell.get("cell_type") != "markdown":
        return []
    source = "".join(cell.get("source", ""))
    masked = CODE.sub(lambda m: "\0" * len(m.group()), source)
    spans = [(m.start("text"), m.end("text")) for m in RAW_HTML.finditer(masked)]
    return [(start, end, source[start:end].strip()) for start, end in spans if source[start:end].strip()]


def translate_raw_html(cell: dict, table: dict[str, str]) -> None:
    """Replace the text of a markdown cell's raw-HTML elements by its translation, in place."""
    source = "".join(cell.get("source", ""))
    for start, end, text in reversed(raw_html_spans(cell)):
        if text in table:
            source = source[:start] + source[start:end].replace(text, table[text]) + source[end:]
    cell["source"] = source


def write_figure_templates(source: Path, folder: Path) -> None:
    """``figures/<chapter>.pot``: the captions, alt text and raw-HTML text, a template like Sphinx's own."""
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
    """Replace captions, alt text and raw-HTML text in ``source``'s notebooks by their translations."""
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
            if cell.get("cell_type") == "markdown":
                translate_raw_html(cell, table)
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
    """Refresh templates from the English text and merge them into the catalogs (sphinx-intl), dropping
    entries whose English is gone; every catalog keeps its header as it was (a new one gets ours)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        merge(extract_templates(source, Path(tmp)), source / LOCALES)


def merge(templates: Path, locales: Path) -> None:
    """``update``'s second half: the ``.pot`` files in ``templates`` into the catalogs under ``locales``."""
    catalogs = locales / LANGUAGE / "LC_MESSAGES"
    headers = {po: po_header(po.read_text(encoding="utf-8")) for po in catalogs.rglob("*.po")}
    cmd = [str(Path(sys.executable).with_name("sphinx-intl")), "update", "-p", str(templates),
           "-l", LANGUAGE, "-d", str(locales), "-w", "0", "--no-obsolete"]
    subprocess.run(cmd, check=True)
    for po in catalogs.rglob("*.po"):
        text = drop_obsolete(drop_format_flags(po.read_text(encoding="utf-8")))
        header = headers.get(po) or new_header(po.relative_to(catalogs).with_suffix("").as_posix())
        po.write_text(with_header(text, header), encoding="utf-8")


def drop_obsolete(text: str) -> str:
    """Remove ``#~`` entries: sphinx-intl's ``--no-obsolete`` keeps those a catalog already had
    (a merge of two branches brings some back)."""
    blocks = text.split("\n\n")
    kept = [b for b in blocks if not b.strip() or not all(line.startswith("#~") for line in b.strip().splitlines())]
    joined = "\n\n".join(kept)
    return joined if joined.endswith("\n") else joined + "\n"


# --- catalog headers: written once, then left alone -----------------------------------------------
# Babel rewrites a catalog's header (dates, "Generated-By") whenever its entries change; branches that
# each add a string to one chapter would then conflict on the header. ``update`` puts it back as it was.
HEADER = """# Chinese (Simplified) translation of the distlab book: {what} of {name}.
# This file is distributed under the same license as the distlab package.
#
msgid ""
msgstr ""
"Project-Id-Version: distlab\\n"
"Report-Msgid-Bugs-To: \\n"
"POT-Creation-Date: {date}\\n"
"PO-Revision-Date: {date}\\n"
"Last-Translator: the distlab authors\\n"
"Language: zh_CN\\n"
"Language-Team: the distlab authors\\n"
"Plural-Forms: nplurals=1; plural=0;\\n"
"MIME-Version: 1.0\\n"
"Content-Type: text/plain; charset=utf-8\\n"
"Content-Transfer-Encoding: 8bit\\n"
"""
PLACEHOLDERS = re.compile(r"PROJECT|Project name not set|FULL NAME|EMAIL@ADDRESS|YEAR-MO-DA|LL@li\.org|"
                          r"SOME DESCRIPTIVE TITLE|FIRST AUTHOR|ORGANIZATION")


def new_header(name: str, date: str | None = None) -> str:
    """The header of a new catalog ``name`` (``book/03_toy_model``), dated ``date`` (default: now)."""
    import datetime

    date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M+0000")
    folder, chapter = name.split("/")
    what = "the text" if folder == "book" else "the captions, alt text and raw-HTML text"
    return HEADER.format(what=what, name=chapter, date=date)


def po_header(text: str) -> str:
    """Everything before the first entry after the ``msgid ""`` header entry (comments included)."""
    start = re.search(r'^msgid ""\nmsgstr ""\n', text, re.M)
    if not start:
        return ""
    end = text.find("\n\n", start.end())
    return text[:end + 1] if end >= 0 else text


def with_header(text: str, header: str) -> str:
    return header + text[len(po_header(text)):]


def catalog_problems(text: str) -> list[str]:
    """What ``msgfmt --check`` lets through: obsolete entries, a fuzzy header, placeholder values."""
    found = []
    header = po_header(text)
    if "#~ " in text:
        found.append(f"{text.count('#~ msgid')} obsolete entries (#~): run python book/i18n.py update")
    if re.search(r"^#, .*fuzzy", header, re.M):
        found.append("the header is marked fuzzy")
    found += [f"placeholder in the header: {m.group()}" for m in PLACEHOLDERS.finditer(header)]
    return found


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
    """Entries missing, untranslated or fuzzy; catalogs with obsolete entries or a placeholder header;
    entries that miss a glossary rendering (``glossary.py``)."""
    import tempfile

    import glossary

    with tempfile.TemporaryDirectory() as tmp:
        found = problems(extract_templates(source, Path(tmp)), source / LOCALES)
    catalogs = source / LOCALES / LANGUAGE / "LC_MESSAGES"
    for po in sorted(catalogs.rglob("*.po")):
        found += [f"{po.relative_to(catalogs)}: {p}" for p in catalog_problems(po.read_text(encoding="utf-8"))]
    return found + glossary.check(source / LOCALES)


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
