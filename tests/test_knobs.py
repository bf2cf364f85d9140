"""distlab.teach.knobs without processes: the state machine that keeps at most one run going and
no queue of stale runs, and the runner's threads driven by fake controls and a fake measurement."""
from __future__ import annotations

import threading
import time

import pytest

from distlab.teach import knobs as K


def test_a_move_with_nothing_going_starts_a_run():
    state = K.Latest()
    assert state.moved({"world": 3}) is True
    assert state.take() == {"world": 3}
    assert state.finished() is True and state.going is False


def test_moves_during_a_run_leave_only_the_newest_waiting():
    state = K.Latest()
    assert state.moved({"world": 2})
    state.take()
    assert state.moved({"world": 3}) is False  # going: no second run
    assert state.moved({"world": 4}) is False
    assert state.finished() is False  # the run that ends is stale: its picture is dropped
    assert state.take() == {"world": 4}  # one run, of the newest settings only
    assert state.take() is None
    assert state.finished() is True and state.superseded == 1


def test_the_settings_are_copied_when_moved():
    state, settings = K.Latest(), {"world": 2}
    state.moved(settings)
    settings["world"] = 4
    assert state.take() == {"world": 2}


class FakeControl:
    def __init__(self, value):
        self.value = value


def slow_lab(release: threading.Event, seen: list):
    def measure(world=2):
        seen.append(world)
        release.wait(5)
        return f"picture of {world}"
    return measure


def lab_with(measure, **controls):
    lab = K.Knobs(measure, controls, settle_s=0.01)
    lab.widgets = {name: FakeControl(lab.values[name]) for name in controls}
    lab.status = FakeControl("")
    return lab


def test_quick_moves_run_once_more_with_the_newest_never_two_at_once(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.update_display",
                        lambda obj, display_id: shown.append(obj))
    release, seen = threading.Event(), []
    lab = lab_with(slow_lab(release, seen), world=(2, 8))
    lab.widgets["world"].value = 3
    lab.moved()
    deadline = time.time() + 5
    while seen != [3] and time.time() < deadline:  # the run of 3 is going (held by release)
        time.sleep(0.01)
    for world in (4, 5, 6):
        lab.widgets["world"].value = world
        lab.moved()
    release.set()
    deadline = time.time() + 5
    while lab.shown != {"world": 6} and time.time() < deadline:
        time.sleep(0.01)
    assert lab.shown == {"world": 6} and shown == ["picture of 6"]
    assert seen == [3, 6]  # 4 and 5 never ran: superseded while 3 was going
    assert lab.peak == 1 and lab.runs == 2 and lab.going == 0


def test_a_failing_run_says_so_and_the_next_move_runs_again(monkeypatch):
    monkeypatch.setattr("IPython.display.update_display", lambda obj, display_id: None)

    def measure(world=2):
        if world == 3:
            raise ValueError("no such world")
        return world

    lab = lab_with(measure, world=(2, 4))
    for world in (3, 4):
        lab.widgets["world"].value = world
        lab.moved()
        deadline = time.time() + 5
        while lab.state.going and time.time() < deadline:
            time.sleep(0.01)
        if world == 3:
            assert "ValueError: no such world" in lab.status.value
    assert lab.shown == {"world": 4} and lab.error is None


def test_every_knob_needs_a_default():
    def measure(world, shuffle=True):
        return world

    with pytest.raises(TypeError, match="needs a default for each knob: world"):
        K.Knobs(measure, {"world": (2, 4), "shuffle": True})


def test_the_controls_start_at_the_defaults_and_send_on_release():
    made, status = K.make_controls({"world": (2, 8), "shuffle": True, "op": ["a", "b"]},
                                   {"world": 4, "shuffle": False, "op": "b"})
    assert {n: w.value for n, w in made.items()} == {"world": 4, "shuffle": False, "op": "b"}
    assert made["world"].continuous_update is False
    assert made["world"].description == "world"


def test_a_figure_becomes_a_png_and_leaves_pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    shown = K.as_displayable(fig)
    assert shown.format == "png" and shown.data[:4] == b"\x89PNG"
    assert not plt.fignum_exists(fig.number)
    assert K.as_displayable("text") == "text"


def test_without_a_live_frontend_no_widget_is_made_and_the_defaults_are_shown(monkeypatch, capsys):
    """nbclient and the book build: no widget (so no widget state saved, no widget JavaScript in
    the book), the picture of the default settings, and one line naming them."""
    from ipywidgets.widgets import widget

    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    before = set(widget._instances)

    def measure(world=4, shuffle=True):
        return f"picture of world={world}, shuffle={shuffle}"

    lab = K.knobs(measure, world=(2, 8), shuffle=True)
    assert set(widget._instances) == before and lab.widgets == {}
    out = capsys.readouterr().out
    assert "measure(world=4, shuffle=True); in JupyterLab, controls change these" in out
    assert "picture of world=4, shuffle=True" in out
    assert lab.shown == {"world": 4, "shuffle": True} and lab.runs == 1
