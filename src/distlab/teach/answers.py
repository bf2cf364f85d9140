"""What every exercise's self-check does first: say that the answer is still ``None``, and compare a
number with the right one. One place, so that every chapter's checks say it in the same words."""
from __future__ import annotations


def unanswered(answer, what: str) -> bool:
    """Whether ``answer`` is still the exercise's ``None``; then say what to put there instead."""
    if answer is None:
        print(f"No answer yet: replace None with {what}.")
        return True
    return False


def close(answer, expected: float, *, rel: float, floor: float) -> bool:
    """Whether ``answer`` is a number (or a text of one) within ``rel`` of ``expected``, relatively, plus
    ``floor`` absolutely (the slack left where the right answer is 0); what is no number is not close."""
    try:
        return abs(float(answer) - expected) <= rel * abs(expected) + floor
    except (TypeError, ValueError):
        return False
