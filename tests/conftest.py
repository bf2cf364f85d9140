import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def executed_book(tmp_path_factory):
    """The whole book, executed once (nbclient) and built once (jupyter-book, execution off)."""
    import book_copy

    dest = tmp_path_factory.mktemp("book")
    book_copy.copy_sources(dest)
    executions = book_copy.execute_all(dest)
    build = book_copy.build_without_executing(dest)
    return {"dir": dest, "executions": executions, "build": build, "html": dest / "_build" / "html"}
