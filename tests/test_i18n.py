"""The Chinese edition: every English string has a reviewed translation, and the book builds in Chinese.

A change to a chapter's prose without its translation fails here (``python book/i18n.py update``
marks the changed entries; translate them, then ``python book/i18n.py check``).
"""
from __future__ import annotations

import re

import pytest
from book_copy import ROOT, _i18n, toc_files

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
    assert sorted(p.stem for p in (templates / i18n.FIGURES).glob("*.pot")) == pages
    found = i18n.problems(templates, ROOT / "locales")
    assert not found, f"{len(found)} catalog entries need a translation:\n" + "\n".join(found[:40])


@pytest.mark.slow
def test_chinese_book_builds_without_warnings(executed_book):
    build = executed_book["build_zh"]
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]


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
    import subprocess

    catalogs = sorted((ROOT / "locales").rglob("*.po"))
    assert len(catalogs) == 2 * len(toc_files())  # the text and the figures of every chapter
    for po in catalogs:
        done = subprocess.run(["msgfmt", "--check", "-o", "/dev/null", str(po)], capture_output=True, text=True)
        assert done.returncode == 0, f"{po.relative_to(ROOT)}: {done.stderr}"
