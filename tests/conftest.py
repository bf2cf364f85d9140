import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

_BOOK: dict = {}


@pytest.fixture(scope="session")
def executed_book(tmp_path_factory):
    """The whole book, executed once (nbclient) and built once (jupyter-book, execution off)."""
    import book_copy

    dest = tmp_path_factory.mktemp("book")
    book_copy.copy_sources(dest)
    executions = book_copy.execute_all(dest)
    build = book_copy.build_without_executing(dest)
    _BOOK.update(dir=dest, executions=executions, build=build, html=dest / "_build" / "html")
    return _BOOK


def pytest_terminal_summary(terminalreporter):
    """Report every chapter's execution time (the budget is 90 s each on 2 cores)."""
    if not _BOOK:
        return
    terminalreporter.section("chapter execution times")
    for name, ex in _BOOK["executions"].items():
        status = "ok" if ex.error is None else "FAILED"
        terminalreporter.write_line(f"{ex.seconds:6.1f} s  {name}  {status}")
    total = sum(ex.seconds for ex in _BOOK["executions"].values())
    terminalreporter.write_line(f"{total:6.1f} s  all chapters")


@pytest.fixture(params=["forkserver", "spawn"])
def start_mode(request, monkeypatch):
    """Run a launcher test once per start mode: ranks forked from distlab's forkserver, and fresh
    interpreters (``DISTLAB_START`` is what ``start="auto"`` follows)."""
    monkeypatch.setenv("DISTLAB_START", request.param)
    return request.param
