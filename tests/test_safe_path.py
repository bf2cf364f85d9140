"""Every Python distlab starts leaves the working folder off the front of ``sys.path`` (issue 45, item 3).

A notebook's working folder may be a shared project folder: a ``json.py`` planted there by another
user must not be imported by an agent, a standby, a rank or any other interpreter distlab starts
(on nodes those run as root). One helper builds each such command line
(:func:`distlab.forkserver.mode.python_argv`).
"""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distlab.forkserver import mode as launchmode

TESTS = Path(__file__).parent
SRC = TESTS.parent / "src" / "distlab"

PLANTED = ("import os, sys\n"
           "open({mark!r}, 'a').write(f'{{os.getpid()}} {{sys.argv!r}}\\n')\n"
           "raise ImportError('planted in the working folder')\n")
KERNEL = f"""
import os, sys
sys.path.insert(0, {str(TESTS)!r})
import torch
import distlab
from fake_kernel import run_cells
os.chdir(sys.argv[1])  # a shared project folder with a planted json.py and torch.py
ns = run_cells("def one(rank):\\n    import nearby\\n    return rank + nearby.ONE\\n")  # next to the notebook
print("FRESH", distlab.spawn(ns["one"], nprocs=2, view=None, start="spawn").returns, flush=True)
if sys.argv[2] == "nodes":
    with distlab.Nodes(2) as nodes:
        for attempt in ("agents", "standbys"):  # the second launch takes the standbys the first left
            res = distlab.spawn(ns["one"], nprocs=1, nodes=nodes, view=None, timeout=180)
            print(attempt.upper(), res.returns, flush=True)
"""


def test_module_commands_put_no_working_folder_on_sys_path():
    assert launchmode.python_argv("pkg.mod", "a", python="py", version=(3, 11)) == \
        ["py", "-P", "-u", "-m", "pkg.mod", "a"]
    old = launchmode.python_argv("pkg.mod", "a", python="py", version=(3, 10, 9))
    assert old[:3] == ["py", "-u", "-c"] and old[4:] == ["a"]
    assert old[3].startswith(launchmode.SAFE_PATH_CODE) and "run_module('pkg.mod'" in old[3]
    code = launchmode.python_argv(code="print(1)", python="py", flags=(), version=(3, 12))
    assert code == ["py", "-P", "-c", launchmode.SAFE_PATH_CODE + "print(1)"]


def test_the_python_3_10_form_runs_the_module_without_the_working_folder(tmp_path):
    (tmp_path / "json.py").write_text("raise ImportError('planted')\n")
    argv = launchmode.python_argv("json.tool", "--help", version=(3, 10))  # the -c form, on this Python
    done = subprocess.run([sys.executable if a == argv[0] else a for a in argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr


def test_no_python_is_started_without_the_helper():
    """Each ``sys.executable`` in a command list in src/ goes through ``python_argv`` (or is the helper)."""
    found = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.List) and any(isinstance(e, ast.Attribute) and e.attr == "executable"
                                                  for e in node.elts) and len(node.elts) > 1:
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    allowed = {"slurm/jobuser.py",  # `python -c pass` in "/": can the job user run this interpreter?
               "teach/perf.py",  # `python bench/x.py`: a file puts its own folder first, not the working one
               "teach/launch_latency.py"}  # its bare workers run a script file too, as `python file.py` does
    assert [f for f in found if f.split(":")[0] not in allowed] == []


@pytest.mark.slow
def test_no_agent_standby_or_rank_imports_from_the_working_folder(tmp_path):
    """Before: ``python -u -m distlab.launch.rank`` (fresh ranks), ``-m distlab.launch.agent`` (agents on
    nodes) and the standbys put the working folder first on ``sys.path`` and imported the planted module."""
    from distlab.errors import NodesError
    from distlab.nodes import namespaces

    try:
        namespaces.check_possible()
        where = "nodes"
    except NodesError:  # no namespaces here (a container): the fresh ranks still count
        where = "here"
    trap, mark = tmp_path / "trap", tmp_path / "planted-code-ran"
    trap.mkdir()
    for name in ("json", "torch"):
        (trap / f"{name}.py").write_text(PLANTED.format(mark=str(mark)))
    (trap / "nearby.py").write_text("ONE = 1\n")  # the learner's own module still imports, after the stdlib
    env = {k: v for k, v in os.environ.items() if k not in ("DISTLAB_START", "PYTHONSAFEPATH")}
    env["DISTLAB_RUNS"] = str(tmp_path / "runs")
    done = subprocess.run([sys.executable, "-c", KERNEL, str(trap), where], env=env, capture_output=True,
                          text=True, timeout=400)
    assert not mark.exists(), f"a planted module ran in:\n{mark.read_text()}\n{done.stdout}{done.stderr}"
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FRESH {0: 1, 1: 2}" in done.stdout
    if where == "nodes":
        assert "AGENTS {0: 1, 1: 2}" in done.stdout and "STANDBYS {0: 1, 1: 2}" in done.stdout
