import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from second_user import other_user, readable_src, shared_tmp  # noqa: E402,F401  (fixtures for the shared-machine tests)

_BOOK: dict = {}


@pytest.fixture(scope="session")
def executed_book(tmp_path_factory):
    """The whole book, executed once (nbclient) and built twice from that execution (jupyter-book,
    execution off): the English edition and the Chinese one."""
    import book_copy

    dest = tmp_path_factory.mktemp("book")
    book_copy.copy_sources(dest)
    executions = book_copy.execute_all(dest)
    build = book_copy.build_without_executing(dest)
    build_zh = book_copy.build_chinese(dest)
    _BOOK.update(dir=dest, executions=executions, build=build, html=dest / "_build" / "html",
                 build_zh=build_zh, html_zh=dest / "_build" / "zh" / "html")
    return _BOOK


def pytest_terminal_summary(terminalreporter):
    """Report every chapter's execution time (the budget is 90 s each on 2 cores), and the platform stack's."""
    stack = sys.modules.get("platform_stack")
    if stack is not None and stack.RESULTS:
        terminalreporter.section("platform stack: each chapter alone on the platforms' software")
        for line in stack.summary(stack.RESULTS):
            terminalreporter.write_line(line)
    if not _BOOK:
        return
    terminalreporter.section("chapter execution times")
    for name, ex in _BOOK["executions"].items():
        status = "ok" if ex.error is None else "FAILED"
        terminalreporter.write_line(f"{ex.seconds:6.1f} s  {name}  {status}")
    total = sum(ex.seconds for ex in _BOOK["executions"].values())
    terminalreporter.write_line(f"{total:6.1f} s  all chapters")


@pytest.fixture
def run_as_rank0(tmp_path, monkeypatch):
    """``run(fn, args)`` -> (what rank 0's fn returned, the script text), through ``distlab.spawn``.

    Nothing is launched: the engine is replaced by running the generated script in this process
    the way ``RANK=0 python script.py`` would, so a test sees what a worker would see.
    """
    import runpy

    import distlab
    import distlab.worker
    from distlab.launch import engine

    monkeypatch.setenv("DISTLAB_RUNS", str(tmp_path / "runs"))
    returned = {}
    monkeypatch.setattr(distlab.worker, "_save_return", lambda rank, value: returned.setdefault(rank, value))

    def execute(plan, view, **kwargs):
        monkeypatch.setenv("RANK", "0")
        runpy.run_path(str(plan.script), run_name="__main__")
        monkeypatch.delenv("RANK")
        return plan.script

    monkeypatch.setattr(engine, "execute", execute)

    def run(fn, args=()):
        returned.clear()
        script = distlab.spawn(fn, args=args, nprocs=1, view=None)
        return returned[0], script.read_text()

    return run


@pytest.fixture(params=["forkserver", "spawn"])
def start_mode(request, monkeypatch):
    """Run a launcher test once per start mode: ranks forked from distlab's forkserver, and fresh
    interpreters (``DISTLAB_START`` is what ``start="auto"`` follows)."""
    monkeypatch.setenv("DISTLAB_START", request.param)
    return request.param


@pytest.fixture(scope="module")
def module_runs_root(tmp_path_factory):
    """A private runs root (DISTLAB_RUNS) for a module's long-lived cluster, put back afterwards."""
    root = tmp_path_factory.mktemp("runs")
    os.chmod(root, 0o700)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DISTLAB_RUNS", str(root))
        yield root


def _mutation_durations() -> dict:
    """Each selected test's time, as mutmut measured it: only in a mutation run (bench/mutation.py), whose
    tests run in mutants/ next to mutmut-stats.json. Read once, when the forkserver that forks every
    mutant's run imports this file."""
    import json

    try:
        return json.loads(Path("mutmut-stats.json").read_text())["duration_by_test"]
    except (OSError, ValueError, KeyError):
        return {}


_MUTATION_DURATIONS = _mutation_durations()


def pytest_collection_modifyitems(items):
    """A mutant's tests run fastest first, as mutmut's plain runner orders them (its forkserver does not):
    most mutants fail their quickest test, and ``-x`` stops there."""
    if _MUTATION_DURATIONS and os.environ.get("MUTANT_UNDER_TEST", "").startswith("distlab."):
        items.sort(key=lambda item: _MUTATION_DURATIONS.get(item.nodeid, 0.0))
