"""teach/answers.py: what every exercise's self-check does first (no process)."""
import pytest

from distlab.teach import answers


def test_none_is_no_answer_yet_and_says_what_to_put_there(capsys):
    assert answers.unanswered(None, "a number of bytes") is True
    assert capsys.readouterr().out == "No answer yet: replace None with a number of bytes.\n"


@pytest.mark.parametrize("given", [0, "", [], False, "None"])
def test_anything_else_is_an_answer_and_nothing_is_printed(capsys, given):
    assert answers.unanswered(given, "x") is False
    assert capsys.readouterr().out == ""


def test_close_is_within_the_relative_tolerance_on_both_sides():
    """Relative to the right answer's size, also when it is negative."""
    assert answers.close(101, 100, rel=0.01, floor=0.0) and answers.close(99, 100, rel=0.01, floor=0.0)
    assert not answers.close(101.01, 100, rel=0.01, floor=0.0) and not answers.close(98.99, 100, rel=0.01, floor=0.0)
    assert answers.close(-101, -100, rel=0.01, floor=0.0) and not answers.close(101, -100, rel=0.01, floor=0.0)
    assert answers.close(100.0999, 100, rel=1e-3, floor=0.0) and not answers.close(100.1001, 100, rel=1e-3, floor=0.0)


def test_close_takes_a_number_written_as_text_and_refuses_what_is_no_number():
    assert answers.close("100.5", 100, rel=0.01, floor=0.0) and answers.close(" 1e2 ", 100, rel=0.01, floor=0.0)
    assert not answers.close("abc", 100, rel=0.01, floor=0.0) and not answers.close(None, 100, rel=0.01, floor=0.0)
    assert not answers.close([100], 100, rel=0.01, floor=0.0) and not answers.close({}, 100, rel=0.01, floor=0.0)


def test_the_floor_is_an_absolute_slack_where_the_right_answer_is_zero():
    assert answers.close(0, 0, rel=0.5, floor=0.0) and not answers.close(1e-15, 0, rel=0.5, floor=0.0)
    assert answers.close(1e-9, 0, rel=0.5, floor=1e-9) and answers.close(-1e-9, 0, rel=0.5, floor=1e-9)
    assert not answers.close(2e-9, 0, rel=0.5, floor=1e-9)
    assert answers.close(102, 100, rel=0.01, floor=1.0) and not answers.close(102.01, 100, rel=0.01, floor=1.0)
