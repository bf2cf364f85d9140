"""The Chinese edition's glossary: one rendering per term, checked against every catalog entry.

``locales/zh_CN/glossary.tsv`` holds one line per term: the English term, a tab, its one Chinese
rendering. A term may name its sense in parentheses (``kernel (Jupyter)``, ``kernel (CUDA)``): the
English around each use of the word decides which sense, and so which rendering, that use needs
(``SENSES``). An entry whose English uses a term (outside code, math, URLs and HTML) and whose Chinese
lacks the rendering is a problem, unless ``glossary-exceptions.tsv`` lists it with a reason.

Why a check and not a style guide: the catalogs are written by many hands, chapter by chapter, and a
reader who meets 轮, 轮次 and "epoch" for one word assumes three things.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

GLOSSARY = "glossary.tsv"
EXCEPTIONS = "glossary-exceptions.tsv"

# The English that selects a sense other than the term's default (the sense listed first in the
# glossary). Matched against the text around each use of the word (SENSE_WINDOW characters each side).
SENSES = {
    "kernel (CUDA)": (r"(C\+\+|CUDA|GPU|NCCL|Triton|compute|fused|custom|tiny|small|big|large|shared-memory"
                      r"( all-reduce)?) kernels?\b|\bkernels? (of a|launch|fusion)"),
    "worker (function)": r"\bworkers? (below|above|in which|of your own|that calls|defined)\b|\bDDP worker\b",
    "batch (Slurm)": r"\bbatch (script|jobs?|system|queue|scheduler|step)s?\b|\bsbatch\b|\bSlurm\b",
}
SENSE_WINDOW = 40

# What is not prose: fenced and inline code, math (and a LaTeX command with its argument in a math
# block, which the catalog holds without its $$), URLs and link targets, HTML tags.
NOT_PROSE = re.compile(
    r"```.*?```|``.*?``|`[^`]*`|\$\$.*?\$\$|\$[^$\n]+\$|\\[a-zA-Z]+\{[^}]*\}|\]\([^)]*\)|https?://\S+|<[^>\n]+>",
    re.S)


@dataclass(frozen=True)
class Term:
    english: str     # as written in the glossary, sense included: "kernel (CUDA)"
    word: str        # the English searched for: "kernel"
    sense: str       # "CUDA", or "" for a term with one sense
    rendering: str   # "核函数"

    @property
    def pattern(self) -> re.Pattern:
        """The word with its plural (-s, -es) and -ing/-ism forms; spaces and hyphens interchangeable."""
        parts = [re.escape(p) for p in re.split(r"[- ]", self.word)]
        return re.compile(r"\b" + r"[- ]".join(parts) + r"(s|es|ing|ism)?\b", re.I)


def read_glossary(path: Path) -> list[Term]:
    terms = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 2 or not all(f.strip() for f in fields):
            raise ValueError(f"{path.name}:{number}: want 'English term<TAB>Chinese rendering', got {line!r}")
        english, rendering = (f.strip() for f in fields)
        sense = re.fullmatch(r"(.+?) \((.+)\)", english)
        word, meaning = (sense.group(1), sense.group(2)) if sense else (english, "")
        terms.append(Term(english, word, meaning, rendering))
    return terms


def read_exceptions(path: Path) -> dict[tuple[str, str, str], str]:
    """(catalog, term, a piece of the entry's English) -> why that entry keeps another rendering."""
    found = {}
    if not path.exists():
        return found
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split("\t")]
        if len(fields) != 4 or not all(fields):
            raise ValueError(f"{path.name}:{number}: want 'catalog<TAB>term<TAB>English excerpt<TAB>reason'")
        found[tuple(fields[:3])] = fields[3]
    return found


def prose(text: str) -> str:
    return NOT_PROSE.sub(" ", text)


def required(terms: list[Term], english: str) -> list[Term]:
    """The terms whose rendering the translation of ``english`` must contain (each once, in glossary order)."""
    text = prose(english)
    by_word: dict[str, list[Term]] = {}
    for term in terms:
        by_word.setdefault(term.word.lower(), []).append(term)
    needed: list[Term] = []
    for senses in by_word.values():
        for match in senses[0].pattern.finditer(text):
            around = text[max(0, match.start() - SENSE_WINDOW):match.end() + SENSE_WINDOW]
            chosen = next((t for t in senses[1:] if re.search(SENSES.get(t.english, r"(?!)"), around, re.I)),
                          senses[0])
            if chosen not in needed:
                needed.append(chosen)
    return [t for t in terms if t in needed]


def entry_problems(terms: list[Term], english: str, chinese: str) -> list[Term]:
    """The required terms whose rendering the Chinese prose lacks (Latin renderings: any case)."""
    text = prose(chinese).lower()
    return [t for t in required(terms, english) if t.rendering.lower() not in text]


def problems(catalogs: dict[str, list[tuple[str, str]]], terms: list[Term],
             exceptions: dict[tuple[str, str, str], str]) -> tuple[list[str], set]:
    """``catalogs``: name -> [(English, Chinese)]. Returns the problems, one line each, and the
    exceptions that were used (an unused one is stale)."""
    found, used = [], set()
    for name, entries in catalogs.items():
        for english, chinese in entries:
            if not chinese:
                continue  # untranslated: reported by i18n.problems
            for term in entry_problems(terms, english, chinese):
                key = next((k for k in exceptions if k[0] == name and k[1] == term.english and k[2] in english), None)
                if key:
                    used.add(key)
                    continue
                found.append(f"{name}: {term.english!r} -> {term.rendering!r} missing in: {english[:70]!r}")
    return found, used


def load_catalogs(locales: Path, language: str = "zh_CN") -> dict[str, list[tuple[str, str]]]:
    """Every catalog's translated entries, named like ``book/03_toy_model``."""
    from babel.messages.pofile import read_po

    folder = locales / language / "LC_MESSAGES"
    catalogs = {}
    for po in sorted(folder.rglob("*.po")):
        with open(po, "rb") as f:
            catalog = read_po(f)
        name = po.relative_to(folder).with_suffix("").as_posix()
        catalogs[name] = [(m.id, m.string) for m in catalog if m.id and not m.fuzzy]
    return catalogs


def check(locales: Path, language: str = "zh_CN") -> list[str]:
    """Glossary problems in every catalog, plus every exception that no longer excuses anything."""
    folder = locales / language
    exceptions = read_exceptions(folder / EXCEPTIONS)
    found, used = problems(load_catalogs(locales, language), read_glossary(folder / GLOSSARY), exceptions)
    stale = [f"{EXCEPTIONS}: no longer needed, remove it: {k}" for k in exceptions if k not in used]
    return found + stale
