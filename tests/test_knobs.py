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


def test_a_new_lab_has_nothing_going_or_waiting():
    state = K.Latest()
    assert state.going is False and state.take() is None and state.superseded == 0
    assert state.finished() is True


def test_every_run_that_ends_stale_is_counted():
    state = K.Latest()
    state.moved({"world": 2})
    for world in (3, 4):
        state.take()
        state.moved({"world": world})   # arrives while the run goes: the run ends stale
        assert state.finished() is False
    assert state.superseded == 2 and state.take() == {"world": 4}


def test_a_knob_without_a_default_is_named_with_every_other_one():
    def measure(world, shuffle, seed=0):
        pass

    with pytest.raises(TypeError) as info:
        K.defaults(measure, ["world", "shuffle", "seed", "missing"])
    assert str(info.value) == "measure needs a default for each knob: world, shuffle, missing"
    assert K.defaults(measure, ["seed"]) == {"seed": 0}


def test_the_settings_are_copied_when_moved():
    state, settings = K.Latest(), {"world": 2}
    state.moved(settings)
    settings["world"] = 4
    assert state.take() == {"world": 2}


class FakeControl:
    def __init__(self, value):
        self.value = value


class Later:
    """The kernel's event loop, played by the test: ``schedule`` keeps callbacks, ``run`` runs them here."""

    def __init__(self):
        self.pending = []

    def __call__(self, delay_s, fn):
        self.pending.append(fn)

    def run(self):
        while self.pending:
            self.pending.pop(0)()


def lab_on(later, measure, **controls):
    lab = K.Knobs(measure, controls, settle_s=0.01, schedule=later)
    lab.widgets = {name: FakeControl(lab.values[name]) for name in controls}
    lab.status, lab.shown = FakeControl(""), dict(lab.values)  # as knobs() leaves it
    return lab


def test_moves_before_the_run_starts_become_one_run_of_the_newest(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.update_display", lambda obj, display_id: shown.append(obj))
    later, seen = Later(), []
    lab = lab_on(later, lambda world=2: seen.append(world) or f"picture of {world}", world=(2, 8))
    for world in (3, 4, 5):  # read by the kernel one after the other, before its loop runs the lab
        lab.widgets["world"].value = world
        lab.moved()
    assert len(later.pending) == 1 and seen == []
    later.run()
    assert seen == [5] and shown == ["picture of 5"] and lab.shown == {"world": 5}
    assert lab.peak == 1 and lab.runs == 1 and lab.going == 0


def test_a_moved_knob_runs_on_the_thread_of_the_kernels_loop_never_on_its_own(monkeypatch):
    """pyplot is not thread-safe and the learner's cells use it: a knob's run (chapters 5 and 10 draw
    with pyplot) goes on the kernel's main thread, as a cell does, not on a thread of its own."""
    monkeypatch.setattr("IPython.display.update_display", lambda obj, display_id: None)
    later, threads = Later(), []
    lab = lab_on(later, lambda world=2: threads.append(threading.current_thread()), world=(2, 8))
    lab.widgets["world"].value = 3
    lab.moved()
    later.run()
    assert threads == [threading.main_thread()] and lab.threads == ["MainThread"]


def test_the_kernels_loop_runs_the_moves_and_without_a_kernel_they_run_at_once(monkeypatch):
    class Loop:
        """A tornado loop: only add_callback may be called from another thread (a subshell's)."""

        def __init__(self):
            self.woken, self.timers = [], []

        def add_callback(self, fn, *args):
            self.woken.append(threading.current_thread())
            fn(*args)  # the loop's thread, when it wakes

        def call_later(self, delay_s, fn):
            self.timers.append((delay_s, fn))

    loop = Loop()
    shell = type("Shell", (), {"kernel": type("Kernel", (), {"io_loop": loop})()})()
    monkeypatch.setattr("IPython.get_ipython", lambda: shell)
    schedule = K.kernel_later()
    subshell = threading.Thread(target=schedule, args=(0.2, print))
    subshell.start()
    subshell.join()
    assert loop.woken == [subshell] and loop.timers == [(0.2, print)]
    monkeypatch.setattr("IPython.get_ipython", lambda: None)
    ran = []
    K.kernel_later()(0.2, lambda: ran.append(1))
    assert ran == [1]


def test_kernel_interrupt_raises_inside_a_knobs_run_though_an_idle_kernel_ignores_it():
    import os
    import signal

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as an idle ipykernel has it
    try:
        with pytest.raises(KeyboardInterrupt), K.interruptible():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_an_interrupted_run_says_so_once_and_runs_nothing_after_it(monkeypatch):
    monkeypatch.setattr("IPython.display.update_display", lambda obj, display_id: None)
    later, seen = Later(), []

    def measure(world=2):
        seen.append(world)
        if world == 3:
            lab.widgets["world"].value = 4  # a move that arrived meanwhile: the interrupt drops it too
            lab.moved()
            raise KeyboardInterrupt
        return world

    lab = lab_on(later, measure, world=(2, 8))
    lab.widgets["world"].value = 3
    lab.moved()
    later.run()
    assert seen == [3] and isinstance(lab.error, KeyboardInterrupt)
    assert lab.status.value == "world=3 interrupted; the picture is still of world=2"
    lab.widgets["world"].value = 5
    lab.moved()
    later.run()
    assert seen == [3, 5] and lab.shown == {"world": 5} and lab.error is None


def test_what_a_moved_knobs_run_shows_lands_in_the_cells_output_for_runs(monkeypatch):
    """After a move the cell shows the latest run's view and run folder, not the first run's: the
    run's displays go to the lab's output for runs, whatever message the kernel handles then."""
    from distlab.view.display import IPythonDisplay

    drawn = []
    monkeypatch.setattr("IPython.display.display", lambda obj, display_id, raw: drawn.append(("new", display_id)))
    monkeypatch.setattr("IPython.display.update_display",
                        lambda obj, display_id, raw=False: drawn.append(("update", display_id)))
    later = Later()

    def measure(world=2):
        view = IPythonDisplay()
        view.show({"text/plain": "running"}, "view-of-this-run")
        view.replace({"text/plain": f"record, run folder {world}"}, "view-of-this-run")
        return world

    lab = lab_on(later, measure, world=(2, 8))
    lab.runs_display_id = "runs"
    lab.widgets["world"].value = 3
    lab.moved()
    later.run()
    assert drawn[:2] == [("update", "runs"), ("update", "runs")], drawn
    IPythonDisplay().show({"text/plain": "another cell"}, "elsewhere")  # outside a knob's run: as always
    assert drawn[-1] == ("new", "elsewhere")


def test_a_failing_run_says_so_and_the_next_move_runs_again(monkeypatch):
    monkeypatch.setattr("IPython.display.update_display", lambda obj, display_id: None)

    def measure(world=2):
        if world == 3:
            raise ValueError("no such world")
        return world

    later = Later()
    lab = lab_on(later, measure, world=(2, 4))
    for world in (3, 4):
        lab.widgets["world"].value = world
        lab.moved()
        later.run()
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
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    before = set(live_widgets())

    def measure(world=4, shuffle=True):
        return f"picture of world={world}, shuffle={shuffle}"

    lab = K.knobs(measure, world=(2, 8), shuffle=True)
    assert set(live_widgets()) == before and lab.widgets == {}
    out = capsys.readouterr().out
    assert "measure(world=4, shuffle=True); in JupyterLab, controls change these" in out
    assert "picture of world=4, shuffle=True" in out
    assert lab.shown == {"world": 4, "shuffle": True} and lab.runs == 1


def live_widgets() -> dict:
    """Every widget made so far: ipywidgets 8 keeps them in ``widget._instances``, 7 (Colab's 7.7)
    in ``Widget.widgets``."""
    from ipywidgets.widgets import widget

    return getattr(widget, "_instances", None) or widget.Widget.widgets


def test_where_the_controls_cannot_be_made_one_line_says_why_and_the_picture_is_static(monkeypatch, capsys):
    import sys

    monkeypatch.setenv("JPY_SESSION_NAME", "lab.ipynb")
    monkeypatch.setitem(sys.modules, "ipykernel", sys.modules.get("ipykernel") or object())

    def no_widgets(controls, values):
        raise ImportError("No module named 'ipywidgets'")

    monkeypatch.setattr(K, "make_controls", no_widgets)

    def measure(world=4):
        return f"picture of world={world}"

    lab = K.knobs(measure, world=(2, 8))
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("measure(world=4): a static picture: ipywidgets is not installed (No module named "
                      "'ipywidgets'); `pip install ipywidgets` gives the controls")
    assert "picture of world=4" in out[1:] and lab.widgets == {} and lab.runs_display_id is None


def knob_labs() -> dict:
    """chapter -> {name: ast of a function a cell passes to ``knobs(...)``}, from the book's sources."""
    import ast
    import json
    from pathlib import Path

    labs = {}
    for path in sorted(Path(__file__).resolve().parents[1].glob("book/*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] != "code" or "knobs(" not in source:
                continue
            code = "\n".join(line for line in source.splitlines() if not line.startswith("%"))
            tree = ast.parse(code)
            passed = {node.args[0].id for node in ast.walk(tree) if isinstance(node, ast.Call)
                      and getattr(node.func, "id", "") == "knobs" and node.args}
            labs.update({(path.stem, f.name): f for f in tree.body
                         if isinstance(f, ast.FunctionDef) and f.name in passed})
    return labs


def test_every_knob_labs_run_has_a_time_limit():
    """A knob's run blocks the kernel until it ends (chapter 14's link lab had no limit): each
    ``distlab.spawn``/``distlab.Ranks`` a knob lab starts is given a ``timeout``."""
    import ast

    labs = knob_labs()
    assert {chapter for chapter, _ in labs} >= {"05_collectives", "10_performance_lab", "14_network"}, labs
    for (chapter, name), lab in labs.items():
        launches = [node for node in ast.walk(lab) if isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute) and node.func.attr in ("spawn", "Ranks", "launch")]
        assert launches, f"{chapter}: {name} starts no ranks"
        for call in launches:
            assert any(k.arg == "timeout" for k in call.keywords), \
                f"{chapter}: {name}'s {call.func.attr}(...) on line {call.lineno} has no timeout"
