"""The book builds warning-free (-W) from the executed chapters, and every page shows outputs."""
import re

import pytest
from book_copy import chapter_files


@pytest.mark.slow
def test_book_builds_without_warnings(executed_book):
    build = executed_book["build"]
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    assert (executed_book["html"] / "index.html").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", chapter_files())
def test_chapter_page_has_executed_outputs(executed_book, name):
    page = executed_book["html"] / f"{name}.html"
    assert page.exists(), f"missing page {page}"
    html = page.read_text()
    assert 'class="cell_output' in html, f"{name}.html shows no executed output"


# chapters with a knob lab (distlab.teach.knobs): controls in JupyterLab, a static picture here
LAB_PAGES = ["book/05_collectives", "book/06_distributed_sampler", "book/10_performance_lab",
             "book/14_network"]
# Sphinx loads MathJax from its CDN on pages with math: older than the labs, and not theirs
NOT_THE_LABS = ("mathjax",)


@pytest.mark.slow
@pytest.mark.parametrize("name", LAB_PAGES)
def test_a_lab_page_shows_its_default_picture_and_needs_no_widget_script(executed_book, name):
    import re

    html = (executed_book["html"] / f"{name}.html").read_text()
    assert "in JupyterLab, controls change these" in html  # the lab ran with its defaults
    remote = re.findall(r'<script[^>]*\ssrc="((?:https?:)?//[^"]+)"', html)
    assert [url for url in remote if not any(k in url for k in NOT_THE_LABS)] == []
    for widget_trace in ("widget-state+json", "widget-view+json", "html-manager", "require.min.js"):
        assert widget_trace not in html, widget_trace


#: what the reference must document besides ``distlab.__all__`` (issue #50): Ranks' verbs and Slurm's entry points
REFERENCE_EXTRA = [*(f"Ranks.{verb}" for verb in ("run", "exec", "push", "scatter", "pull", "gather", "restart",
                                                  "close")),
                   "slurm.local_cluster", "slurm.submit", "slurm.attach", "slurm.SlurmError"]


def documented_names(html: str) -> set[str]:
    """The names under ``distlab`` that autodoc wrote a description for (each is the id of its signature)."""
    return set(re.findall(r'<dt class="sig sig-object py" id="distlab\.([\w.]+)"', html))


@pytest.mark.slow
def test_reference_documents_every_public_name(executed_book):
    import distlab

    html = (executed_book["html"] / "book" / "reference.html").read_text()
    missing = [n for n in [*distlab.__all__, *REFERENCE_EXTRA] if n not in documented_names(html)]
    assert not missing, f"the distlab reference (book/reference.md) does not document: {missing}"


def test_documented_names_reads_autodoc_ids():
    html = ('<dt class="sig sig-object py" id="distlab.spawn">'
            '<dt class="sig sig-object py" id="distlab.Ranks.run">')
    assert documented_names(html) == {"spawn", "Ranks.run"}
