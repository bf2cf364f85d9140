"""The built book, read the way a reader reads it: served over HTTP and rendered by headless Chromium.

Every page of ``_toc.yml`` is loaded once (cached for the whole module) and checked for: HTTP 200, no
console errors, images that loaded and carry real alt text, executed outputs on pages with code, no
page-wide horizontal scrolling (desktop and phone width). Full-page screenshots of each page (light and
dark theme, and the top of it at phone width) are saved under the test's temp folder, whose path is
printed (``pytest -s``) so a person can look at them. Then: the intro links every chapter, the search
page finds ``all_reduce``, and each written chapter has learning goals near the top, a Summary,
Exercises, and captions on its figures.

Uses Debian's ``chromium`` (Playwright's own browser download is not reachable from CI).
Iterating on the book's look without re-executing every chapter: build once into a folder outside the
repository with ``tests/book_copy.py`` (copy_sources, execute_all, build_without_executing) and run
``DISTLAB_BOOK_HTML=<that>/_build/html pytest tests/test_browser.py -s``.
"""
from __future__ import annotations

import functools
import os
import re
import threading
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest
from book_copy import chapter_files, toc_files

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    # the CI machine is offline: without these, Chromium's own background requests stall or log errors
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 900}
PHONE = {"width": 420, "height": 900}
CHAPTERS = chapter_files()[1:]
PLACEHOLDER = "Placeholder"

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def html_dir(request) -> Path:
    """The built book: the session's executed build, or ``$DISTLAB_BOOK_HTML`` while iterating."""
    override = os.environ.get("DISTLAB_BOOK_HTML")
    if override:
        return Path(override)
    book = request.getfixturevalue("executed_book")
    # warnings (-W) are test_book.py's failure; the pages are still worth checking if they were written
    assert (book["html"] / "index.html").exists(), "the book did not build:\n" + book["build"].stderr[-3000:]
    return book["html"]


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # one line per request would drown the test output
        pass


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # the browser hanging up early (favicon) is not news
        pass


@pytest.fixture(scope="module")
def base_url(html_dir):
    """``http://127.0.0.1:<free port>/``: the folder served the way a static host serves it."""
    handler = functools.partial(_QuietHandler, directory=str(html_dir))
    server = _QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: the browser test needs Debian's chromium "
                    "(`apt-get install chromium`; .ci/run does this)", pytrace=False)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("screenshots")
    print(f"\nbrowser screenshots: {folder} (and wide-lines.txt: lines readers must scroll to see)")
    return folder


@pytest.fixture(scope="module")
def visit(browser, base_url, shots):
    """``visit(name)`` -> :class:`Visit`; each page is loaded once per module, then reused by every test."""
    cache: dict[str, Visit] = {}

    def _visit(name: str) -> Visit:
        if name not in cache:
            cache[name] = _load(browser, base_url, name, shots)
        return cache[name]

    return _visit


# ---------------------------------------------------------------------------------------------- one page
@dataclass
class Visit:
    name: str
    status: int | None
    console_errors: list[str]
    blocked: list[str]
    dom: dict
    screenshots: list[Path] = field(default_factory=list)

    @property
    def placeholder(self) -> bool:
        return PLACEHOLDER in self.dom["text"]


def _new_page(browser, blocked: list[str], errors: list[str]):
    """A page whose requests to anything but the local server are refused (and recorded): the test
    must not depend on the network, and the CI machine has none."""
    context = browser.new_context(viewport=VIEWPORT, color_scheme="light")

    def route(r):
        host = urlparse(r.request.url).hostname
        if host in ("127.0.0.1", "localhost") or r.request.url.startswith("data:"):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda m: m.type == "error" and errors.append(f"console: {m.text} @ {m.location.get('url')}"))
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    return context, page


def _load(browser, base_url: str, name: str, shots: Path) -> Visit:
    errors: list[str] = []
    blocked: list[str] = []
    context, page = _new_page(browser, blocked, errors)
    try:
        response = page.goto(f"{base_url}{name}.html", wait_until="load")
        page.evaluate(_SETTLE_IMAGES_JS)
        page.wait_for_load_state("networkidle")
        page.evaluate(_SETTLE_MATH_JS)
        dom = page.evaluate(_FACTS_JS)
        stem = name.replace("/", "_")
        paths = [shots / f"{stem}.png", shots / f"{stem}.dark.png"]
        page.screenshot(path=str(paths[0]), full_page=True)
        # the theme follows data-theme; switching it in place shows dark-mode contrast of the same render
        page.evaluate("document.documentElement.dataset.theme = 'dark'")
        page.screenshot(path=str(paths[1]), full_page=True)
        page.evaluate("document.documentElement.dataset.theme = 'light'")
        # the sidebars slide away with CSS transitions when the window narrows: skip the animation
        page.add_style_tag(content="*, *::before, *::after { transition: none !important; }")
        page.set_viewport_size(PHONE)
        # let the layout settle at the new width, and undo the scroll the full-page shots left behind
        page.evaluate("() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")
        page.evaluate("window.scrollTo(0, 0)")
        paths.append(shots / f"{stem}.phone.png")
        page.screenshot(path=str(paths[2]))
        dom["phoneWidths"] = page.evaluate(_WIDTHS_JS)
    finally:
        context.close()
    if dom["wideLines"]:
        with open(shots / "wide-lines.txt", "a") as notes:
            notes.write(f"{name}: {len(dom['wideLines'])} code/stdout blocks scroll sideways; widest lines:\n")
            notes.writelines(f"    {line.strip()[:110]}\n" for line in dom["wideLines"][:8])
    return Visit(name, response.status if response else None, _real_errors(errors, blocked), blocked, dom, paths)


# Console errors known to be harmless, each with the reason; everything else fails the test.
KNOWN_HARMLESS = [
    # Sphinx 7.4 registers an extension's inline script (sphinx-thebe's constants) twice; the second copy
    # re-declares the `const`s the first one already defined, so nothing is lost (thebe is not used here).
    r"^pageerror: Identifier 'THEBE_JS_URL' has already been declared",
    # sphinx-book-theme 1.3 leaves pydata-sphinx-theme 0.17's default_mode empty; the theme logs this once
    # for a browser with no stored preference and then follows the system setting, as intended.
    r"^console: Got invalid theme mode: \. Resetting to auto\.",
]


def _real_errors(errors: list[str], blocked: list[str]) -> list[str]:
    """Drop the known-harmless errors and those caused by this test refusing off-machine requests
    (e.g. MathJax or widget scripts from a CDN, which load for a reader who is online)."""
    refused = {f"net::ERR_FAILED @ {url}" for url in blocked}
    return [e for e in errors
            if not any(e.endswith(r) for r in refused) and not any(re.search(k, e) for k in KNOWN_HARMLESS)]


_SETTLE_IMAGES_JS = """
async () => {
  const imgs = Array.from(document.images);
  imgs.forEach(i => { i.loading = 'eager'; });
  await Promise.all(imgs.map(i => i.complete ? null : new Promise(ok => {
    i.addEventListener('load', ok); i.addEventListener('error', ok); setTimeout(ok, 5000);
  })));
}
"""

# MathJax typesets after the page's load: wait for it where it loaded (nothing to wait for where it did not)
_SETTLE_MATH_JS = """
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await Promise.race([MathJax.startup.promise, new Promise(ok => setTimeout(ok, 10000))]);
  }
}
"""

# [page width, window width]: a page wider than the window scrolls sideways as a whole
_WIDTHS_JS = "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"

# Facts about the rendered article (not the sidebar or header), gathered in one round trip.
_FACTS_JS = """
() => {
  const article = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
  const own = h => Array.from(h.childNodes)
      .filter(n => !(n.classList && n.classList.contains('headerlink')))
      .map(n => n.textContent).join('').trim();
  const cells = Array.from(article.querySelectorAll('div.cell'));
  const firstCell = cells[0] || null;
  const before = (el, other) => !other || !!(el.compareDocumentPosition(other) & Node.DOCUMENT_POSITION_FOLLOWING);
  const marks = Array.from(article.querySelectorAll('h1,h2,h3,h4,p.admonition-title,p > strong:first-child,dt'))
      .map(el => ({el, text: own(el)}));
  const goals = marks.filter(m => /learning goals|learning objectives|you will learn|goals/i.test(m.text));
  const headings = Array.from(article.querySelectorAll('h2,h3')).map(own);
  return {
    title: document.title,
    text: article.innerText,
    headings,
    goals: goals.map(m => ({text: m.text, beforeFirstCell: before(m.el, firstCell)})),
    codeCells: cells.length,
    outputs: article.querySelectorAll('.cell_output').length,
    outputTexts: Array.from(article.querySelectorAll('.cell_output .output')).map(o => o.innerText),
    // an error output in a cell not tagged raises-exception: the chapter stopped there when it was built
    strayTracebacks: Array.from(article.querySelectorAll('.cell_output .output.traceback'))
        .filter(o => !o.closest('.cell.tag_raises-exception')).map(o => o.innerText.trim().split('\\n').pop()),
    images: Array.from(document.images).map(i => ({
      src: i.getAttribute('src'), alt: i.getAttribute('alt'), complete: i.complete,
      naturalWidth: i.naturalWidth, inOutput: !!i.closest('.cell_output'),
      caption: (i.closest('figure') && i.closest('figure').querySelector('figcaption'))
               ? i.closest('figure').querySelector('figcaption').innerText.trim() : null,
    })),
    links: Array.from(article.querySelectorAll('a[href]')).map(a => a.href),
    // stdout lines and code lines wider than the column: not an error (they scroll), a note for the author
    wideLines: Array.from(article.querySelectorAll('.cell_input pre, .output.stream pre, .output.text_plain pre'))
        .filter(p => p.scrollWidth > p.clientWidth + 1)
        .map(p => p.innerText.split('\\n').reduce((a, b) => (b.length > a.length ? b : a), '')),
    // code cells (not outputs) whose code is wider than their box at this width: issue #50 holds them to
    // what the column shows (book/fit_code.py); each entry is the block's widest line
    // (code cells, and code blocks in the prose such as exercise solutions; not outputs)
    wideCode: Array.from(article.querySelectorAll('div.cell_input pre, div.highlight pre'))
        .filter(p => !p.closest('.cell_output') && p.scrollWidth > p.clientWidth + 1)
        .map(p => p.innerText.split('\\n').reduce((a, b) => (b.length > a.length ? b : a), '')),
    // Sphinx's math blocks and inline math that MathJax did not typeset: raw LaTeX, e.g. \\[T(S) = \\frac...\\]
    rawMath: Array.from(article.querySelectorAll('.math'))
        .filter(m => !m.querySelector('mjx-container')).map(m => m.textContent.trim().slice(0, 80)),
    mathBlocks: article.querySelectorAll('.math').length,
    widths: (""" + _WIDTHS_JS + """)(),
  };
}
"""


# ---------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", toc_files())
def test_page_renders_cleanly(visit, name):
    v = visit(name)
    assert v.status == 200, f"{name}.html answered HTTP {v.status}"
    assert not v.console_errors, f"{name}: console errors:\n" + "\n".join(v.console_errors)
    for img in v.dom["images"]:
        assert img["complete"] and img["naturalWidth"] > 0, f"{name}: image did not load: {img['src']}"
        alt = (img["alt"] or "").strip()
        assert alt, f"{name}: image without alt text: {img['src']}"
        # docutils falls back to the file's path when a figure has no alt: that is not alt text
        assert not re.search(r"\.(png|jpe?g|svg|gif)$", alt, re.I), (
            f"{name}: alt text is a file name: {alt} (give the plotting cell mystnb.image.alt metadata)")
    assert not v.dom["rawMath"], (
        f"{name}: {len(v.dom['rawMath'])} formulas show as raw LaTeX (MathJax did not load from the book's own "
        f"_static, or failed): {v.dom['rawMath'][0]!r}; requests refused: {v.blocked[:3]}")
    if v.dom["codeCells"]:
        assert v.dom["outputs"], f"{name}: {v.dom['codeCells']} code cells but no executed output on the page"
    assert not v.dom["strayTracebacks"], (
        f"{name}: a cell not tagged raises-exception shows an error, and no later cell ran when the book was "
        f"built: {v.dom['strayTracebacks'][0][:200]}")
    reprs = [t for t in v.dom["outputTexts"] if re.search(r"<Figure size \d+x\d+ with \d+ Axes>", t)]
    assert not reprs, (f"{name}: a plot shows as text {reprs[0][:80]!r}, not as an image "
                       "(no inline backend: add `%matplotlib inline`, or display(fig))")
    for where, (page_w, window_w) in (("desktop", v.dom["widths"]), ("phone", v.dom["phoneWidths"])):
        assert page_w <= window_w + 1, (f"{name}: on a {where} the page scrolls sideways ({page_w}px > "
                                        f"{window_w}px): something wide escapes its scroll box")
    assert all(p.stat().st_size > 0 for p in v.screenshots)


@pytest.mark.parametrize("name", toc_files())
def test_code_cells_do_not_scroll_sideways_on_a_desktop(visit, name):
    """At 1280 px every code cell and code block shows its whole width (on a phone code scrolls inside its
    box: wrapped Python would read as other code)."""
    wide = visit(name).dom["wideCode"]
    assert not wide, (f"{name}: {len(wide)} code cells scroll sideways at {VIEWPORT['width']} px; widest lines:\n"
                      + "\n".join(f"  {line.strip()[:100]}" for line in wide[:8])
                      + f"\nrun: .venv/bin/python book/fit_code.py {name}.ipynb (a .md page: by hand)")


def test_the_formulas_are_typeset_without_the_network(visit):
    """The bandwidth law of chapter 14 is typeset by the MathJax the book ships (sphinx-mathjax-offline): no
    request leaves the machine for it, so it renders offline and on a firewalled course network."""
    v = visit("book/14_network")
    assert v.dom["mathBlocks"] >= 2 and not v.dom["rawMath"], v.dom["rawMath"]
    assert not [url for url in v.blocked if "mathjax" in url.lower()], v.blocked


def test_intro_links_every_chapter(visit):
    links = {urlparse(u).path.split("#")[0] for u in visit(toc_files()[0]).dom["links"]}
    missing = [c for c in CHAPTERS if f"/{c}.html" not in links]
    assert not missing, f"the intro's text does not link: {missing}"


def test_search_finds_all_reduce(browser, base_url, html_dir):
    errors: list[str] = []
    blocked: list[str] = []
    context, page = _new_page(browser, blocked, errors)
    try:
        page.goto(f"{base_url}search.html?q=all_reduce", wait_until="load")
        mentioning = [c for c in CHAPTERS if "all_reduce" in _page_text(html_dir, c)]
        assert mentioning, "no chapter page mentions all_reduce: the book lost its collectives"
        # searchtools.js loads searchindex.js, then fills the list: wait for it rather than sleep
        page.wait_for_selector("#search-results ul.search li", timeout=20_000)
        hits = page.locator("#search-results ul.search li a").evaluate_all("as => as.map(a => a.href)")
    finally:
        context.close()
    real = _real_errors(errors, blocked)
    assert not real, "search page console errors:\n" + "\n".join(real)
    assert any(f"/{c}.html" in h for c in mentioning for h in hits), (
        f"search for all_reduce lists {hits}, none of the chapters that mention it: {mentioning}")


@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_has_goals_summary_exercises(visit, name):
    v = visit(name)
    assert not v.placeholder, f"{name} is still a placeholder page"
    goals = v.dom["goals"]
    assert goals, f"{name}: no 'Learning goals' section (headings: {v.dom['headings']})"
    assert goals[0]["beforeFirstCell"], f"{name}: learning goals must come before the first code cell"
    heads = [h.lower() for h in v.dom["headings"]]
    assert any(h.startswith("summary") for h in heads), f"{name}: no Summary heading in {v.dom['headings']}"
    assert any(h.startswith("exercise") for h in heads), f"{name}: no Exercises heading in {v.dom['headings']}"


@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_figures_have_captions(visit, name):
    v = visit(name)
    assert not v.placeholder, f"{name} is still a placeholder page"
    bare = [i["src"] for i in v.dom["images"] if i["inOutput"] and not i["caption"]]
    assert not bare, f"{name}: output figures without a caption (mystnb.figure.caption metadata): {bare}"


def _page_text(html_dir: Path, name: str) -> str:
    path = html_dir / f"{name}.html"
    return path.read_text() if path.exists() else ""


# ---------------------------------------------------------------------------------------------- the Chinese edition
@pytest.fixture(scope="module")
def editions_url(html_dir):
    """Both editions served side by side as they are built: ``<out>/html`` and ``<out>/zh/html``."""
    assert (html_dir.parent / "zh" / "html" / "index.html").exists(), "the Chinese edition was not built"
    handler = functools.partial(_QuietHandler, directory=str(html_dir.parent))
    server = _QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("name", [toc_files()[0], "book/05_collectives", chapter_files()[-1]])
def test_language_link_leads_to_the_same_page_in_chinese_and_back(browser, editions_url, shots, name):
    """Text, not glyphs: the test machine may lack a CJK font, so the check reads the DOM."""
    errors: list[str] = []
    blocked: list[str] = []
    context, page = _new_page(browser, blocked, errors)
    try:
        page.goto(f"{editions_url}html/{name}.html", wait_until="load")
        page.locator("a.distlab-language-switch").click()
        page.wait_for_load_state("load")
        assert page.url.endswith(f"/zh/html/{name}.html"), page.url
        assert page.evaluate("document.documentElement.lang") == "zh-CN"
        title = page.locator("h1").first.inner_text()
        assert re.search(r"[\u4e00-\u9fff]", title), f"{name}: Chinese page title {title!r}"
        assert page.locator("div.cell_output").count() > 0, f"{name}: the Chinese page shows no executed output"
        page.screenshot(path=str(shots / f"zh-{name.replace('/', '_')}.png"), full_page=False)
        page.locator("a.distlab-language-switch").click()
        page.wait_for_load_state("load")
        assert page.url.endswith(f"/html/{name}.html") and "/zh/" not in page.url, page.url
    finally:
        context.close()
    real = _real_errors(errors, blocked)
    assert not real, "console errors on the Chinese page:\n" + "\n".join(real)
