"""One benchmark on two versions of distlab, alternated in one session: did a change move the figures?

    python bench/before_after.py REV bench/vs_accelerate.py [ARGS...]     # REV: a commit, e.g. HEAD~1
    python bench/before_after.py --rounds 3 15ffa70 bench/warm_ranks.py

Each version runs its own copy of the bench script against its own ``src`` (the old one is
exported from git into a temporary folder), ``--rounds`` times, in alternating order (before,
after, after, before, ...), so that drift of the machine falls on both alike. Each run's last
``ratio:`` line is collected; the bench's own baseline is measured in that same run.

Last line: ``ratio: X`` = median ratio after / median ratio before (1.0: no change).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def export(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (src, bench, tests' helpers) in ``into``: what its bench scripts need."""
    archive = subprocess.run(["git", "archive", rev, "src", "bench", "tests"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run(tree: Path, script: str, args: list[str]) -> tuple[float, str]:
    """One run of ``tree``'s copy of ``script``; its ratio and its whole output."""
    extra = os.environ.get("PYTHONPATH", "")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree / "src"), str(tree / "bench"), extra]))}
    done = subprocess.run([sys.executable, str(tree / script), *args], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("ratio:")]
    if done.returncode != 0 or not lines:
        output = done.stdout[-2000:] + done.stderr[-2000:]
        sys.exit(f"before_after.py: {tree / script} failed ({done.returncode}):\n{output}")
    return float(lines[-1].split()[1]), done.stdout


def order(rounds: int) -> list[str]:
    """before, after, after, before, before, after, ...: each version first as often as the other."""
    pairs = [("before", "after"), ("after", "before")]
    return [name for i in range(rounds) for name in pairs[i % 2]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("rev", help="the version before (a git commit)")
    parser.add_argument("script", help="the bench script, relative to the repo root")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    a = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="before-after-") as tmp:
        trees = {"before": export(a.rev, Path(tmp)), "after": ROOT}
        ratios: dict[str, list[float]] = {"before": [], "after": []}
        for name in order(a.rounds):
            ratio, _ = run(trees[name], a.script, a.args)
            ratios[name].append(ratio)
            print(f"{name:6} {a.script} {' '.join(a.args)}: ratio {ratio:.4g}", flush=True)
    before, after = statistics.median(ratios["before"]), statistics.median(ratios["after"])
    print(f"median ratio before {before:.4g} ({a.rev}), after {after:.4g} (this tree)")
    print(f"ratio: {after / before:.3f}")


if __name__ == "__main__":
    main()
