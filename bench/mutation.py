"""Mutation testing of the launcher's pure modules (issue #21). Slow (tens of minutes); not part of CI.

Runs mutmut 3: it copies the project into ``mutants/``, breaks the code one small change at a
time and runs the fast tests against each break. Which modules and which tests is configured in
``[tool.mutmut]`` of pyproject.toml (``only_mutate``: add a module there; tests that start
processes are not selected). Then this script lists every surviving mutant that is not accepted
below as equivalent, and ends with

    score: X      (killed / (total - equivalent); timeouts count as killed)

    python bench/mutation.py                 # from scratch (deletes mutants/)
    python bench/mutation.py --keep          # reuse mutants/: mutmut reruns only what changed
    python bench/mutation.py --report-only   # score the last run again

An equivalent mutant changes the code but not what it does, so no test can kill it. Each one is
matched by the function it is in and a piece of its mutated line, with the reason it is harmless.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
GOAL = 0.85
KILLED = {"killed", "timeout", "segfault", "caught by type check"}

# (module.function the mutant is in, text in its mutated line, why no test can tell it apart)
EQUIVALENT: list[tuple[str, str, str]] = [
    ("distlab.capture.collect.global_names", '"XX<distlab-capture>XX"',
     "the file name given to compile() only shows in a SyntaxError, and the text comes from code that compiled"),
    ("distlab.capture.collect.global_names", '"<DISTLAB-CAPTURE>"', "the same file name, upper-cased"),
    ("distlab.results.read_returns", "map_location=None",
     "only a return value saved on a GPU loads differently; the fast tests run without one"),
    ("distlab.results.read_returns", "torch.load(path, weights_only=False)", "map_location dropped: as above"),
    ("distlab.config.device", "local - 1)))",
     "choose_device asks for max(world_size, local_rank + 1) GPUs: a world size below local_rank + 1 changes nothing"),
    ("distlab.capture.source._around_methods", "_first_line(n) < code.co_firstlineno",
     "a method's def cannot begin on the first line of its class statement"),
    ("distlab.capture.source._written_in", "candidate.span[0] < code.co_firstlineno",
     "a method's def cannot begin on the first line of its class statement"),
    ("distlab.capture.source._from_inspect", "cls.__name__)[:2]",
     "a second candidate exists only for a class holding a nested class of its own name"),
]


def mutmut(*args: str, check: bool = True) -> str:
    """Run mutmut in the project root; its progress goes to our stdout when not captured."""
    command = [sys.executable, "-m", "mutmut", *args]
    done = subprocess.run(command, cwd=ROOT, text=True, capture_output=args[0] != "run")
    if check and done.returncode != 0:
        sys.exit(f"mutation.py: `mutmut {' '.join(args)}` failed ({done.returncode}):\n{done.stderr or ''}")
    return done.stdout or ""


def statuses() -> dict[str, str]:
    """mutant name -> status, for every mutant of the last run."""
    found = {}
    for line in mutmut("results", "--all", "true").splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and name.startswith(("distlab.", "src.")):
            found[name] = status
    if not found:
        sys.exit("mutation.py: mutmut reported no mutants; did `mutmut run` finish?")
    return found


def mutated_lines(name: str) -> list[str]:
    """The lines a mutant added, from ``mutmut show`` (a unified diff)."""
    diff = mutmut("show", name)
    return [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]


def function_of(name: str) -> str:
    """``distlab.capture.collect.x_compact__mutmut_3`` -> ``distlab.capture.collect.compact`` (methods too)."""
    module, _, mangled = name.rpartition(".")
    mangled = re.sub(r"__mutmut_\d+$", "", mangled)
    mangled = re.sub(r"^x[_ǁ]", "", mangled)
    return f"{module}.{mangled.replace('ǁ', '.').lstrip('.')}"


def equivalence(name: str) -> str | None:
    """The reason a surviving mutant is accepted, or None when it is a gap in the tests."""
    where = function_of(name)
    lines = None
    for function, text, reason in EQUIVALENT:
        if function != where:
            continue
        lines = mutated_lines(name) if lines is None else lines
        if any(text in line for line in lines):
            return reason
    return None


def report(found: dict[str, str]) -> float:
    survivors = sorted(n for n, s in found.items() if s not in KILLED)
    accepted = {n: r for n in survivors if (r := equivalence(n)) is not None}
    killed = sum(s in KILLED for s in found.values())
    counted = len(found) - len(accepted)
    print(f"\nmodules: {', '.join(configured_modules())}")
    print(f"mutants: {len(found)}, killed: {killed}, equivalent (accepted): {len(accepted)}, "
          f"not killed: {len(survivors) - len(accepted)}")
    for name in survivors:
        if name not in accepted:
            print(f"  {found[name]:10} {name}: {' | '.join(mutated_lines(name))}")
    print("accepted as equivalent:")
    for name, reason in accepted.items():
        print(f"  {name}: {reason}")
    score = killed / counted if counted else 0.0
    print(f"goal: {GOAL}")
    print(f"score: {score:.3f}")
    return score


def mutmut_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]


def configured_modules() -> list[str]:
    return [m for m in mutmut_config()["only_mutate"] if (ROOT / m).exists()]


# Fast test files that use a mutated module but stay out of the selection, and why.
NOT_SELECTED = {
    "tests/test_shared_machine.py": "creates a second Unix user and runs commands as it (root only, seconds each)",
}


def unselected_tests() -> list[str]:
    """Fast test files that import a mutated module but are not in the selection (a gap in the score).
    The chapters' helper tests (test_teach_*) only borrow RunResult to fake a run."""
    selected = set(mutmut_config()["pytest_add_cli_args_test_selection"]) | set(NOT_SELECTED)
    names = "|".join(Path(m).stem for m in configured_modules())
    uses = re.compile(rf"distlab\.({names})\b|from distlab import [^\n]*\b({names})\b")
    return [f"tests/{p.name}" for p in sorted((ROOT / "tests").glob("test_*.py")) if not p.name.startswith("test_teach")
            if f"tests/{p.name}" not in selected and uses.search(p.read_text())
            and "pytestmark = pytest.mark.slow" not in p.read_text()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="reuse mutants/ from the last run")
    parser.add_argument("--report-only", action="store_true", help="only score the last run")
    parser.add_argument("--max-children", type=int, default=2, help="mutants tested at once (default 2)")
    options = parser.parse_args()
    for path in unselected_tests():
        print(f"mutation.py: {path} tests a mutated module but is not selected in [tool.mutmut]")
    if not options.report_only:
        if not options.keep:
            shutil.rmtree(ROOT / "mutants", ignore_errors=True)
        mutmut("run", "--max-children", str(options.max_children))
    report(statuses())


if __name__ == "__main__":
    main()
