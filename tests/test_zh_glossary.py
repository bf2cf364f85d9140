"""The Chinese edition speaks with one voice: each glossary term has one rendering in every catalog.

``locales/zh_CN/glossary.tsv`` lists the terms; an entry whose English uses one (outside code) must
carry its rendering, unless ``glossary-exceptions.tsv`` gives the reason it does not.
"""
from __future__ import annotations

import sys

import pytest
from book_copy import ROOT

sys.path.insert(0, str(ROOT / "book"))
import glossary  # noqa: E402

ZH = ROOT / "locales" / "zh_CN"
TERMS = glossary.read_glossary(ZH / glossary.GLOSSARY)


def test_every_catalog_entry_uses_the_glossary():
    found = glossary.check(ROOT / "locales")
    assert not found, f"{len(found)} glossary problems:\n" + "\n".join(found[:60])


def test_the_glossary_covers_the_terms_a_reader_meets_most():
    english = [t.english for t in TERMS]
    assert len(english) == len(set(english)) >= 25
    for needed in ("epoch", "race (race condition)", "kernel (Jupyter)", "kernel (CUDA)", "rank", "job", "agent",
                   "buffer", "batch size", "running statistics", "optimizer step", "shadow (Join)", "failure lab",
                   "performance lab"):
        assert needed in english, needed
    assert any(t.word == "worker" for t in TERMS)
    by = {t.english: t.rendering for t in TERMS}
    assert by["race (race condition)"] == "竞态" and by["kernel (Jupyter)"] != by["kernel (CUDA)"]


def test_every_sense_rule_names_a_glossary_sense_that_is_not_the_default():
    """A renamed sense would silently switch its rule off."""
    for english in glossary.SENSES:
        term = next(t for t in TERMS if t.english == english)
        first = next(t for t in TERMS if t.word == term.word)
        assert first != term, f"{english}: the first sense of a word is its default and needs no rule"


def _terms(*lines):
    return [glossary.Term(e, *(e.split(" (")[0], e.split(" (")[1][:-1] if " (" in e else ""), r) for e, r in lines]


TOY = _terms(("epoch", "轮"), ("kernel (Jupyter)", "内核"), ("kernel (CUDA)", "核函数"),
             ("worker (process)", "工作进程"), ("worker (function)", "工作函数"), ("rank", "rank"))


@pytest.mark.parametrize("english, chinese, missing", [
    ("Each epoch reshuffles.", "每一轮都重新打乱。", []),
    ("Two epochs.", "两个 epoch。", ["epoch"]),                            # plural, and English left in
    ("Call `set_epoch(e)` first.", "先调用 `set_epoch(e)`。", []),       # code is not prose
    ("See [the docs](https://x.org/epoch).", "见文档。", []),            # nor is a link target
    ("Restart the kernel.", "重启内核。", []),
    ("Ops run C++/CUDA kernels.", "运算执行 C++/CUDA 内核。", ["kernel (CUDA)"]),
    ("Ops run C++/CUDA kernels in the kernel.", "内核中的运算执行 C++/CUDA 核函数。", []),
    ("Inductor fuses them into one Triton kernel.", "Inductor 把它们融合成一个 Triton 内核。", ["kernel (CUDA)"]),
    ("The worker below trains.", "下面的工作进程训练。", ["worker (function)"]),
    ("The worker exits.", "工作进程退出。", []),
    ("Each rank prints.", "每个 RANK 打印。", []),                          # Latin renderings: any case
    ("Each rank prints.", "每个 `rank` 打印。", ["rank"]),                 # ... but in prose
])
def test_an_entry_lacking_a_rendering_is_found(english, chinese, missing):
    assert [t.english for t in glossary.entry_problems(TOY, english, chinese)] == missing


def test_an_exception_excuses_one_entry_and_a_stale_one_is_reported():
    catalogs = {"book/ch": [("Two epochs.", "两个 epoch。"), ("One epoch.", "一个 epoch。")]}
    exceptions = {("book/ch", "epoch", "Two epochs"): "a quoted log line", ("book/ch", "rank", "x"): "stale"}
    found, used = glossary.problems(catalogs, TOY, exceptions)
    assert len(found) == 1 and "One epoch." in found[0]
    assert used == {("book/ch", "epoch", "Two epochs")}


def test_a_malformed_glossary_line_is_refused(tmp_path):
    (tmp_path / "g.tsv").write_text("epoch 轮\n")
    with pytest.raises(ValueError, match="g.tsv:1"):
        glossary.read_glossary(tmp_path / "g.tsv")


def test_a_repeated_english_string_reads_the_same_in_every_chapter():
    """"Learning goals", "Summary", "Each exercise has a check ...": one Chinese form each."""
    seen: dict[str, dict[str, str]] = {}
    for name, entries in glossary.load_catalogs(ROOT / "locales").items():
        for english, chinese in entries:
            seen.setdefault(english, {})[name] = chinese
    differ = {e: forms for e, forms in seen.items() if len(set(forms.values())) > 1}
    assert not differ, differ
    assert len(seen["**Learning goals.** After this chapter you can"]) >= 10  # the check has something to see


def test_every_exercise_label_has_one_form():
    """**Exercise 3.** -> **练习 3**：, and **Exercise 3. A title.** -> **练习 3：标题。** (the same label, the
    bold running over the title as in English); **3.** under an Exercises heading stays **3.**"""
    import re

    labels = 0
    for name, entries in glossary.load_catalogs(ROOT / "locales").items():
        for english, chinese in entries:
            untitled = re.match(r"\*\*Exercise (\d+)\.\*\*", english)
            titled = re.match(r"\*\*Exercise (\d+)\. [^*]+\*\*", english)
            numbered = re.match(r"\*\*(\d+)\.\*\*", english)
            if untitled:
                assert chinese.startswith(f"**练习 {untitled[1]}**："), (name, chinese[:30])
            elif titled:
                assert re.match(rf"\*\*练习 {titled[1]}：[^*]+\*\* ", chinese), (name, chinese[:30])
            elif numbered:
                assert chinese.startswith(f"**{numbered[1]}.** ") or chinese.startswith(f"**{numbered[1]}.**（")
            else:
                assert "Exercise" not in glossary.prose(chinese), (name, chinese[:60])
                continue
            labels += 1
    assert labels >= 40


def test_chinese_prose_quotes_with_chinese_quotation_marks():
    """“…”, not "…" (code, where ASCII quotes belong, is not prose)."""
    import re

    found = [(name, chinese[:60]) for name, entries in glossary.load_catalogs(ROOT / "locales").items()
             for _, chinese in entries
             if re.search(r"[\u4e00-\u9fff]", chinese) and '"' in glossary.prose(chinese)]
    assert not found, found
