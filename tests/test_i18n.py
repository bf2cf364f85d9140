"""The Chinese edition: every English string has a reviewed translation, and the book builds in Chinese.

A change to a chapter's prose without its translation fails here (``python book/i18n.py update``
marks the changed entries; translate them, then ``python book/i18n.py check``).
"""
from __future__ import annotations

import re

import pytest
from book_copy import ROOT, _i18n, chapter_files, toc_files

i18n = _i18n()
CJK = re.compile(r"[\u4e00-\u9fff]")

POT = '''msgid ""
msgstr ""

msgid "1. Setup"
msgstr ""

msgid "Ranks average gradients."
msgstr ""
'''


def _catalogs(tmp_path, po_body: str):
    templates, locales = tmp_path / "gettext", tmp_path / "locales"
    (templates / "book").mkdir(parents=True)
    (templates / "book" / "ch.pot").write_text(POT)
    po = locales / "zh_CN" / "LC_MESSAGES" / "book" / "ch.po"
    po.parent.mkdir(parents=True)
    po.write_text('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n' + po_body)
    return templates, locales


def test_complete_catalog_has_no_problems(tmp_path):
    body = ('msgid "1. Setup"\nmsgstr "1\\\\. 准备"\n\n'
            'msgid "Ranks average gradients."\nmsgstr "各 rank 对梯度求平均。"\n')
    assert i18n.problems(*_catalogs(tmp_path, body)) == []


@pytest.mark.parametrize("body, problem", [
    ('msgid "1. Setup"\nmsgstr "1\\\\. 准备"\n', "missing"),
    ('msgid "1. Setup"\nmsgstr "1\\\\. 准备"\n\nmsgid "Ranks average gradients."\nmsgstr ""\n', "untranslated"),
    ('msgid "1. Setup"\nmsgstr "1\\\\. 准备"\n\n#, fuzzy\nmsgid "Ranks average gradients."\nmsgstr "旧"\n', "fuzzy"),
    ('msgid "1. Setup"\nmsgstr "1. 准备"\n\nmsgid "Ranks average gradients."\nmsgstr "平均。"\n', "numbered title"),
])
def test_each_kind_of_problem_is_reported(tmp_path, body, problem):
    found = i18n.problems(*_catalogs(tmp_path, body))
    assert len(found) == 1 and problem in found[0], found


@pytest.mark.slow
def test_every_english_string_is_translated(tmp_path):
    """From the English source, as ``i18n.py update`` makes the catalogs: an executed book's outputs
    are not prose, and its figure captions are translated from ``figures/*.po`` in the build's copy."""
    templates = i18n.extract_templates(ROOT, tmp_path)
    pages = sorted(n.split("/")[-1] for n in toc_files())
    assert sorted(p.stem for p in (templates / "book").glob("*.pot")) == pages
    notebooks = sorted(n.split("/")[-1] for n in chapter_files())
    assert sorted(p.stem for p in (templates / i18n.FIGURES).glob("*.pot")) == notebooks
    found = i18n.problems(templates, ROOT / "locales")
    assert not found, f"{len(found)} catalog entries need a translation:\n" + "\n".join(found[:40])


@pytest.mark.slow
def test_chinese_book_builds_without_warnings(executed_book):
    build = executed_book["build_zh"]
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("name", toc_files())
def test_chinese_pages_show_no_english_exercise_label(executed_book, name):
    zh = (executed_book["html_zh"] / f"{name}.html").read_text()
    assert "<summary>Solution" not in zh and not re.search(r"\bExercises?\b", zh), name
    en = (executed_book["html"] / f"{name}.html").read_text()
    assert zh.count("<summary>参考答案</summary>") == en.count("<summary>Solution</summary>")


@pytest.mark.slow
@pytest.mark.parametrize("name", toc_files())
def test_chinese_page_is_chinese_with_the_same_outputs(executed_book, name):
    zh = (executed_book["html_zh"] / f"{name}.html").read_text()
    en = (executed_book["html"] / f"{name}.html").read_text()
    assert 'lang="zh-CN"' in zh
    title = re.search(r"<h1>(.*?)<", zh).group(1)
    assert CJK.search(title), f"{name}: the title is not translated: {title!r}"
    assert zh.count('class="cell_output') == en.count('class="cell_output')


def test_captions_and_alt_text_are_templated_and_translated(tmp_path):
    import json

    nb = {"cells": [{"cell_type": "code", "metadata": {"mystnb": {"figure": {"caption": "Loss per step."},
                                                                    "image": {"alt": "A falling curve."}}}},
                    {"cell_type": "markdown", "metadata": {}}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "ch.ipynb").write_text(json.dumps(nb))
    assert i18n.figure_strings(nb) == ["Loss per step.", "A falling curve."]
    i18n.write_figure_templates(tmp_path, tmp_path / "pot")
    assert 'msgid "Loss per step."' in (tmp_path / "pot" / "ch.pot").read_text()
    po = tmp_path / "locales" / "zh_CN" / "LC_MESSAGES" / "figures" / "ch.po"
    po.parent.mkdir(parents=True)
    po.write_text('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
                  'msgid "Loss per step."\nmsgstr "每一步的损失。"\n\n'
                  '#, fuzzy\nmsgid "A falling curve."\nmsgstr "旧"\n')
    i18n.translate_figures(tmp_path)
    meta = json.loads((tmp_path / "book" / "ch.ipynb").read_text())["cells"][0]["metadata"]["mystnb"]
    assert meta == {"figure": {"caption": "每一步的损失。"}, "image": {"alt": "A falling curve."}}  # fuzzy: kept


def test_format_flags_are_dropped_keeping_the_others():
    text = '#, fuzzy, python-format\nmsgid "a"\n#, no-python-format, python-format\nmsgid "b"\n'
    assert i18n.drop_format_flags(text) == '#, fuzzy\nmsgid "a"\nmsgid "b"\n'


def test_every_catalog_passes_msgfmt_check():
    """Without a warning (a placeholder header is one), with a real header and no obsolete entries."""
    import subprocess

    catalogs = sorted((ROOT / "locales").rglob("*.po"))
    # the text of every page, and the figures of every notebook
    assert len(catalogs) == len(toc_files()) + len(chapter_files())
    for po in catalogs:
        done = subprocess.run(["msgfmt", "--check", "-o", "/dev/null", str(po)], capture_output=True, text=True)
        assert done.returncode == 0 and not done.stderr, f"{po.relative_to(ROOT)}: {done.stderr}"
        assert i18n.catalog_problems(po.read_text(encoding="utf-8")) == [], po.relative_to(ROOT)


PLACEHOLDER_PO = """# SOME DESCRIPTIVE TITLE.
#, fuzzy
msgid ""
msgstr ""
"Project-Id-Version: PROJECT VERSION\\n"
"PO-Revision-Date: YEAR-MO-DA HO:MI+ZONE\\n"
"Last-Translator: FULL NAME <EMAIL@ADDRESS>\\n"
"Content-Type: text/plain; charset=utf-8\\n"

msgid "a"
msgstr "甲"

#~ msgid "gone"
#~ msgstr ""
"""


def test_a_placeholder_header_and_obsolete_entries_are_found_and_msgfmt_warns(tmp_path):
    import subprocess

    found = i18n.catalog_problems(PLACEHOLDER_PO)
    assert "1 obsolete entries (#~): run python book/i18n.py update" in found
    assert "the header is marked fuzzy" in found
    assert {"PROJECT", "YEAR-MO-DA", "FULL NAME", "EMAIL@ADDRESS", "SOME DESCRIPTIVE TITLE"} <= {
        p.split(": ")[1] for p in found if p.startswith("placeholder")}
    (tmp_path / "x.po").write_text(PLACEHOLDER_PO.replace("#, fuzzy\n", ""))
    done = subprocess.run(["msgfmt", "--check", "-o", "/dev/null", str(tmp_path / "x.po")], capture_output=True,
                          text=True)
    assert "still has the initial default value" in done.stderr  # what the check above refuses
    clean = i18n.with_header(PLACEHOLDER_PO, i18n.new_header("book/ch", "2026-12-01 00:00+0000"))
    assert i18n.catalog_problems(clean.split("#~")[0]) == []


def test_update_keeps_each_header_drops_obsolete_entries_and_heads_a_new_catalog(tmp_path):
    """``merge`` is ``i18n.py update`` after the templates are extracted (sphinx-intl does the merge)."""
    templates, locales = tmp_path / "gettext", tmp_path / "locales"
    (templates / "book").mkdir(parents=True)
    added = "A new paragraph, unlike any other, about buckets."
    (templates / "book" / "ch.pot").write_text(f'msgid ""\nmsgstr ""\n\nmsgid "Ranks average gradients!"\n'
                                               f'msgstr ""\n\nmsgid "{added}"\nmsgstr ""\n')
    (templates / "book" / "new.pot").write_text('msgid ""\nmsgstr ""\n\nmsgid "Hello."\nmsgstr ""\n')
    po = locales / "zh_CN" / "LC_MESSAGES" / "book" / "ch.po"
    po.parent.mkdir(parents=True)
    header = i18n.new_header("book/ch", "2026-12-01 00:00+0000")
    po.write_text(header + '\nmsgid "Ranks average gradients."\nmsgstr "各 rank 对梯度求平均。"\n\n'
                  'msgid "Old text."\nmsgstr "旧文本。"\n')
    i18n.merge(templates, locales)
    text = po.read_text()
    assert i18n.po_header(text) == header  # byte for byte: branches do not conflict on it
    assert "Old text." not in text and "#~" not in text
    assert '#, fuzzy\nmsgid "Ranks average gradients!"' in text and f'msgid "{added}"\nmsgstr ""' in text
    new = (po.parent / "new.po").read_text()
    assert i18n.catalog_problems(new) == [] and "Project-Id-Version: distlab" in new


def test_raw_html_text_is_templated_and_translated_outside_code():
    cell = {"cell_type": "markdown", "metadata": {},
            "source": ["<details><summary>Solution</summary>\n\n", "`cuda:<rank>` and <sup>10</sup>\n</details>"]}
    assert i18n.figure_strings({"cells": [cell]}) == ["Solution"]
    i18n.translate_raw_html(cell, {"Solution": "参考答案"})
    assert cell["source"] == "<details><summary>参考答案</summary>\n\n`cuda:<rank>` and <sup>10</sup>\n</details>"
    code = {"cell_type": "code", "metadata": {}, "source": "print('<b>Solution</b>')"}
    assert i18n.figure_strings({"cells": [code]}) == []


def test_no_english_raw_html_text_is_left_in_the_chinese_notebooks(tmp_path):
    """What the Chinese build reads: the notebooks after ``translate_figures`` (every exercise's solution
    block included). The built pages are checked too (``test_chinese_pages_show_no_english_exercise_label``)."""
    import json
    import shutil

    shutil.copytree(ROOT / "book", tmp_path / "book", ignore=shutil.ignore_patterns("*.pt", ".ipynb_checkpoints"))
    shutil.copytree(ROOT / "locales", tmp_path / "locales")
    i18n.translate_figures(tmp_path)
    left = []
    for path in sorted((tmp_path / "book").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            left += [f"{path.stem}: {text!r}" for _, _, text in i18n.raw_html_spans(cell) if not CJK.search(text)]
    assert not left, left
    solutions = sum(p.read_text().count("<summary>参考答案</summary>") for p in (tmp_path / "book").glob("*.ipynb"))
    assert solutions >= 40


def test_a_page_that_stays_english_keeps_only_its_head_in_the_template(tmp_path):
    pot = tmp_path / "ref.pot"
    pot.write_text('msgid ""\nmsgstr ""\n\nmsgid "Reference"\nmsgstr ""\n\n'
                   'msgid "Generated; it stays in English."\nmsgstr ""\n\nmsgid "spawn(fn)"\nmsgstr ""\n')
    i18n.keep_head(pot, "stays in English")
    from babel.messages.pofile import read_po

    with open(pot, "rb") as f:
        assert [m.id for m in read_po(f) if m.id] == ["Reference", "Generated; it stays in English."]
    with pytest.raises(ValueError, match="no entry says"):
        i18n.keep_head(pot, "a sentence the page lost")
