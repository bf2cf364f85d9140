"""The live view's state and the static record a cell keeps after a run. No processes, no browser."""
import logging
from html.parser import HTMLParser
from pathlib import Path

import pytest

from distlab.errors import INTERRUPTED, RunInterrupted, WorkerFailedError, WorkerTimeoutError
from distlab.launch import engine
from distlab.results import RunResult
from distlab.view import record
from distlab.view.display import LiveView


class Blocks(HTMLParser):
    """The record's per-rank ``<details>`` blocks, in page order: rank, open, summary, ``earlier`` (the
    text behind the nested "earlier lines" block) and ``shown`` (the text in view without a click)."""

    def __init__(self, page: str):
        super().__init__()
        self.blocks, self._stack = [], []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "details" and "data-rank" in attrs:
            self.blocks.append({"rank": int(attrs["data-rank"]), "open": "open" in attrs, "summary": "",
                                "earlier": "", "shown": ""})
        elif tag == "details" and not self._stack:
            self._stack.append("other")  # a block of the record that is not a rank's (the return values)
            return
        if tag in ("details", "summary"):
            self._stack.append(tag)

    def handle_endtag(self, tag):
        if tag in ("details", "summary") and self._stack:
            self._stack.pop()

    def handle_data(self, data):
        if not self._stack or not self.blocks or "other" in self._stack:
            return
        depth = self._stack.count("details")
        if self._stack[-1] == "summary":
            key = "summary" if depth == 1 else "earlier"
        else:
            key = "shown" if depth == 1 else "earlier"
        self.blocks[-1][key] += data


def board_with_lines(world_size: int, lines_per_rank: int = 3) -> record.Board:
    board = record.Board(world_size)
    for rank in range(world_size):
        for i in range(lines_per_rank):
            board.line(rank, f"rank {rank} line {i}")
    return board


def test_a_failed_run_shows_the_rank_that_failed_first_on_top_open_and_marked():
    board = board_with_lines(3)
    board.line(2, "ValueError: boom")
    board.finish(record.Outcome("failed", wall_s=2.5, failed_rank=2, exitcode=1))
    blocks = Blocks(record.record_html(board)).blocks
    assert [(b["rank"], b["open"]) for b in blocks] == [(2, True), (0, False), (1, False)]
    assert "✗ failed first (exit code 1)" in blocks[0]["summary"] and blocks[0]["shown"].endswith("ValueError: boom")
    assert "stopped by distlab" in blocks[1]["summary"]
    text = record.record_text(board)
    assert text.splitlines()[0] == ("distlab: rank 2 failed first (exit code 1) after 2.5 s; "
                                    "the other ranks were stopped")
    assert text.index("--- rank 2 ·") < text.index("--- rank 0 ·")


def test_a_successful_record_opens_every_rank_and_shows_the_returns():
    board = board_with_lines(2)
    board.finish(record.outcome_of(RunResult(Path("/runs/x"), None, 2, returns={0: 0, 1: 2}, wall_s=3.14)))
    page = record.record_html(board)
    blocks = Blocks(page).blocks
    assert [(b["rank"], b["open"]) for b in blocks] == [(0, True), (1, True)]
    assert "done in 3.1 s" in blocks[1]["summary"]
    assert blocks[1]["shown"] == "rank 1 line 0\nrank 1 line 1\nrank 1 line 2"
    assert '<details class="distlab-returns" open><summary>return values' in page and "/runs/x" in page
    assert "rank 0: 0\nrank 1: 2</pre>" in page  # one rank per line
    text = record.record_text(board)
    assert text.startswith("distlab: 2 ranks done in 3.1 s\n--- rank 0 · done in 3.1 s · 3 lines")
    assert "returns:\n  rank 0: 0\n  rank 1: 2\n" in text


def test_long_return_values_are_pretty_printed_per_rank_and_cut_with_a_pointer_to_all_of_it():
    stamps = {f"t{i}": 1764600000.0 + i for i in range(60)}
    rows = record.returns_lines({0: stamps, 1: {"loss": 0.5}})
    assert rows[1] == (1, "{'loss': 0.5}")
    assert rows[0][1].startswith("{'t0': 1764600000.0,") and "\n" in rows[0][1]  # pretty-printed, not one long line
    assert rows[0][1].endswith(" … (res.returns[0] holds all of it)") and "t59" not in rows[0][1]
    page = record.returns_html({0: stamps, 1: {"loss": 0.5}})
    assert page.startswith('<details class="distlab-returns"><summary>')  # long: closed, one click away


def test_an_interrupted_record_leads_with_the_headline_and_keeps_ranks_a_click_away():
    board = board_with_lines(2)
    board.finish(record.Outcome("interrupted", wall_s=4.0))
    assert [(b["open"], b["summary"]) for b in Blocks(record.record_html(board)).blocks] == [
        (False, "rank 0 · interrupted · 3 lines"), (False, "rank 1 · interrupted · 3 lines")]


def test_the_record_is_plain_html_and_text_with_no_widget():
    board = board_with_lines(1)
    board.finish(record.Outcome("done", wall_s=1.0))
    assert set(record.record_bundle(board)) == {"text/html", "text/plain"}


def test_printed_markup_is_shown_as_text_never_run():
    board = record.Board(1)
    board.line(0, "<script>alert(1)</script> & <b>")
    board.finish(record.Outcome("done", wall_s=1.0))
    page = record.record_html(board)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;b&gt;" in page


def test_the_record_shows_the_last_lines_and_keeps_the_earlier_ones_a_click_away():
    board = record.Board(1)
    board.line(0, "only the streamed tail")
    n = record.RECORD_TAIL_LINES + 50
    board.finish(record.Outcome("done", wall_s=1.0, logs={0: "".join(f"line {i}\n" for i in range(n))}))
    (block,) = Blocks(record.record_html(board)).blocks
    assert f"{n} lines" in block["summary"]
    assert block["shown"] == "\n".join(f"line {i}" for i in range(n - record.RECORD_SHOWN_LINES, n))
    assert block["earlier"].startswith(f"{n - record.RECORD_SHOWN_LINES} earlier lines"
                                       "… 50 older lines: res.logs or the run folder\nline 50\n")
    assert block["earlier"].endswith(f"line {n - record.RECORD_SHOWN_LINES - 1}")
    text = record.record_text(board)
    assert f"… {n - record.TEXT_TAIL_LINES} earlier lines not shown\nline {n - record.TEXT_TAIL_LINES}\n" in text


def test_a_rank_that_printed_nothing_says_so():
    board = record.Board(1)
    board.finish(record.Outcome("done", wall_s=1.0))
    (block,) = Blocks(record.record_html(board)).blocks
    assert (block["summary"], block["shown"]) == ("rank 0 · done in 1.0 s · no output", "(printed nothing)")


def test_the_live_view_shows_each_ranks_latest_lines_and_counts_the_rest():
    board = record.Board(2)
    for i in range(record.LIVE_TAIL_LINES + 7):
        board.line(0, f"step {i}")
    shown = record.live_lines_per_rank(2)
    text = record.live_text(board, 11.4)
    last = record.LIVE_TAIL_LINES + 6
    assert text.startswith("distlab: 2 ranks · running 11 s\n" + record.live_note(11.4) + "\n"
                           "--- rank 0 · running · 507 lines ---\n"
                           f"… {last + 1 - shown} earlier lines not shown\nstep {last + 1 - shown}\n"), text[:300]
    assert text.endswith(f"step {last}\n--- rank 1 · starting ---\n(starting…)")
    page = record.live_html(board, 11.4)
    assert page.count("<pre") == 1 and f"step {last}</pre>" in page and "<i>starting…</i>" in page
    assert "<details" not in page  # nothing to click while it runs: each redraw would close it again


def test_the_live_view_fits_many_ranks_on_about_a_screen():
    assert record.live_lines_per_rank(2) == record.LIVE_SHOWN_LINES // 2
    assert record.live_lines_per_rank(64) == record.LIVE_MIN_LINES


def test_only_a_rank_that_reports_progress_gets_a_bar():
    board = record.Board(2)
    board.metric(1, {"loss": 0.5})
    board.metric(0, {"step": 4, "total": 8, "loss": 0.123456})
    page = record.live_html(board, 1.0)
    assert page.count("<progress") == 1 and '<progress value="4" max="8"></progress> 4/8  loss=0.1235' in page
    assert record.live_heading(board.ranks[0]) == "rank 0 · running · 4/8  loss=0.1235"
    assert record.live_heading(board.ranks[1]) == "rank 1 · starting"


def test_ranks_a_script_started_itself_report_progress_but_get_no_empty_block():
    board = record.Board(1)  # run_script(mode="python"): one process, whose mp.spawn children report
    board.line(0, "printed by every rank of the script")
    board.metric(1, {"step": 1, "total": 2})
    board.finish(record.Outcome("done", wall_s=1.0))
    assert [b["rank"] for b in Blocks(record.record_html(board)).blocks] == [0]


def test_a_scripts_one_log_is_named_after_the_script_not_rank_0():
    """#38 item 9: run_script(mode="python") starts one process; calling its log "rank 0" misled."""
    board = record.Board(1, {0: "ddp_train.py"})
    board.line(0, "Rank 1, Epoch 0, Batch 0, Loss: 0.7")
    assert record.live_heading(board.ranks[0]).startswith("ddp_train.py · running")
    assert "rank 0" not in record.live_bundle(board, 1.0)["text/html"]
    board.finish(record.Outcome("done", wall_s=1.0))
    assert "--- ddp_train.py · done" in record.record_text(board)
    assert "<summary>ddp_train.py · done" in record.record_html(board) and "rank 0" not in record.record_html(board)


def test_rank_states_from_starting_to_done():
    board = record.Board(2)
    assert [record.live_heading(s) for s in board.ranks] == ["rank 0 · starting", "rank 1 · starting"]
    board.metric(0, {"loss": 0.5})  # a number without progress: still starting, no step shown
    assert record.live_heading(board.ranks[0]) == "rank 0 · starting"
    assert board.metric(0, {"step": 3, "total": 10, "loss": 0.25})
    board.started(1)
    assert [record.live_heading(s) for s in board.ranks] == ["rank 0 · running · 3/10  loss=0.25",
                                                             "rank 1 · running"]
    board.returned(1, 1.52)
    board.finish(record.Outcome("done", wall_s=2.0))
    assert [s.label() for s in board.ranks] == ["done in 2.0 s", "done in 1.5 s"]


@pytest.mark.parametrize("value, kind, headline", [
    (WorkerFailedError(1, 1, "tb", "", "/r", RunResult(Path("/r"), None, 2, wall_s=2.0)), "failed",
     "rank 1 failed first (exit code 1) after 2.0 s; the other ranks were stopped"),
    (WorkerTimeoutError(5.0, {}, "/r", RunResult(Path("/r"), None, 2, wall_s=5.5)), "timed out",
     "timed out after 5.5 s; all ranks were stopped"),
    (RunInterrupted(2, "/r", RunResult(Path("/r"), None, 2, wall_s=4.0)), "interrupted",
     "interrupted after 4.0 s"),
    (RuntimeError("distlab: run cancelled; all 2 worker processes were stopped. Run folder: /r"), "ended",
     "run cancelled; all 2 worker processes were stopped."),
    (ValueError(), "ended", "ValueError"),
])
def test_every_way_a_run_ends_has_a_headline(value, kind, headline):
    outcome = record.outcome_of(value, wall_s=9.0)
    assert (outcome.kind, outcome.headline(2)) == (kind, headline)


def test_the_interrupt_leads_with_one_line_in_a_notebook():
    e = RunInterrupted(2, "/runs/x")
    assert isinstance(e, KeyboardInterrupt) and str(e) == INTERRUPTED.format(n=2, run_dir="/runs/x")
    assert e._render_traceback_() == ["\x1b[0;31mdistlab: interrupted; all 2 worker processes were stopped.\x1b[0m",
                                      "Run folder (script and every rank's log): /runs/x"]


def test_a_worker_failure_leads_with_the_failed_rank_not_distlab_frames():
    e = WorkerFailedError(1, 1, "Traceback (most recent call last):\n  File boom.py\nValueError: boom\n", "up", "/r")
    lines = e._render_traceback_()
    assert lines[0] == "\x1b[0;31mWorkerFailedError: distlab: rank 1 failed first (exit code 1); " \
                       "the other ranks were stopped.\x1b[0m"
    assert lines[1:4] == ["Traceback (most recent call last):", "  File boom.py", "ValueError: boom"]


def _deep_inside_distlab():
    raise WorkerFailedError(1, 1, "ValueError: boom\n", "", "/r")


def test_ipython_shows_the_message_not_the_frames_it_came_through(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.user_ns["launch"] = _deep_inside_distlab
        shell.run_cell("launch()")
    finally:
        InteractiveShell.clear_instance()
    shown = capsys.readouterr().out
    assert shown.splitlines()[0].endswith("WorkerFailedError: distlab: rank 1 failed first (exit code 1); "
                                          "the other ranks were stopped.\x1b[0m"), shown
    assert "_deep_inside_distlab" not in shown and "ValueError: boom" in shown


# ---------------------------------------------------------------------------------------------- live view
class FakeShower:
    def __init__(self):
        self.shown, self.replaced = [], []

    def show(self, obj, display_id):
        self.shown.append((obj, display_id))

    def replace(self, bundle, display_id):
        self.replaced.append((bundle, display_id))

    def latest(self) -> dict:
        """What the one live output holds now: what a notebook saved at this moment keeps."""
        return (self.replaced or self.shown)[-1][0]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def live_view():
    shower, clock = FakeShower(), Clock()
    view = LiveView(2, shower=shower, clock=clock)
    yield view, shower, clock
    view._stop.set()


def test_the_live_view_is_one_plain_output_that_holds_every_line_printed_so_far(live_view):
    """A widget in the saved file reopens as 'Error displaying widget: model not found': the one
    output the view draws is a plain bundle, and it holds a line as soon as the view redraws."""
    view, shower, clock = live_view
    ((first, live_id),) = shower.shown
    assert set(first) == {"text/html", "text/plain"}
    assert first["text/plain"] == "distlab: 2 ranks · running 0 s\n" + record.live_note(0) + \
                                  "\n--- rank 0 · starting ---\n(starting…)\n--- rank 1 · starting ---\n(starting…)"
    view.line(1, "step 1 of rank 1")
    clock.now += 0.1
    view.refresh()
    (bundle, display_id), = shower.replaced
    assert display_id == live_id and all("step 1 of rank 1" in bundle[kind] for kind in ("text/html", "text/plain"))
    view.refresh()
    assert len(shower.replaced) == 1  # nothing changed: nothing sent
    clock.now += 1.0
    view.refresh()
    assert shower.latest()["text/plain"].startswith("distlab: 2 ranks · running 1 s\n")  # the clock, once a second


def test_the_live_view_has_no_line_but_the_runs_own(live_view):
    view, shower, clock = live_view
    view.line(0, "hello")
    clock.now += 3.0
    view.refresh()
    text = shower.latest()["text/plain"]
    assert text.splitlines() == ["distlab: 2 ranks · running 3 s", record.live_note(3),
                                 "--- rank 0 · running · 1 line ---", "hello",
                                 "--- rank 1 · starting ---", "(starting…)"]


def test_rank_states_follow_the_run_folder(live_view, tmp_path):
    view, shower, clock = live_view
    view.begin(tmp_path)
    for sub in ("ready", "returns"):
        (tmp_path / sub).mkdir()
    view.refresh()
    assert "<i>starting…</i>" in shower.latest()["text/html"]
    (tmp_path / "ready" / "rank1").write_text("123")  # rank 1's interpreter is up, it printed nothing yet
    view.refresh()
    assert "rank 1 · running</div>" in shower.latest()["text/html"]
    assert "running, printed nothing yet" in shower.latest()["text/html"]
    clock.now += 1.25
    (tmp_path / "returns" / "rank1.pt").write_bytes(b"")
    view.refresh()
    assert "--- rank 1 · done in 1.2 s ---" in shower.latest()["text/plain"]


def test_finish_replaces_the_live_view_by_the_record_in_the_same_output(live_view):
    view, shower, _ = live_view
    view.begin("/runs/x")
    view.line(1, "ValueError: boom")
    view.close()
    assert "running" in shower.latest()["text/plain"]  # this engine reports the outcome: the record waits for finish()
    view.finish(WorkerFailedError(1, 1, "tb", "", "/runs/x"))
    assert {display_id for _, display_id in shower.shown + shower.replaced} == {view.display_id}
    bundle = shower.latest()
    assert bundle["text/plain"].startswith("distlab: rank 1 failed first (exit code 1)")
    assert Blocks(bundle["text/html"]).blocks[0]["rank"] == 1 and "running" not in bundle["text/html"]
    view.refresh()
    assert shower.latest() is bundle  # the record stays: no live redraw after it


def test_an_engine_without_finish_still_leaves_a_record(live_view):
    view, shower, clock = live_view
    view.line(0, "hi")
    clock.now += 2.0
    view.close()
    assert shower.latest()["text/plain"].startswith("distlab: ended after 2.0 s\n--- rank 0 · ended · 1 line ---\nhi")


def test_the_headline_and_every_ranks_done_time_come_from_one_clock(live_view, tmp_path):
    view, shower, clock = live_view
    view.begin(tmp_path)
    (tmp_path / "returns").mkdir()
    clock.now += 0.5
    for rank in (0, 1):
        (tmp_path / "returns" / f"rank{rank}.pt").write_bytes(b"")
    view.refresh()
    clock.now += 0.04
    view.finish(RunResult(tmp_path, None, 2, returns={0: 1, 1: 2}, wall_s=0.41))  # the engine's own, shorter, clock
    text = shower.latest()["text/plain"]
    assert text.startswith("distlab: 2 ranks done in 0.5 s\n--- rank 0 · done in 0.5 s"), text


# ---------------------------------------------------------------------------------------------- engine hooks
def test_views_without_the_optional_methods_or_failing_in_them_never_change_the_run():
    class Old:
        pass

    class Broken:
        def finish(self, outcome):
            raise RuntimeError("display gone")

    engine.tell_view(Old(), "finish", None)
    with pytest.warns(UserWarning, match=r"the live view failed in finish\(\): RuntimeError"):
        engine.tell_view(Broken(), "finish", None)


def test_torchelastic_log_lines_stay_out_of_the_cell():
    agent = logging.getLogger("torch.distributed.elastic.agent.server.api")
    with engine.quiet_torchelastic():
        quiet = agent.isEnabledFor(logging.WARNING)  # "Received 2 death signal, shutting down workers"
    assert not quiet and agent.isEnabledFor(logging.WARNING)


def test_a_live_view_saved_or_left_by_its_kernel_says_what_it_is(live_view):
    """Issue #52 item 4: a notebook saved mid-run, or a cell whose kernel restarted, keeps the live
    view's last frame for good; it must not read as a run still going ("running 8 s" for ever)."""
    view, shower, clock = live_view
    view.line(0, "hello")
    clock.now += 8.2
    view.refresh()
    frozen = shower.latest()  # what the notebook file holds if it is saved now
    note = "live view as of 8 s; the run's record replaces it when the run ends in this kernel"
    assert frozen["text/plain"].splitlines()[1] == note
    assert f'<div class="distlab-live-note" style="opacity:0.7;font-size:smaller">{note}</div>' \
        in frozen["text/html"].replace("&#x27;", "'")
    view.finish(None)
    assert "live view as of" not in shower.latest()["text/plain"]  # the record, in the same output


def test_an_interrupted_runs_record_and_error_say_each_thing_once():
    """The live view's record sits right above the interrupt's error in the cell: the message (all
    worker processes were stopped) and the run folder appear once, in the error."""
    board = record.Board(2)
    board.line(0, "hold")
    error = RunInterrupted(2, "/runs/x", RunResult(Path("/runs/x"), None, 2, wall_s=4.0))
    board.finish(record.outcome_of(error))
    for shown in (record.record_text(board), record.record_html(board)):
        cell = shown + "\n" + "\n".join(error._render_traceback_())
        assert cell.count("worker processes were stopped") == 1, cell
        assert cell.count("/runs/x") == 1, cell
        assert "interrupted after 4.0 s" in shown


# --- what the mutation run (bench/mutation.py) found untested in distlab.view.record -------------------------
PRE = f'<pre style="{record.PRE_STYLE}">'
FAILED = f'<span style="{record.FAILED_STYLE}">'


def failed_board():
    board = record.Board(2)
    board.line(0, "a")
    board.line(1, "b")
    board.line(1, "c")
    board.finish(record.Outcome("failed", wall_s=2.0, failed_rank=1, exitcode=3, run_dir="/runs/x", returns={0: 1}))
    return board


def test_a_failed_runs_record_word_for_word():
    board = failed_board()
    assert record.record_html(board) == (
        f'<div class="distlab-record"><div style="{record.FAILED_STYLE}">distlab: rank 1 failed first (exit code 3) '
        'after 2.0 s; the other ranks were stopped</div>'
        f'<details open data-rank="1"><summary>rank 1 · {FAILED}✗ failed first (exit code 3)</span> · 2 lines'
        f'</summary>{PRE}b\nc</pre></details>'
        f'<details data-rank="0"><summary>rank 0 · stopped by distlab · 1 line</summary>{PRE}a</pre></details>'
        '<div style="opacity:0.7">run folder: <code>/runs/x</code></div></div>')
    assert record.record_text(board) == (
        "distlab: rank 1 failed first (exit code 3) after 2.0 s; the other ranks were stopped\n"
        "--- rank 1 · ✗ failed first (exit code 3) · 2 lines ---\nb\nc\n"
        "--- rank 0 · stopped by distlab · 1 line ---\na\nrun folder: /runs/x")
    assert board.ranks[0].exitcode is None and board.ranks[1].exitcode == 3


def test_a_record_before_the_run_ended_word_for_word():
    board = record.Board(2)
    board.line(1, "one line")
    assert record.record_html(board) == (
        '<div class="distlab-record"><div style="font-weight:bold">distlab: ended</div>'
        '<details data-rank="0"><summary>rank 0 · starting · no output</summary>'
        '<div style="opacity:0.6;padding:0.3em 0.5em"><i>(printed nothing)</i></div></details>'
        f'<details open data-rank="1"><summary>rank 1 · running · 1 line</summary>{PRE}one line</pre></details></div>')
    assert record.record_text(board) == ("distlab: ended\n--- rank 0 · starting · 0 lines ---\n"
                                         "--- rank 1 · running · 1 line ---\none line")


@pytest.mark.parametrize("kind", ["timed out", "interrupted"])
def test_a_run_that_did_not_finish_shows_no_return_values(kind):
    board = record.Board(1)
    board.finish(record.Outcome(kind, wall_s=1.0, returns={0: 42}))
    assert "return values" not in record.record_html(board) and "returns:" not in record.record_text(board)
    assert record.record_html(board).startswith('<div class="distlab-record"><div style="font-weight:bold">')


def test_a_done_runs_record_counts_its_ranks_and_opens_up_to_four():
    board = record.Board(4)
    for rank in range(4):
        board.line(rank, "x")
    board.finish(record.Outcome("done", wall_s=None))
    page = record.record_html(board)
    assert "distlab: 4 ranks done in 0.0 s</div>" in page and "returns" not in record.record_text(board)
    assert "return values" not in page  # nothing returned: no block for it
    assert [block["open"] for block in Blocks(page).blocks] == [True] * 4
    board = record.Board(5)
    board.line(0, "x")
    board.finish(record.Outcome("done", wall_s=1.5))
    assert [block["open"] for block in Blocks(record.record_html(board)).blocks] == [False] * 5


def test_the_earlier_lines_and_the_older_ones_word_for_word():
    lines = [f"l{i}" for i in range(26)]
    shown = f'{PRE}{chr(10).join(lines[1:])}</pre>'
    assert record._output_html(lines, 26) == (
        f'<details class="distlab-earlier"><summary>1 earlier lines</summary>{PRE}l0</pre></details>{shown}')
    assert record._output_html(lines, 27) == (
        f'<details class="distlab-earlier"><summary>2 earlier lines</summary>{PRE}… 1 older line: res.logs or '
        f'the run folder\nl0</pre></details>{shown}')
    assert "… 2 older lines: res.logs" in record._output_html(lines, 28)


def test_a_live_pane_word_for_word():
    assert record.pane_html([], 0) == '<div style="opacity:0.6;padding:0.3em 0.5em"><i></i></div>'
    assert record.pane_html(["a", "b"], 2) == f"{PRE}a\nb</pre>"
    assert record.pane_html(["a", "b"], 3) == f"{PRE}… 1 earlier line not shown\na\nb</pre>"
    assert record.pane_html(["a", "b"], 4) == f"{PRE}… 2 earlier lines not shown\na\nb</pre>"


def test_the_live_view_word_for_word():
    board = record.Board(2)
    board.line(0, "x")
    board.metric(0, {"rank": 0, "time": 1.0, "step": 3, "total": 10, "loss": 0.25, "n": 2})
    board.metric(1, {"rank": 1, "total": 5, "step": 0})
    assert record.live_html(board, 3.2) == (
        '<div class="distlab-live"><div style="font-weight:bold">distlab: 2 ranks · running 3 s</div>'
        '<div class="distlab-live-note" style="opacity:0.7;font-size:smaller">live view as of 3 s; the run&#x27;s '
        'record replaces it when the run ends in this kernel</div>'
        '<div class="distlab-rank" data-rank="0"><div>rank 0 · running · 1 line · <progress value="3" max="10">'
        f'</progress> 3/10  loss=0.25  n=2</div>{PRE}x</pre></div>'
        '<div class="distlab-rank" data-rank="1"><div>rank 1 · running · <progress value="0" max="5"></progress> '
        '0/5</div><div style="opacity:0.6;padding:0.3em 0.5em"><i>running, printed nothing yet</i></div></div></div>')
    assert record.live_lines_per_rank(1) == record.LIVE_SHOWN_LINES == record.live_lines_per_rank(0)


class Result:
    def __init__(self, **fields):
        self.__dict__.update(fields)


class RankFailure(Exception):
    def __init__(self, result=None):
        super().__init__("distlab: rank 1 failed")
        self.rank, self.result = 1, result


def test_outcome_of_reads_what_the_engine_gave_whatever_it_lacks():
    done = record.outcome_of(Result(logs={0: "x\n"}, wall_s=2.0, run_dir="/runs/y", returns={0: 1}))
    assert (done.kind, done.logs, done.wall_s, done.run_dir, done.returns) == ("done", {0: "x\n"}, 2.0, "/runs/y",
                                                                               {0: 1})
    nothing = record.outcome_of(None, wall_s=1.0)
    assert (nothing.kind, nothing.logs, nothing.wall_s, nothing.run_dir, nothing.returns) == ("done", None, 1.0, "",
                                                                                              None)
    assert record.outcome_of(Result(logs={}, run_dir="")).logs is None
    failed = record.outcome_of(RankFailure(Result(logs={1: "boom\n"})))
    assert (failed.kind, failed.failed_rank, failed.exitcode, failed.logs) == ("failed", 1, None, {1: "boom\n"})
    error = RuntimeError("distlab: the agent failed. Run folder: /runs/z")
    error.result = Result(logs={0: "y\n"}, wall_s=3.0, run_dir="/runs/z")
    ended = record.outcome_of(error)
    assert (ended.kind, ended.message, ended.logs, ended.wall_s, ended.run_dir) == (
        "ended", "the agent failed.", {0: "y\n"}, 3.0, "/runs/z")


def test_return_values_word_for_word():
    assert record.returns_lines("v" * 700) == [("?", repr("v" * 700)[:600] + " …")]
    assert record.returns_lines({10: {"b": 1, "a": 2}, 9: list(range(30))}) == [
        (10, "{'b': 1, 'a': 2}"),  # ranks in the order of their repr, a dict in its own order
        (9, "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,\n"
            " 27, 28, 29]")]
    wide = ["a" * 46, "b" * 47]  # its repr is 101 characters: two lines at a width of 100
    assert record.returns_lines({0: wide}) == [(0, f"[{wide[0]!r},\n {wide[1]!r}]")]
    assert record.returns_lines({0: "x" * 598}) == [(0, repr("x" * 598))]  # 600 characters: whole
    assert record.returns_lines({0: "x" * 599})[0][1].endswith(" … (res.returns[0] holds all of it)")
    assert " open>" in record.returns_html({0: "x" * 98})  # 100 characters: one line, open
    assert " open>" not in record.returns_html({0: "x" * 99})
    assert " open>" not in record.returns_html({0: wide})


def test_clip_and_short_value():
    assert record.clip("x" * 1000) == "x" * 1000
    assert record.clip("x" * 1001) == "x" * 1000 + "…"
    assert record.short_value(3) == "3" and record.short_value(0.123456) == "0.1235" and record.short_value("s") == "s"


def test_board_states_move_only_forward():
    board = record.Board(2)
    assert not board.metric(0, {"rank": 0, "step": 1}) and board.ranks[0].phase == "starting"
    assert board.returned(0, 1.5) and board.ranks[0].label() == "done in 1.5 s"
    assert not board.returned(0, 2.0) and not board.started(0)
    assert board.started(1) and not board.started(1)
    board.finish(record.Outcome("done", wall_s=1.0))
    assert board.ranks[0].done_s == 1.0 and board.ranks[1].done_s == 1.0  # none is done after the whole run
    board = record.Board(1)
    board.returned(0, 1.5)
    board.finish(record.Outcome("done", wall_s=None))
    assert board.ranks[0].done_s == 1.5
    board = record.Board(2)
    board.line(1, "x")
    board.finish(record.Outcome("timed out"))
    assert [s.phase for s in board.ranks] == ["timed out", "timed out"]
    board = record.Board(2)
    board.line(1, "x")
    board.finish(record.Outcome("ended"))
    assert [s.phase for s in board.ranks] == ["ended", "ended"]
    assert record.RankState(0, phase="stopped", done_s=1.0).label() == "stopped by distlab"
    assert record.RankState(0, phase="failed").label() == "✗ failed first"
    assert record.Outcome("failed", failed_rank=2).headline(2) == "rank 2 failed first; the other ranks were stopped"
    assert record.Outcome("timed out").headline(2) == "timed out; all ranks were stopped"


def test_a_bar_at_the_top_of_the_tail_or_after_it_scrolled_is_updated_in_place():
    board = record.Board(1)
    board.progress(0, "10%", False)
    board.progress(0, "20%", False)
    assert list(board.ranks[0].lines) == ["20%"]
    for i in range(record.LIVE_TAIL_LINES + 100):
        board.line(0, f"l{i}")
    board.progress(0, "30%", False)
    board.progress(0, "40%", False)
    assert list(board.ranks[0].lines)[-2:] == [f"l{record.LIVE_TAIL_LINES + 99}", "40%"]


class TwoLines:
    def __repr__(self):
        return "first\nsecond"


def test_a_value_that_is_not_a_dict_of_ranks_is_cut_only_past_600_characters():
    assert record.returns_lines(5) == [("?", "5")]
    assert record.returns_lines("x" * 598) == [("?", repr("x" * 598))]  # 600 characters: whole
    assert record.returns_lines("x" * 599) == [("?", repr("x" * 599)[:600] + " …")]


def test_a_short_value_shown_on_two_lines_is_one_click_away():
    assert " open>" not in record.returns_html({0: TwoLines()})  # a tensor's repr, too, has several lines
