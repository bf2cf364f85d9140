"""distlab's live view in a real JupyterLab, driven the way a learner drives it.

Starts ``jupyter lab`` on 127.0.0.1 with a token in a temporary root folder (its own settings, no
workspace to restore), opens it in Debian's chromium through Playwright and checks, with
screenshots of every step under the test's temp folder (the path is printed; ``pytest -s``):

* rank lines stream into the launching cell while it is still running;
* no ``Error displaying widget`` anywhere, before or after a save;
* after save, close and reopen with a new kernel, each rank's output is still readable (the saved
  file holds a static record, not a widget reference);
* a failing run shows the rank that failed first, with its traceback, before any other rank, and
  none of torch's own log lines ("Terminating process N via signal SIGTERM");
* Kernel > Interrupt leads with distlab's one line, shows no torchelastic log line, leaves no
  worker process behind, and the next launch works;
* a notebook saved while a run is live holds no widget and what each rank had printed by then
  (within a second), reopens with a new kernel without a widget error, and once the run is over
  and saved again holds only the record;
* a rank's own progress bar (``\\r`` on stderr) is one line per rank that moves, never a stderr box;
* a chapter opens unmodified (JupyterLab rewrites metadata a chapter lacks, and marks it modified);
* a knob (distlab.teach.knobs) moved re-runs its measurement on live ranks and redraws in place, and
  moves during a run supersede it: never two runs at once, the middle value never runs.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from ports import reserved_port
from test_browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.slow
SRC = Path(__file__).resolve().parents[1] / "src"
STEPS = 30  # lines each rank prints in the live notebook, one every 0.1 s
# Upper bounds only (the test goes on as soon as a condition holds): a 2-rank launch takes ~3 s on an idle
# 2-core machine, but ten times that when other jobs share the cores.
WAIT_S = 150


def hold_until(release: Path) -> str:
    """Lines of a rank function that wait until the test creates ``release`` (at most WAIT_S): the run
    is certainly still going while the test looks at it, however slow or fast the machine."""
    return (f"    deadline = time.time() + {WAIT_S}\n"
            f"    while not os.path.exists({str(release)!r}) and time.time() < deadline:  # the test ends the run\n"
            "        time.sleep(0.05)\n")


def live_cells(release: Path) -> list[str]:
    """Each rank prints STEPS lines (rank 0 reports progress), then holds until ``release`` exists."""
    return [
        "import os\nimport time\n\nimport distlab",
        "def work(rank):\n"
        f"    for i in range({STEPS}):\n"
        "        print(f'rank {rank} step {i}', flush=True)\n"
        "        if rank == 0:\n"
        f"            distlab.report(step=i + 1, total={STEPS})\n"
        "        time.sleep(0.1)\n"
        + hold_until(release) +
        "    return rank * 10",
        "res = distlab.spawn(work, nprocs=2)",
        "assert res.returns == {0: 0, 1: 10}\nprint('returns checked')",
    ]


FAIL_CELLS = [
    "import time\n\nimport distlab",
    "def boom(rank):\n"
    "    print(f'rank {rank} is up', flush=True)\n"
    "    if rank == 1:\n"
    "        raise ValueError('boom on rank 1')\n"
    "    time.sleep(30)",
    "distlab.spawn(boom, nprocs=2)",
    "def sleeper(rank):\n"
    "    print(f'rank {rank} sleeping', flush=True)\n"
    "    time.sleep(60)\n\n"
    "distlab.spawn(sleeper, nprocs=2)",
    "def quick(rank):\n    return rank + 100\n\nprint('relaunched:', distlab.spawn(quick, nprocs=2).returns)",
]

SAVE_STEP_S = 0.2  # a run still going when the notebook is saved: one line every 0.2 s ...
SAVE_STEPS = 40  # ... for 8 s; the test saves after about 3 s
SAVE_LAG_S = 1.0  # a notebook saved mid-run may miss at most this much of what the ranks printed

SAVE_CELLS = [
    "import time\n\nimport distlab",
    "def slow(rank):\n"
    f"    for i in range({SAVE_STEPS}):\n"
    "        print(f'rank {rank} slow step {i}', flush=True)\n"
    f"        time.sleep({SAVE_STEP_S})",
    "res = distlab.spawn(slow, nprocs=2)",
]

PENDING_CELLS = [
    "import time\n\nimport distlab",
    "def chatty(rank):\n"
    "    for i in range(15):\n"
    "        print(f'rank {rank} chatty step {i}', flush=True)\n"
    "        time.sleep(0.2)\n"
    "    return rank",
    "pending = distlab.spawn(chatty, nprocs=2, join=False)",
    "time.sleep(0.5)\nprint('another cell ran')",  # the kernel answers other requests while the run goes on
    "print('joined:', pending.join().returns)",
]

RANKS_CELLS = [
    "%load_ext distlab\nimport distlab\nranks = distlab.Ranks(2)",
    "%%ranks --timeout 100\nif rank == 0:\n    dist.all_reduce(torch.ones(1))  # rank 1 never calls it",
    "%%ranks 0 --timeout 1\ndist.all_reduce(torch.ones(1))  # rank 1 is not in this cell",
    "%%ranks\nworld_size",
]

# JupyterLab settings for a quiet, deterministic page: every cell stays in the DOM (no windowing),
# no news or update checks (the machine is offline).
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                          "checkForUpdates": False},
}


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("jupyterlab-screenshots")
    print(f"\njupyterlab screenshots: {folder}")
    return folder


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server: ``{"url", "token", "root", "proc"}``."""
    reserved = reserved_port()
    base = tmp_path_factory.mktemp("lab")
    root, home = base / "root", base / "home"
    root.mkdir()
    settings = home / "settings"
    for name, value in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(value))
    token, port = secrets.token_hex(16), reserved.__enter__()  # held until the server stops (tests/ports.py)
    (home / "config").mkdir()
    (home / "config" / "jupyter_server_config.json").write_text(json.dumps(_server_config(token, port, root)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]).rstrip(":"),
           "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(settings), "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
           "IPYTHONDIR": str(home / "ipython"), "DISTLAB_RUNS": str(base / "runs")}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser"] + (["--allow-root"] if os.geteuid() == 0 else [])
    log = open(base / "server.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_server(url, token, proc, base / "server.log")
        yield {"url": url, "token": token, "root": root, "proc": proc, "runs": base / "runs"}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        reserved.__exit__(None, None, None)


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install chromium` (.ci/run does this)", pytrace=False)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


def _server_config(token: str, port: int, root: Path) -> dict:
    """Loopback only, a token, and nothing that reaches for the network or slows the start."""
    return {
        "ServerApp": {"ip": "127.0.0.1", "port": port, "port_retries": 0, "open_browser": False,
                      "root_dir": str(root),
                      "jpserver_extensions": {"jupyter_lsp": False, "jupyter_server_terminals": False}},
        "IdentityProvider": {"token": token},
        "LabApp": {"news_url": None, "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
                   "extension_manager": "readonly"},
    }


def _wait_for_server(url: str, token: str, proc, log: Path, limit_s: float = WAIT_S) -> None:
    import urllib.request

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError("jupyter lab exited:\n" + log.read_text()[-3000:])
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"jupyter lab did not answer within {limit_s}s:\n" + log.read_text()[-3000:])


# ---------------------------------------------------------------------------------------------- a notebook in the page
def write_notebook(path: Path, cells: list[str]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nbformat.write(nb, path)


class Notebook:
    """One notebook open in its own JupyterLab page (a fresh browser context: no widget state)."""

    def __init__(self, browser, lab, name: str, shots: Path):
        self.shots, self.name = shots, name
        self.errors: list[str] = []
        self.context = browser.new_context(viewport={"width": 1280, "height": 1000})
        self.page = self.context.new_page()
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(f"{lab['url']}/lab/tree/{name}?reset&token={lab['token']}", wait_until="load")
        self.page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=WAIT_S * 1000)
        # menus act on the kernel only once it is connected: the status bar then says it is idle
        self.page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\| Idle$")).wait_for(timeout=WAIT_S * 1000)

    def cell(self, i: int):
        return self.page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell").nth(i)

    def prompt(self, i: int) -> str:
        return self.cell(i).locator(".jp-InputPrompt").inner_text().strip()

    def outputs(self, i: int) -> str:
        return self.cell(i).locator(".jp-OutputArea").inner_text()

    def menu(self, top: str, item: str) -> None:
        self.page.locator(".lm-MenuBar-item", has_text=re.compile(f"^{top}$")).click()
        self.page.locator(".lm-Menu-item:visible", has_text=re.compile(f"^{item}")).first.click()

    def wait(self, predicate, what: str, timeout_s: float = WAIT_S, poll_s: float = 0.1):
        """Poll ``predicate()`` until it returns something true; fail with ``what`` and a screenshot."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(poll_s)
        self.shot(f"timeout-{re.sub('[^a-z0-9]+', '-', what.lower())[:40]}")
        raise AssertionError(f"{self.name}: waited {timeout_s}s for {what}")

    def finished(self, i: int) -> bool:
        return re.fullmatch(r"\[\d+\]:", self.prompt(i)) is not None

    def run_cell(self, i: int) -> None:
        self.cell(i).locator(".jp-InputArea-editor").click()
        self.page.keyboard.press("Escape")
        self.page.keyboard.press("Control+Enter")

    def shot(self, label: str) -> Path:
        path = self.shots / f"{Path(self.name).stem}-{label}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def text(self) -> str:
        return self.page.locator(".jp-NotebookPanel:visible").inner_text()

    def close(self) -> None:
        self.context.close()


def workers_under(proc) -> list[psutil.Process]:
    """Every distlab/torchelastic worker below the JupyterLab server (its kernels' children)."""
    found = []
    for p in psutil.Process(proc.pid).children(recursive=True):
        try:
            if "TORCHELASTIC_RUN_ID" in p.environ() and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


# ---------------------------------------------------------------------------------------------- tests
def test_live_lines_then_a_record_that_survives_save_and_reopen(lab, browser, shots):
    """The ranks print their lines, then hold until the test releases them: every look at the live
    view happens while the cell certainly runs. Lines that reached the page only once the cell had
    finished would never show before the release, and the first wait would fail."""
    release = lab["root"] / "live.release"
    write_notebook(lab["root"] / "live.ipynb", live_cells(release))
    nb = Notebook(browser, lab, "live.ipynb", shots)
    try:
        nb.menu("Run", "Run All Cells")
        nb.wait(lambda: "rank 0 step 3" in nb.outputs(2), "rank 0's lines in the launching cell, while it runs")
        running = nb.prompt(2)
        nb.shot("1-running")
        assert running == "[*]:", f"the cell ended before its ranks were released (prompt {running})"
        bars = nb.cell(2).locator("progress")
        nb.wait(lambda: bars.count(), "rank 0's progress bar")
        assert bars.count() == 1  # only the rank that reports progress
        assert nb.cell(2).locator(".distlab-rank[data-rank='0'] progress").count() == 1
        nb.wait(lambda: f"rank 0 step {STEPS - 1}" in nb.outputs(2), "every line, more than the view shows")
        nb.shot("1b-following-the-tail")
        tail = nb.cell(2).locator(".distlab-rank[data-rank='0'] pre").inner_text().strip().splitlines()
        assert nb.prompt(2) == "[*]:" and tail[0].startswith("… ") and "earlier lines not shown" in tail[0], tail
        assert tail[-1] == f"rank 0 step {STEPS - 1}", f"the live view does not end with the latest line: {tail}"
        release.touch()
        nb.wait(lambda: "returns checked" in nb.outputs(3), "the run to finish and its returns checked")
        nb.shot("2-done")
        launch = nb.outputs(2)
        assert f"rank 0 step {STEPS - 1}" in launch and f"rank 1 step {STEPS - 1}" in launch, launch
        assert "2 ranks done in" in launch
        nb.page.keyboard.press("Control+s")
        nb.wait(lambda: _saved_outputs(lab["root"] / "live.ipynb"), "the notebook to be saved with outputs")
        nb.menu("Kernel", "Shut Down Kernel")
        assert "Error displaying widget" not in nb.text() and not nb.errors, nb.errors
    finally:
        nb.close()
    saved = _saved_outputs(lab["root"] / "live.ipynb")
    assert "application/vnd.jupyter.widget-view+json" not in saved and "<details" in saved, saved[:2000]

    again = Notebook(browser, lab, "live.ipynb", shots)  # a new page and a new kernel: no widget model exists
    try:
        again.wait(lambda: f"rank 1 step {STEPS - 1}" in again.outputs(2), "rank 1's output after reopening")
        again.shot("3-reopened")
        assert "Error displaying widget" not in again.text()
        assert again.cell(2).locator("details[data-rank]").count() == 2
    finally:
        again.close()


def test_a_failure_shows_the_failed_rank_first_and_interrupt_leaves_no_worker(lab, browser, shots):
    write_notebook(lab["root"] / "fail.ipynb", FAIL_CELLS)  # untagged: Run All stops at the failing cell
    nb = Notebook(browser, lab, "fail.ipynb", shots)
    try:
        nb.menu("Run", "Run All Cells")
        nb.wait(lambda: nb.finished(2) and "failed first" in nb.outputs(2), "the failing run's record")
        nb.shot("1-failed")
        first = nb.cell(2).locator("details").first
        assert first.get_attribute("data-rank") == "1" and first.get_attribute("open") is not None
        assert "ValueError: boom on rank 1" in first.inner_text()
        assert "(from the notebook: Cell In[2], line 4, in boom)" in first.inner_text()  # where the learner looks
        error = nb.cell(2).locator("[data-mime-type='application/vnd.jupyter.stderr']").last.inner_text()
        assert error.startswith("WorkerFailedError: distlab: rank 1 failed first (exit code 1)"), error[:300]
        out = nb.outputs(2)
        assert out.lstrip().startswith("distlab: rank 1 failed first"), out[:300]
        assert out.index("rank 1 · ✗ failed first") < out.index("rank 0 · stopped by distlab"), out[:600]
        assert "Terminating process" not in nb.cell(2).inner_text()  # torch's own log line stays out of the cell

        nb.run_cell(3)
        nb.wait(lambda: "rank 0 sleeping" in nb.outputs(3) and _printed(lab, "sleeper", 1, "rank 1 sleeping"),
                "both sleepers running")
        nb.shot("2-sleeping")
        nb.menu("Kernel", "Interrupt Kernel")
        nb.wait(lambda: nb.finished(3), "the interrupted cell to end")
        nb.shot("3-interrupted")
        out = nb.outputs(3)
        error = nb.cell(3).locator("[data-mime-type='application/vnd.jupyter.stderr']").last.inner_text()
        assert error.startswith("distlab: interrupted; all 2 worker processes were stopped."), error
        assert out.count("worker processes were stopped") == 1, out  # the record above it does not repeat it
        assert "death signal" not in out and "torch/distributed" not in error, out
        assert workers_under(lab["proc"]) == []

        nb.run_cell(4)
        nb.wait(lambda: "relaunched: {0: 100, 1: 101}" in nb.outputs(4), "the relaunch after the interrupt")
        nb.shot("4-relaunched")
        assert "Error displaying widget" not in nb.text() and not nb.errors, nb.errors
    finally:
        nb.close()


def test_a_ranks_cell_shows_its_ranks_and_limit_while_it_runs_then_how_it_ended(lab, browser, shots):
    """The line a %%ranks cell starts with: live while the cell runs (a rank that prints nothing is
    shown running), kept above the error of a cell cut short, emptied after a cell that succeeds.
    The running cell is ended by Kernel > Interrupt, when the test has seen what it needs."""
    write_notebook(lab["root"] / "ranks.ipynb", RANKS_CELLS)
    nb = Notebook(browser, lab, "ranks.ipynb", shots)
    try:
        nb.run_cell(0)
        nb.wait(lambda: nb.finished(0), "the warm ranks to start")
        nb.run_cell(1)
        line = nb.wait(lambda: _status_line(nb.outputs(1), "rank 1 done in"), "the status line, rank 1 done")
        nb.shot("ranks-1-running")
        assert nb.prompt(1) == "[*]:", f"the status line was seen only after the cell ended: {line}"
        assert line.startswith("distlab: ranks 0, 1 · limit 100 s · ") and (
            "rank 0 running" in line or "rank 0 waiting in all_reduce for rank 1" in line), line
        line = nb.wait(lambda: _status_line(nb.outputs(1), "rank 0 waiting in all_reduce for rank 1"),
                       "rank 0 saying where it waits, while it waits")
        assert nb.prompt(1) == "[*]:" and "\n" not in line, line
        nb.menu("Kernel", "Interrupt Kernel")
        nb.wait(lambda: nb.finished(1), "the interrupted cell to end")
        nb.shot("ranks-2-interrupted")
        out = nb.outputs(1)
        line = _status_line(out, "interrupted at")
        assert line and "rank 0 blocked in all_reduce" in line, out[:1500]
        assert out.index(line) < out.index("was interrupted on rank 0"), out[:1500]

        nb.run_cell(2)
        nb.wait(lambda: nb.finished(2), "the timed-out cell to end")
        out = nb.outputs(2)
        line = _status_line(out, "timed out at")
        assert line and line.startswith("distlab: rank 0 · limit 1 s · ") and "blocked in all_reduce" in line, out
        assert "did not finish within timeout=1.0s on rank 0." in out

        nb.run_cell(3)
        nb.wait(lambda: nb.finished(3), "a cell on the restarted ranks")
        nb.shot("ranks-3-succeeded")
        assert "[rank0] 2" in nb.outputs(3) and "distlab:" not in nb.outputs(3), nb.outputs(3)
        assert not nb.errors, nb.errors
        nb.menu("Kernel", "Shut Down Kernel")  # its warm ranks end with it
    finally:
        nb.close()


def _status_line(text: str, containing: str) -> str | None:
    """The %%ranks status line in a cell's output text, once it contains ``containing``."""
    return next((line for line in text.splitlines() if line.startswith("distlab: rank") and containing in line),
                None)


def test_a_notebook_saved_while_a_run_is_live_holds_what_it_had_printed_and_later_only_the_record(
        lab, browser, shots):
    """Saved mid-run: no widget (it would reopen as 'Error displaying widget: model not found'), the
    lines the ranks had printed a moment before the save, and nothing the live view did not show.
    Saved again once the run is over: the record alone, no copy of the run left under it."""
    path = lab["root"] / "saved-live.ipynb"
    write_notebook(path, SAVE_CELLS)
    nb = Notebook(browser, lab, "saved-live.ipynb", shots)
    try:
        nb.menu("Run", "Run All Cells")
        nb.wait(lambda: _printed(lab, "slow", 1, "rank 1 slow step 12\n"), "the run to be a few seconds in")
        printed = [_last_step(_rank_log(lab, "slow", r), r) for r in (0, 1)]  # by the time the learner saves
        nb.page.keyboard.press("Control+s")
        nb.wait(lambda: "slow step" in _saved_outputs(path), "the save mid-run")
        nb.shot("1-saved-while-running")
        assert nb.prompt(2) == "[*]:", "the run ended before the save: nothing was saved mid-run"
        saved = json.loads(_saved_outputs(path))
        mid = path.with_name("saved-mid-run.ipynb")
        mid.write_text(path.read_text())  # reopened below, once this kernel is gone
        assert "application/vnd.jupyter.widget-view+json" not in json.dumps(saved), saved
        (output,) = saved  # one output: the live view itself, no second copy of it
        text = "".join(output["data"]["text/plain"])
        kept = [_last_step(text, r) for r in (0, 1)]
        assert all(k >= p - SAVE_LAG_S / SAVE_STEP_S for k, p in zip(kept, printed, strict=True)), (
            f"saved with the ranks at steps {kept}, but they had printed steps {printed} before the save:\n{text}")
        assert text.startswith("distlab: 2 ranks · running "), text
        live = nb.outputs(2).strip().splitlines()
        assert live[0].startswith("distlab: 2 ranks · running ") and "copy" not in nb.outputs(2), live[:3]

        nb.wait(lambda: nb.finished(2), "the run to finish")
        nb.page.keyboard.press("Control+s")
        nb.wait(lambda: "ranks done in" in _saved_outputs(path), "the save after the run")
        (output,) = json.loads(_saved_outputs(path))
        text = "".join(output["data"]["text/plain"])
        assert text.startswith("distlab: 2 ranks done in") and "running" not in json.dumps(output), text[:600]
        nb.menu("Kernel", "Shut Down Kernel")
        assert not nb.errors, nb.errors
    finally:
        nb.close()

    again = Notebook(browser, lab, mid.name, shots)  # a new kernel: nothing of the run is left but the file
    try:
        again.wait(lambda: f"rank 0 slow step {kept[0]}" in again.outputs(2), "the saved output after reopening")
        again.shot("2-reopened")
        assert "Error displaying widget" not in again.text() and not again.errors, again.errors
        assert again.cell(2).locator(".distlab-rank").count() == 2
    finally:
        again.close()


def test_a_run_that_outlives_its_cell_keeps_drawing_there_and_ends_with_its_record(lab, browser, shots):
    """``join=False``: the view draws from its own thread and the run's while the kernel runs later
    cells. Every redraw and the record land in the launching cell, which, saved, holds the record alone
    (the widget view left its widget there, and its mid-run copy)."""
    write_notebook(lab["root"] / "pending.ipynb", PENDING_CELLS)
    nb = Notebook(browser, lab, "pending.ipynb", shots)
    try:
        nb.menu("Run", "Run All Cells")
        nb.wait(lambda: "joined: {0: 0, 1: 1}" in nb.outputs(4), "the run to be joined in a later cell")
        nb.wait(lambda: "2 ranks done in" in nb.outputs(2), "the record in the launching cell", timeout_s=10)
        nb.shot("pending-joined")
        launch = nb.outputs(2)
        assert "rank 1 chatty step 14" in launch and "running" not in launch, launch[:600]
        assert nb.outputs(3).strip() == "another cell ran" and "chatty" not in nb.outputs(4), nb.outputs(4)
        nb.page.keyboard.press("Control+s")
        nb.wait(lambda: "chatty" in _saved_outputs(lab["root"] / "pending.ipynb"), "the save")
        (output,) = json.loads(_saved_outputs(lab["root"] / "pending.ipynb"))
        assert set(output["data"]) == {"text/html", "text/plain"}, output  # no widget
        assert "".join(output["data"]["text/plain"]).startswith("distlab: 2 ranks done in"), output
        nb.menu("Kernel", "Shut Down Kernel")
        assert not nb.errors, nb.errors
    finally:
        nb.close()


BAR_STEPS = 12


def bar_cells(release: Path) -> list[str]:
    """Each rank draws a tqdm-style bar on stderr (``\\r`` redraws one line), holds half-way until
    ``release`` exists, finishes the bar, then prints one more line."""
    return [
        "import os\nimport sys\nimport time\n\nimport distlab",
        "def with_a_bar(rank):\n"
        f"    for i in range({BAR_STEPS} + 1):\n"
        f"        sys.stderr.write(f'\\rrank {{rank}} bar {{i}}/{BAR_STEPS}')\n"
        "        sys.stderr.flush()\n"
        f"        if i == {BAR_STEPS // 2}:\n"
        + hold_until(release).replace("    ", "            ", 1).replace("\n    ", "\n            ")
        + "        time.sleep(0.05)\n"
        "    sys.stderr.write('\\n')\n"
        "    print(f'rank {rank} after the bar', flush=True)\n"
        "    return rank",
        "res = distlab.spawn(with_a_bar, nprocs=2, timeout=300)",
    ]


def test_a_rank_progress_bar_is_one_line_that_moves_not_an_error_box(lab, browser, shots):
    """#38 item 6: a rank's tqdm bar (``\\r`` on stderr) shows as one line per rank, updated in place
    while it runs, never as a stderr box; the record keeps its final state, once."""
    release = lab["root"] / "bar.release"
    write_notebook(lab["root"] / "bar.ipynb", bar_cells(release))
    nb = Notebook(browser, lab, "bar.ipynb", shots)
    try:
        nb.menu("Run", "Run All Cells")
        half = f"bar {BAR_STEPS // 2}/{BAR_STEPS}"
        nb.wait(lambda: f"rank 0 {half}" in nb.outputs(2) and f"rank 1 {half}" in nb.outputs(2),
                "each rank's bar half-way, while the cell runs")
        nb.shot("bar-1-half-way")
        live = nb.outputs(2)
        assert nb.prompt(2) == "[*]:", "the cell ended before the ranks were released"
        for rank in (0, 1):
            assert len(re.findall(rf"rank {rank} bar \d+/{BAR_STEPS}", live)) == 1, live  # one line, in place
        assert nb.cell(2).locator("[data-mime-type='application/vnd.jupyter.stderr']").count() == 0
        release.touch()
        nb.wait(lambda: "2 ranks done in" in nb.outputs(2), "the record")
        nb.shot("bar-2-done")
        done = nb.outputs(2)
        for rank in (0, 1):
            assert len(re.findall(rf"rank {rank} bar \d+/{BAR_STEPS}", done)) == 1, done
            assert f"rank {rank} bar {BAR_STEPS}/{BAR_STEPS}" in done and f"rank {rank} after the bar" in done
        assert nb.cell(2).locator("[data-mime-type='application/vnd.jupyter.stderr']").count() == 0
        nb.menu("Kernel", "Shut Down Kernel")
    finally:
        nb.close()


def test_a_chapter_opens_unmodified(lab, browser, shots):
    """JupyterLab fills in the notebook metadata a kernel reports; a chapter that lacks some opens dirty."""
    import shutil

    shutil.copy(SRC.parent / "book" / "04_point_to_point.ipynb", lab["root"] / "chapter.ipynb")
    nb = Notebook(browser, lab, "chapter.ipynb", shots)
    try:
        time.sleep(2)  # the kernel's info arrives after the status bar says idle
        nb.shot("chapter-opened")
        tab = nb.page.locator(".lm-TabBar-tab.jp-mod-current")
        assert "jp-mod-dirty" not in (tab.get_attribute("class") or ""), "the chapter opened marked modified"
    finally:
        nb.close()


def _saved_outputs(path: Path) -> str:
    """The outputs of the saved launching cell as JSON text ('' while they are not on disk yet)."""
    try:
        cells = json.loads(path.read_text())["cells"]
    except ValueError:  # caught while the server writes it
        return ""
    return json.dumps(cells[2]["outputs"]) if len(cells) > 2 and cells[2]["outputs"] else ""


def _printed(lab, function: str, rank: int, text: str) -> bool:
    """Whether a rank of the latest run of ``function`` has printed ``text`` (its log in the run folder)."""
    return text in _rank_log(lab, function, rank)


def _rank_log(lab, function: str, rank: int) -> str:
    """Everything a rank of the runs of ``function`` has printed so far (its logs in the run folders)."""
    return "".join(log.read_text() for log in lab["runs"].glob(f"*{function}*/logs/attempt0/rank{rank}.out"))


def _last_step(text: str, rank: int = 0) -> int:
    """The last ``rank N slow step K`` line's K in ``text`` (-1 when there is none)."""
    return max((int(k) for k in re.findall(rf"rank {rank} slow step (\d+)\n", text + "\n")), default=-1)


KNOB_CELLS = [
    "import time\n\nimport torch.distributed as dist\nfrom IPython.display import HTML\n\nimport distlab\n"
    "from distlab.teach.knobs import knobs",
    "def world_of(pause):\n"
    "    time.sleep(pause)  # a run long enough for the test to move the slider again during it\n"
    "    return dist.get_world_size()\n\n\n"
    "started, going, most = [], [0], [0]  # kept by the measurement itself, not by the knobs\n\n\n"
    "def world_lab(world=2):\n"
    "    started.append(world)\n"
    "    going[0] += 1\n"
    "    most[0] = max(most[0], going[0])\n"
    "    try:\n"
    "        with distlab.Ranks(world) as lab_ranks:\n"
    "            got = lab_ranks.run(world_of, 0.0 if world < 4 else 1.5)\n"
    "    finally:\n"
    "        going[0] -= 1\n"
    "    return HTML(f'<p>lab says world={world}: {sorted(got.values())}</p>')\n\n\n"
    "lab = knobs(world_lab, world=(2, 6))",
    "print(f'started {started} at most {most[0]} at once; shown {lab.shown}')",
]


def test_a_knob_reruns_on_live_ranks_once_let_go_and_a_quick_second_move_supersedes(lab, browser, shots):
    """A slider of distlab.teach.knobs: moved, the picture is redrawn in place from a run on fresh
    warm ranks; moved twice more while a run is going, that run's picture is dropped and one run,
    of the newest value, follows: the middle value never runs, never two runs at once. Then the
    kernel restarts and the cell runs again."""
    write_notebook(lab["root"] / "knobs.ipynb", KNOB_CELLS)
    nb = Notebook(browser, lab, "knobs.ipynb", shots)
    try:
        nb.run_cell(0)
        nb.wait(lambda: nb.finished(0), "the imports")
        nb.run_cell(1)
        nb.wait(lambda: "lab says world=2: [2, 2]" in nb.outputs(1), "the default picture")
        handle = nb.cell(1).locator(".widget-slider .noUi-handle").first
        handle.focus()
        nb.page.keyboard.press("ArrowRight")  # world 3
        nb.wait(lambda: "lab says world=3: [3, 3, 3]" in nb.outputs(1), "the picture of world=3")
        assert "world=2" not in nb.outputs(1)  # redrawn in place, not added below
        nb.shot("knobs-world-3")
        handle.focus()
        nb.page.keyboard.press("ArrowRight")  # world 4: a run of 1.5 s
        nb.wait(lambda: "measuring world=4" in nb.outputs(1), "the run of world=4 to start")
        nb.page.keyboard.press("ArrowRight")  # world 5 and 6, while world=4 is going
        nb.page.keyboard.press("ArrowRight")
        nb.wait(lambda: "lab says world=6: [6, 6, 6, 6, 6, 6]" in nb.outputs(1), "the picture of world=6")
        nb.shot("knobs-world-6")
        assert "world=4" not in nb.outputs(1)  # the superseded run's picture was never drawn
        nb.run_cell(2)
        nb.wait(lambda: "started " in nb.outputs(2), "what the measurement saw")
        # 5 never ran (superseded by 6 before it started), and never two runs at once
        assert nb.outputs(2).strip() == "started [2, 3, 4, 6] at most 1 at once; shown {'world': 6}", nb.outputs(2)
        nb.menu("Kernel", "Restart Kernel and Run All Cells")
        nb.page.locator(".jp-Dialog button.jp-mod-accept").click()
        nb.wait(lambda: "started [2] at most 1" in nb.outputs(2), "the lab again after a restart")
        assert "lab says world=2: [2, 2]" in nb.outputs(1)
        nb.menu("Kernel", "Shut Down Kernel")
        assert not nb.errors, nb.errors
    finally:
        nb.close()
