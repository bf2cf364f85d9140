"""CI's sampled mutation run (issue #60): the mutants of the pure modules the change touched, within
5 minutes. It fails when one of them survives that ``bench/mutation.py`` does not list as equivalent:
a change to a pure module must come with the assertions that catch it broken. "The change" is what
differs from HEAD's first parent (on main, the lead's merge: everything it brought); the full run
over every module is ``python bench/mutation.py`` (README, *Mutation testing*), too slow for CI.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import mutation  # noqa: E402

pytestmark = pytest.mark.slow  # mutmut copies the project and runs the fast tests once per mutant


def test_no_mutant_of_a_pure_module_the_change_touched_survives():
    done = subprocess.run([sys.executable, "bench/mutation.py", "--changed"], cwd=ROOT, text=True,
                          capture_output=True, timeout=mutation.BUDGET_S + 180)
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-4000:]


def test_the_change_is_read_from_git_and_only_configured_modules_count():
    touched = mutation.changed_modules("HEAD")  # only what is not committed yet
    assert set(touched) <= set(mutation.configured_modules())
    assert mutation.dotted("src/distlab/nodes/plan.py") == "distlab.nodes.plan"
    from distlab.nodes import plan  # (names built from the module: tests/test_layers.py checks every dotted name)

    assert mutation.module_of(f"{plan.__name__}.x_count__mutmut_3") == plan.__name__
    assert mutation.function_of(f"{plan.__name__}.xǁRateǁbits__mutmut_2") == f"{plan.__name__}.Rate.bits"
    assert mutation.function_of(f"{plan.__name__}.x_count__mutmut_3") == f"{plan.__name__}.count"
