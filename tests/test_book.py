"""The book builds warning-free (-W) from the executed chapters, and every page shows outputs."""
import pytest
from book_copy import toc_files


@pytest.mark.slow
def test_book_builds_without_warnings(executed_book):
    build = executed_book["build"]
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    assert (executed_book["html"] / "index.html").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", toc_files())
def test_chapter_page_has_executed_outputs(executed_book, name):
    page = executed_book["html"] / f"{name}.html"
    assert page.exists(), f"missing page {page}"
    html = page.read_text()
    assert 'class="cell_output' in html, f"{name}.html shows no executed output"
