"""The text view's progress bar: rank 0's step/total rows drive one tqdm bar on stderr."""
import io

from distlab.view.display import TextView


def test_lines_are_prefixed_with_their_rank():
    stream = io.StringIO()
    view = TextView(2, stream=stream)
    view.line(1, "hello")
    view.line(0, "")
    assert stream.getvalue() == "[rank1] hello\n[rank0] \n"


def test_progress_bar_follows_rank0_steps_and_shows_its_numbers(capsys):
    view = TextView(2, stream=io.StringIO())
    view.metric(1, {"rank": 1, "step": 5, "total": 10})  # other ranks do not drive the bar
    view.metric(0, {"rank": 0, "loss": 1.0})  # a row without step/total is not progress
    view.metric(0, {"rank": 0, "step": 9})
    assert capsys.readouterr().err == ""
    view.metric(0, {"rank": 0, "time": 1.5, "step": 3, "total": 10, "loss": 0.5})
    view.metric(0, {"rank": 0, "time": 2.5, "step": 7, "total": 10, "loss": 0.25})
    view.close()
    final = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert final.startswith("rank0:  70%") and " 7/10 " in final
    assert final.endswith(", loss=0.25]") and "time=" not in final and "rank=" not in final


def test_close_without_progress_writes_nothing(capsys):
    view = TextView(1, stream=io.StringIO())
    view.close()
    assert capsys.readouterr().err == ""
