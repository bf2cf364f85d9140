"""Execute the book once per test run and build it from those executed notebooks.

The executed copy lives in a temporary folder; the repository's notebooks stay output-free.
Both the notebook tests and the book-build test use this one execution (CI time is finite and
every chapter launches real processes).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from nbrun import Execution, execute

ROOT = Path(__file__).resolve().parents[1]


def toc_files() -> list[str]:
    """``book/intro``, ``book/01_dp_vs_ddp``, ... in the order of ``_toc.yml``."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [c["file"] for c in part["chapters"]]
    return files


def chapter_files() -> list[str]:
    """The toc's notebooks (the intro and the chapters), without the appendix's markdown pages."""
    return [name for name in toc_files() if (ROOT / f"{name}.ipynb").exists()]


def copy_sources(dest: Path) -> None:
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy(ROOT / name, dest / name)
    shutil.copytree(ROOT / "book", dest / "book", ignore=shutil.ignore_patterns(".ipynb_checkpoints", "*.pt"))
    shutil.copytree(ROOT / "locales", dest / "locales")
    for folder in ("src", "bench"):  # chapters show package code (literalinclude) and run the benchmarks
        shutil.copytree(ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))


def execute_all(dest: Path) -> dict[str, Execution]:
    """Execute every toc notebook in place in ``dest``, in toc order, one at a time."""
    results = {}
    for name in toc_files():
        path = dest / f"{name}.ipynb"
        if path.exists():
            results[name] = execute(path, write_to=path)
            print(f"executed {name}: {results[name].seconds:.1f}s", file=sys.stderr)
    return results


def build_chinese(dest: Path) -> subprocess.CompletedProcess:
    """The Chinese edition from the same executed notebooks, into ``dest/_build/zh/html``."""
    return _i18n().build_edition(dest, dest / "_build" / "zh" / "html")


def _wheel():
    sys.path.insert(0, str(ROOT / "book"))
    import wheel

    return wheel


def _i18n():
    sys.path.insert(0, str(ROOT / "book"))
    import i18n

    return i18n


def build_without_executing(dest: Path) -> subprocess.CompletedProcess:
    config = yaml.safe_load((dest / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "off"
    (dest / "_config.yml").write_text(yaml.safe_dump(config))
    cmd = [str(Path(sys.executable).with_name("jupyter-book")), "build", str(dest), "-W", "--keep-going"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    _wheel().build(dest / "_build" / "html" / "_static")   # beside the pages, as book/build.sh puts it
    return done
