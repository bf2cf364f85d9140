"""Chapter times with ranks forked from distlab's forkserver against fresh interpreters (#18).

Executes each chapter twice the way the test suite does (tests/nbrun.py: a fresh kernel, the
solutions run too), once with DISTLAB_START=spawn (every launch starts fresh interpreters, the
book before #18) and once with DISTLAB_START=forkserver, alternating which goes first so both see
the same load. Prints seconds per chapter and the ratio; last line: `ratio: X` = total forkserver
/ total spawn. Slow: about twice the book's execution time.

    python bench/chapter_times.py                       # every chapter in _toc.yml
    python bench/chapter_times.py book/04_point_to_point.ipynb book/05_collectives.ipynb
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from book_copy import toc_files  # noqa: E402
from nbrun import execute  # noqa: E402

MODES = ("spawn", "forkserver")


def time_chapter(path: Path, first: str) -> dict[str, float]:
    """Seconds per start mode for one chapter; raises if the chapter fails in either."""
    seconds = {}
    for mode in (first, *[m for m in MODES if m != first]):
        os.environ["DISTLAB_START"] = mode  # the kernel, and the ranks it launches, inherit it
        run = execute(path)
        if run.error:
            raise SystemExit(f"{path.name} failed with start={mode}:\n{run.error[-3000:]}")
        seconds[mode] = run.seconds
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", help="notebooks (default: every chapter in _toc.yml)")
    args = parser.parse_args()
    paths = [Path(p) for p in args.chapters] or [ROOT / f"{name}.ipynb" for name in toc_files()
                                                 if (ROOT / f"{name}.ipynb").exists()]
    print(f"{'chapter':<34}{'spawn s':>9}{'forkserver s':>14}{'ratio':>8}")
    totals = dict.fromkeys(MODES, 0.0)
    for i, path in enumerate(paths):
        seconds = time_chapter(path.resolve(), MODES[i % 2])
        for mode in MODES:
            totals[mode] += seconds[mode]
        print(f"{path.stem:<34}{seconds['spawn']:>9.1f}{seconds['forkserver']:>14.1f}"
              f"{seconds['forkserver'] / seconds['spawn']:>8.2f}", flush=True)
    print(f"{'all':<34}{totals['spawn']:>9.1f}{totals['forkserver']:>14.1f}")
    print(f"ratio: {totals['forkserver'] / totals['spawn']:.3f}")


if __name__ == "__main__":
    main()
