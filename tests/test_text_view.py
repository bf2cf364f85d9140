"""The text view: ``[rankN]`` lines, and progress bars as one line per bar that updates in place."""
import io

from distlab.view.display import TextView


class FakeShower:
    """What a kernel's display machinery would be sent: outputs by display id."""

    def __init__(self):
        self.outputs, self.calls = {}, []

    def show(self, bundle, display_id):
        assert display_id not in self.outputs
        self.outputs[display_id] = bundle["text/plain"]
        self.calls.append(("show", display_id))

    def replace(self, bundle, display_id):
        assert display_id in self.outputs
        self.outputs[display_id] = bundle["text/plain"]
        self.calls.append(("replace", display_id))


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_lines_are_prefixed_with_their_rank():
    stream = io.StringIO()
    view = TextView(2, stream=stream)
    view.line(1, "hello")
    view.line(0, "")
    assert stream.getvalue() == "[rank1] hello\n[rank0] \n"


def test_reported_steps_are_one_output_per_rank_updated_in_place_never_on_stderr(capsys):
    shower, now = FakeShower(), [0.0]
    view = TextView(2, stream=io.StringIO(), shower=shower)
    view.bars.clock = lambda: now[0]
    view.metric(0, {"rank": 0, "loss": 1.0})  # a row without step/total is not progress
    view.metric(0, {"rank": 0, "step": 9})
    assert shower.outputs == {}
    view.metric(0, {"rank": 0, "time": 1.5, "step": 3, "total": 10, "loss": 0.5})
    view.metric(1, {"rank": 1, "time": 1.5, "step": 2, "total": 10})
    now[0] = 1.0
    view.metric(0, {"rank": 0, "time": 2.5, "step": 7, "total": 10, "loss": 0.25})
    view.close()
    assert capsys.readouterr().err == ""  # stderr is what a notebook colours as an error
    rank0, rank1 = shower.outputs.values()
    assert rank0.startswith("[rank0]  70%|") and " 7/10 " in rank0, rank0
    assert rank0.endswith(", loss=0.25]") and "time=" not in rank0 and "rank=" not in rank0
    assert rank1.startswith("[rank1]  20%|") and " 2/10 " in rank1, rank1


def test_a_rank_bar_is_one_output_that_moves_and_keeps_its_final_state():
    shower, now = FakeShower(), [0.0]
    stream = io.StringIO()
    view = TextView(2, stream=stream, shower=shower)
    view.bars.clock = lambda: now[0]
    view.line(0, "before")
    view.progress(0, "10%", False)
    now[0] = 0.05
    view.progress(0, "20%", False)  # sooner than MIN_UPDATE_S: held back
    now[0] = 0.5
    view.progress(0, "30%", False)
    (bar_id,) = shower.outputs
    assert shower.outputs[bar_id] == "[rank0] 30%" and len(shower.calls) == 2
    view.progress(0, "100%", True)
    view.line(0, "after")
    view.progress(0, "again 5%", False)  # a second bar of the same rank: an output of its own
    view.close()
    assert list(shower.outputs.values()) == ["[rank0] 100%", "[rank0] again 5%"]
    assert stream.getvalue() == "[rank0] before\n[rank0] after\n"


def test_without_a_kernel_a_bar_prints_its_final_state_once():
    stream = io.StringIO()
    view = TextView(2, stream=stream)
    view.progress(1, " 10%|#", False)
    view.progress(1, " 50%|#####", False)
    view.line(0, "hello")
    view.progress(1, "100%|##########", True)
    view.metric(0, {"rank": 0, "time": 0.0, "step": 1, "total": 4})
    view.metric(0, {"rank": 0, "time": 1.0, "step": 4, "total": 4})
    view.close()
    lines = stream.getvalue().splitlines()
    assert lines[:2] == ["[rank0] hello", "[rank1] 100%|##########"], lines
    assert len(lines) == 3 and lines[2].startswith("[rank0] 100%|") and " 4/4 " in lines[2]
    assert "\r" not in stream.getvalue()


def test_on_a_terminal_the_bar_stays_on_the_bottom_line_under_new_lines():
    stream = Tty()
    view = TextView(1, stream=stream)
    view.progress(0, "10%", False)
    view.line(0, "hello")
    view.progress(0, "20%", False)
    view.progress(0, "100%", True)
    shown = stream.getvalue()
    assert shown == ("[rank0] 10%" "\r" + " " * 11 + "\r" "[rank0] hello\n" "[rank0] 10%"
                     "\r" + " " * 11 + "\r" "[rank0] 20%" "\r" + " " * 11 + "\r" "[rank0] 100%\n")


def test_close_without_progress_writes_nothing(capsys):
    stream = io.StringIO()
    view = TextView(1, stream=stream)
    view.close()
    assert capsys.readouterr().err == "" and stream.getvalue() == ""


# --- what the mutation run (bench/mutation.py) found untested in distlab.view.bars ------------------------
def bars_with_a_kernel(start=0.0):
    from distlab.view.bars import ProgressLines

    shower, now = FakeShower(), [start]
    return ProgressLines(io.StringIO(), shower, clock=lambda: now[0]), shower, now


def test_a_held_back_state_is_the_one_a_bar_keeps_when_closed():
    bars, shower, now = bars_with_a_kernel()
    bars.show("a", "10%")
    now[0] = 0.05
    bars.show("a", "20%")  # sooner than MIN_UPDATE_S: held back
    assert list(shower.outputs.values()) == ["10%"]
    bars.close()
    assert list(shower.outputs.values()) == ["20%"] and len(shower.calls) == 2
    bars.show("b", "5%")
    bars.close()  # nothing held back: nothing sent again
    assert list(shower.outputs.values()) == ["20%", "5%"] and len(shower.calls) == 3


def test_a_bar_is_redrawn_from_exactly_min_update_s_after_its_last_draw():
    from distlab.view.bars import MIN_UPDATE_S

    bars, shower, now = bars_with_a_kernel()
    bars.show("a", "10%")
    now[0] = MIN_UPDATE_S
    bars.show("a", "20%")
    assert list(shower.outputs.values()) == ["20%"]
    bars, shower, now = bars_with_a_kernel(start=1000.0)  # a monotonic clock is far from 0
    bars.show("a", "10%")
    now[0] = 1000.05
    bars.show("a", "20%")
    assert list(shower.outputs.values()) == ["10%"]


def test_a_bar_that_is_done_at_once_is_shown_and_an_empty_one_is_not():
    bars, shower, _ = bars_with_a_kernel()
    bars.show("a", "100%", done=True)
    bars.show("b", "", done=True)
    assert list(shower.outputs.values()) == ["100%"]


def test_a_bar_done_at_once_in_a_text_front_end_prints_its_state_and_a_stream_may_lack_isatty():
    from distlab.view.bars import ProgressLines

    class Plain:  # a stream with no isatty
        def __init__(self):
            self.text = ""

        def write(self, text):
            self.text += text

        def flush(self):
            pass

    stream = Plain()
    bars = ProgressLines(stream)
    bars.show("a", "100%", done=True)
    bars.show("b", "50%")
    bars.close()
    assert stream.text == "100%\n50%\n"


def test_on_a_terminal_the_latest_bar_is_on_the_bottom_line_and_it_is_cleared_once():
    from distlab.view.bars import ProgressLines

    stream = Tty()
    bars = ProgressLines(stream)
    bars.show("a", "a1")
    bars.show("b", "b1")
    bars.show("a", "a2")  # moved: now the latest
    assert stream.getvalue().endswith("\r  \r" "a2")
    bars.show("a", "a3", done=True)
    bars.show("b", "b2", done=True)
    bars.write("after\n")  # no bar left on the bottom line: nothing to clear
    assert stream.getvalue().endswith("\r  \r" "a3\n" "b1" "\r  \r" "b2\n" "after\n")
    bars.show("c", "c1")
    bars.close()
    bars.write("later\n")  # closed: the bottom line was cleared once, not again
    assert stream.getvalue().endswith("after\n" "c1" "\r  \r" "c1\n" "later\n")
