"""Progress bars in rank output (a tqdm redrawing its line with '\\r'): cut from ordinary lines, shown as
one line that moves, kept as their final state. No processes."""
import io
import sys

from distlab.folders.runfolder import RunFolder
from distlab.launch.watch import Watcher
from distlab.slurm.tail import JobTail
from distlab.view import record
from distlab.view.streams import Line, Progress, Splitter, Streams, deliver, rendered_lines
from distlab.warm import proto
from distlab.warm.group import OutputSink

TQDM = ["\r  0%|          | 0/3 [00:00<?, ?it/s]", "\r 33%|###3      | 1/3 [00:00<00:00, 9.9it/s]",
        "\r 67%|######6   | 2/3 [00:00<00:00, 9.9it/s]", "\r100%|##########| 3/3 [00:00<00:00, 9.9it/s]", "\n"]


# ---------------------------------------------------------------------------------------------- splitting
def test_a_bar_is_reported_as_it_moves_and_once_done():
    s = Splitter()
    assert s.feed(TQDM[0]) == [Progress("  0%|          | 0/3 [00:00<?, ?it/s]")]
    assert s.feed(TQDM[1] + TQDM[2]) == [Progress(" 67%|######6   | 2/3 [00:00<00:00, 9.9it/s]")]  # latest only
    assert s.feed(TQDM[3]) == [Progress("100%|##########| 3/3 [00:00<00:00, 9.9it/s]")]
    assert s.feed("\n") == [Progress("100%|##########| 3/3 [00:00<00:00, 9.9it/s]", done=True)]
    assert s.flush() == []


def test_ordinary_lines_wait_for_their_newline():
    s = Splitter()
    assert s.feed("hel") == []
    assert s.feed("lo\nwor") == [Line("hello")]
    assert s.feed("ld\n\n") == [Line("world"), Line("")]
    assert s.feed("end") == []
    assert s.flush() == [Line("end")]


def test_a_windows_line_end_is_no_bar():
    s = Splitter()
    assert s.feed("one\r") == []
    assert s.feed("\ntwo\r\n") == [Line("one"), Line("two")]


def test_a_redraw_overwrites_the_line_from_its_start_as_a_terminal_does():
    assert Splitter().feed("abcdef\rXY\n") == [Progress("XYcdef", done=True)]
    assert Splitter().feed("\r50%|#####|\r" + " " * 10 + "\r") == [Progress("")]  # it cleared itself (leave=False)


def test_lines_around_a_bar_keep_their_order():
    s = Splitter()
    events = s.feed("epoch 1\n" + "".join(TQDM) + "epoch 2\n\r 1/9")
    assert events == [Line("epoch 1"), Progress("100%|##########| 3/3 [00:00<00:00, 9.9it/s]", done=True),
                      Line("epoch 2"), Progress(" 1/9")]
    assert s.flush() == [Progress(" 1/9", done=True)]  # the stream ended mid-bar: its last state stays


def test_an_unchanged_redraw_is_not_reported_again():
    s = Splitter()
    assert s.feed("\r5/9 ") == [Progress("5/9")]
    assert s.feed("\r5/9") == []


def test_a_bar_redrawn_many_times_costs_one_line_of_memory():
    s = Splitter()
    for i in range(20000):
        s.feed(f"\r{i:>6}/20000")
    assert s._text == " 19999/20000"


def test_bytes_cut_inside_a_character_are_not_garbled():
    streams, bar = Streams(), "\r 50%|█████".encode()
    assert streams.feed("a", bar[:-1]) == [Progress(" 50%|████")]
    assert streams.feed("a", bar[-1:]) == [Progress(" 50%|█████")]
    assert streams.flush_all() == [("a", Progress(" 50%|█████", done=True))]


def test_text_written_in_pieces_goes_on_where_the_last_piece_ended():
    s = Splitter()
    assert s.feed("ab") + s.feed("cd") + s.feed("e\n") == [Line("abcde")]
    assert s.feed("\r12345") + s.feed("6") + s.feed("\rXY") + s.feed("Z\n") == [
        Progress("12345"), Progress("123456"), Progress("XY3456"), Progress("XYZ456", done=True)]


def test_each_stream_decodes_its_own_bytes_and_replaces_what_is_no_utf8():
    streams = Streams()
    assert streams.feed("a", b"x\xc3") == [] and streams.feed("b", b"y\xc3") == []
    assert streams.feed("a", b"\xa9\n") == [Line("x\u00e9")]  # the other stream's half character is its own
    assert streams.feed("b", b"\xff\n") == [Line("y\ufffd\ufffd")]
    assert streams.feed("b", b"ab\xc3") == []
    assert streams.flush("b") == [Line("ab\ufffd")]  # the half character at its end: replaced, not lost
    assert streams.flush("b") == [] and streams.flush("never fed") == []


def test_flush_all_ends_every_stream_in_the_order_of_the_keys_repr():
    streams = Streams()
    for key in (10, 9, ("out", 0)):
        streams.feed(key, f"{key}")
    assert streams.flush_all() == [(("out", 0), Line("('out', 0)")), (10, Line("10")), (9, Line("9"))]


def test_a_log_renders_each_bar_as_its_final_state():
    log = "start\n" + "".join(TQDM) + "\r   \rcleared\n" + "\r 1/2\r 2/2"
    assert rendered_lines(log) == ["start", "100%|##########| 3/3 [00:00<00:00, 9.9it/s]", "cleared", " 2/2"]


def test_a_view_without_progress_gets_each_bar_once_as_a_line():
    class Plain:
        def __init__(self):
            self.lines = []

        def line(self, rank, text):
            self.lines.append((rank, text))

    view = Plain()
    for event in [Line("a"), Progress("1/2"), Progress("2/2", done=True), Progress("", done=True)]:
        deliver(view, 1, event)
    assert view.lines == [(1, "a"), (1, "2/2")]


# ---------------------------------------------------------------------------------------------- the record
def test_the_board_keeps_one_line_per_bar_and_its_final_state():
    board = record.Board(1)
    board.line(0, "start")
    board.progress(0, "1/3", False)
    board.progress(0, "2/3", False)
    assert list(board.ranks[0].lines) == ["start", "2/3"]
    board.progress(0, "3/3", True)
    board.line(0, "after")
    board.progress(0, "bar two", False)
    board.progress(0, "", True)  # it cleared itself
    assert list(board.ranks[0].lines) == ["start", "3/3", "after"] and board.ranks[0].count == 3
    assert "3/3" in record.pane_html(board.ranks[0].lines, board.ranks[0].count)


def test_the_record_from_complete_logs_shows_a_bar_as_one_line():
    board = record.Board(1)
    board.finish(record.Outcome("done", wall_s=1.0, logs={0: "start\n" + "".join(TQDM) + "done\n"}))
    text, page = record.record_text(board), record.record_html(board)
    assert "\r" not in text and "\r" not in page
    assert "3 lines ---" in text and text.count("3/3") == 1 and "0/3" not in text and "0/3" not in page


# ---------------------------------------------------------------------------------------------- the sources
class Recorder:
    def __init__(self):
        self.calls = []

    def line(self, rank, text):
        self.calls.append(("line", rank, text))

    def progress(self, rank, text, done):
        self.calls.append(("progress", rank, text, done))

    def metric(self, rank, row):
        pass

    def close(self):
        self.calls.append(("close",))


def test_the_launch_watcher_shows_a_bar_while_the_rank_runs(tmp_path):
    (tmp_path / "logs" / "attempt0").mkdir(parents=True)
    out = tmp_path / "logs" / "attempt0" / "rank1.out"
    view = Recorder()
    w = Watcher(tmp_path, "rid", 2, view, timeout=None)
    out.write_text("hello\n" + TQDM[0])
    w.poll()
    with open(out, "a") as f:
        f.write(TQDM[1])
    w.poll()
    assert view.calls == [("line", 1, "hello"), ("progress", 1, TQDM[0][1:], False),
                          ("progress", 1, TQDM[1][1:], False)]
    with open(out, "a") as f:
        f.write(TQDM[2])
    w.finish()  # the rank ended mid-bar
    assert view.calls[-2:] == [("progress", 1, TQDM[2][1:], True), ("close",)]


def test_a_slurm_job_tail_shows_a_bar_while_the_job_runs(tmp_path):
    folder = RunFolder(tmp_path)
    (tmp_path / "logs" / "attempt0").mkdir(parents=True)
    out = tmp_path / "logs" / "attempt0" / "rank0.out"
    out.write_text("epoch 1\n" + TQDM[0] + TQDM[1])
    tail = JobTail(folder, tmp_path / "batch.out")
    assert tail.lines() == [(0, Line("epoch 1")), (0, Progress(TQDM[1][1:]))]
    with open(out, "a") as f:
        f.write(TQDM[3] + "\n")
    assert tail.lines(final=True) == [(0, Progress(TQDM[3][1:], done=True))]


def test_a_warm_rank_sends_a_bar_at_each_redraw_not_at_its_end():
    joiner = proto.LineJoiner()
    assert joiner.feed(7, "a\n" + TQDM[0]) == ["a"]
    assert joiner.take_redrawn(7) == TQDM[0]
    assert joiner.feed(7, "no bar yet") == [] and joiner.take_redrawn(7) == ""
    assert joiner.drain() == [(7, "no bar yet")]


def test_a_warm_rank_bar_on_stderr_is_shown_once_as_progress_not_as_stderr(monkeypatch):
    out, errs = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", errs)
    sink = OutputSink(req=5, late={})
    sink.write(0, 5, "stdout", "start\n")
    for part in TQDM[:3]:
        sink.write(0, 5, "stderr", part)
    sink.write(0, 5, "stderr", "real warning\n")  # ends the bar's line, as it would on a terminal
    sink.write(1, 5, "stderr", "a warning\n")
    sink.finish()
    assert out.getvalue() == "[rank0] start\n[rank0]  67%|######6   | 2/3 [00:00<00:00, 9.9it/s]real warning\n"
    assert errs.getvalue() == "[rank1] a warning\n"


def test_a_slurm_job_tail_reads_each_file_from_where_it_stopped(tmp_path):
    """Issue #60: the batch script's output first, then each rank's; metrics rows only once whole."""
    folder = RunFolder(tmp_path)
    (tmp_path / "logs" / "attempt0").mkdir(parents=True)
    (tmp_path / "metrics").mkdir()
    batch = tmp_path / "batch.out"
    tail = JobTail(folder, batch)
    assert tail.lines() == [] and tail.lines(final=True) == [] and tail.metrics() == []
    batch.write_text("srun: started\n")
    (tmp_path / "logs" / "attempt0" / "rank1.err").write_text("warn\n")
    assert tail.lines() == [(None, Line("srun: started")), (1, Line("warn"))]
    assert tail.lines() == []  # nothing new: nothing again
    with open(batch, "a") as f:
        f.write("srun: done")
    assert tail.lines() == [] and tail.lines(final=True) == [(None, Line("srun: done"))]
    with open(tmp_path / "logs" / "attempt0" / "rank1.err", "a") as f:
        f.write("last words")
    assert tail.lines() == [] and tail.lines(final=True) == [(1, Line("last words"))]
    rows = tmp_path / "metrics" / "rank1.jsonl"
    rows.write_text('{"loss": 1.5}\nnot json\n{"loss": 0.')
    assert tail.metrics() == [(1, {"loss": 1.5})]
    with open(rows, "a") as f:
        f.write('5}\n')
    assert tail.metrics() == [(1, {"loss": 0.5})]


def test_a_tail_hands_on_whole_lines_and_the_rest_once_flushed(tmp_path):
    from distlab.slurm.tail import Tail

    path, tail = tmp_path / "f", Tail()
    assert tail.read(path) == [] and tail.flush(path) == []
    path.write_bytes(b"a\nb")
    assert tail.read(path) == ["a"] and tail.read(path) == []
    with open(path, "ab") as f:
        f.write(b"c\n\xff\nd")
    assert tail.read(path) == ["bc", "\ufffd"]
    assert tail.flush(path) == ["d"] and tail.flush(path) == []
    assert tail.read(path) == []  # read up to its end: nothing is read twice
    with open(path, "ab") as f:
        f.write(b"e\n\xfe")
    assert tail.read(path) == ["e"] and tail.flush(path) == ["\ufffd"]  # a broken last byte, replaced
