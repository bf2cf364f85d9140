"""Worker tracebacks name the notebook cell each frame of the generated script came from. No processes."""
import runpy
import stat
import warnings

import pytest
from fake_kernel import run_cells

from distlab import worker
from distlab.capture import collect as capture
from distlab.capture import origins, script

CELLS = (
    "import functools\n",
    "class Net:\n"
    "    def __init__(self):\n"
    "        self.k = 2\n"
    "\n"
    "    def forward(self, x):\n"
    "        return x / (self.k - 2)\n",
    "def boom(rank):\n"
    "    net = Net()\n"
    "    # a comment line keeps the cell's and the script's line numbers apart\n"
    "    return net.forward(rank)\n",
)


def notebook():
    """The cells run as a kernel would, and IPython's names for them (``Cell In[2]`` ...)."""
    ns = run_cells(*CELLS)
    files = {ns["Net"].forward.__code__.co_filename: "Cell In[2]", ns["boom"].__code__.co_filename: "Cell In[3]"}
    return ns, files.get


def write_script(tmp_path, ns, label, monkeypatch=None):
    """The run's script (as ``worker.bootstrap`` records it when ``monkeypatch`` is given)."""
    path = tmp_path / "boom.py"
    if monkeypatch is not None:
        monkeypatch.setattr(worker, "_SCRIPT", str(path))
    path.write_text(script.render(capture.capture(ns["boom"]), args=(), nprocs=1, style="spawn",
                                  backend="gloo", filename=path.name))
    origins.save(path, ns, label)
    return path


def test_functions_and_methods_with_their_lines():
    source = ("import x\n\n@functools.cache\ndef f():\n    pass\n\n"
              "class C:\n    k = 1\n    def m(self):\n        return 1\n")
    assert origins.functions_in(source) == [("f", 3, 5), ("C.m", 9, 10)]


def test_a_line_of_the_script_maps_to_its_cell_and_line(tmp_path):
    ns, label = notebook()
    path = write_script(tmp_path, ns, label)
    lines = path.read_text().splitlines()
    divide = next(i for i, line in enumerate(lines, 1) if "self.k - 2" in line)
    call = next(i for i, line in enumerate(lines, 1) if "net.forward(rank)" in line)
    assert origins.place(str(path), divide) == "Cell In[2], line 6, in Net.forward"
    assert origins.place(str(path), call) == "Cell In[3], line 4, in boom"
    assert origins.place(str(path), 1) is None  # the script's header is nobody's cell


def test_a_worker_traceback_says_which_cell_and_function(tmp_path, monkeypatch):
    ns, label = notebook()
    path = write_script(tmp_path, ns, label, monkeypatch)
    try:
        runpy.run_path(str(path), run_name="not_main")["boom"](0)
    except ZeroDivisionError as e:
        text = worker.user_traceback(e)
    assert "    (from the notebook: Cell In[3], line 4, in boom)\n" in text
    assert text.index("in Net.forward)") > text.index("in boom)")  # in call order, under their own frames
    assert text.endswith("ZeroDivisionError: division by zero\n")


def test_a_warning_from_a_line_of_notebook_code_names_its_cell_and_nothing_else_changes(tmp_path):
    """#38 item 9: a rank's warning named the generated script's line."""
    ns, label = notebook()
    path = write_script(tmp_path, ns, label)
    lines = path.read_text().splitlines()
    call = next(i for i, line in enumerate(lines, 1) if "net.forward(rank)" in line)
    plain = warnings.formatwarning
    shown = origins.warning_formatter(plain, str(path))
    assert shown("careful", UserWarning, str(path), call) == (
        "Cell In[3], line 4, in boom: UserWarning: careful\n  return net.forward(rank)\n")
    assert shown("careful", UserWarning, str(path), 1) == plain("careful", UserWarning, str(path), 1)  # the header
    other = tmp_path / "other.py"  # another file, even with an origins file beside it, is left alone
    other.write_text(path.read_text())
    (tmp_path / "other.origins.json").write_text(origins.origins_path(path).read_text())
    assert shown("careful", UserWarning, str(other), call) == plain("careful", UserWarning, str(other), call)


def test_without_a_notebook_place_nothing_is_written(tmp_path):
    ns, _ = notebook()
    path = write_script(tmp_path, ns, lambda filename: None)  # e.g. plain python, no IPython
    assert not origins.origins_path(path).exists()
    assert origins.place(str(path), 3) is None


def test_the_scripts_own_call_into_distlab_is_left_out(tmp_path, monkeypatch):
    ns, label = notebook()
    path = write_script(tmp_path, ns, label, monkeypatch)
    monkeypatch.setenv("RANK", "0")  # as under distlab's launcher: main() runs boom for this rank
    try:
        runpy.run_path(str(path), run_name="__main__")
    except ZeroDivisionError as e:
        text = worker.user_traceback(e)
    assert "_distlab.main(" not in text and "in <module>" not in text
    assert f'File "{path}", line' in text and "(from the notebook: Cell In[3], line 4, in boom)" in text


def test_a_deep_recursion_still_collapses_its_repeated_frames(tmp_path, monkeypatch):
    ns = run_cells("def down(n):\n    return down(n + 1)\n")
    path = tmp_path / "down.py"
    monkeypatch.setattr(worker, "_SCRIPT", str(path))
    path.write_text(script.render(capture.capture(ns["down"]), args=(0,), nprocs=1, style="spawn", backend="gloo",
                                  filename=path.name))
    origins.save(path, ns, lambda filename: "Cell In[1]")
    try:
        runpy.run_path(str(path), run_name="not_main")["down"](0)
    except RecursionError as e:
        text = worker.user_traceback(e)
    assert "more times]" in text and len(text.splitlines()) < 20, text[:2000]
    assert "    (from the notebook: Cell In[1], line 2, in down)\n" in text


def test_a_namespace_that_cannot_be_read_never_stops_a_launch(tmp_path):
    class Odd(dict):
        def get(self, *args):
            raise RuntimeError("odd namespace")

    path = tmp_path / "f.py"
    path.write_text("def f(rank):\n    return rank\n")
    with pytest.warns(UserWarning, match="will not name notebook cells: RuntimeError"):
        origins.save(path, Odd(), lambda filename: "Cell In[1]")
    assert not origins.origins_path(path).exists()


def test_only_the_runs_own_script_is_annotated(tmp_path, monkeypatch):
    """Another user's ``x.origins.json`` beside some other ``x.py`` in a frame must not put their
    text into the learner's traceback."""
    ns, label = notebook()
    path = write_script(tmp_path, ns, label)
    monkeypatch.setattr(worker, "_SCRIPT", str(tmp_path / "the_runs_own_script.py"))
    try:
        runpy.run_path(str(path), run_name="not_main")["boom"](0)
    except ZeroDivisionError as e:
        text = worker.user_traceback(e)
    assert f'File "{path}", line' in text and "from the notebook" not in text


def test_the_origins_file_is_private(tmp_path):
    ns, label = notebook()
    path = write_script(tmp_path, ns, label)
    assert stat.S_IMODE(origins.origins_path(path).stat().st_mode) == 0o600


def test_only_a_script_inside_the_run_folder_may_name_notebook_cells(tmp_path):
    run = tmp_path / "runs" / "20260101-000000-x-abc"
    run.mkdir(parents=True)
    assert worker.script_with_origins(str(run / "x.py"), str(run)) == str(run / "x.py")
    assert worker.script_with_origins(str(tmp_path / "x.py"), str(run)) is None
    assert worker.script_with_origins(str(run) + "-other/x.py", str(run)) is None


@pytest.mark.slow
def test_run_script_of_a_file_outside_the_run_folder_ignores_an_origins_file_beside_it(tmp_path):
    """Before: the worker read ``train.origins.json`` beside the learner's own ``train.py`` (a folder
    others may write, such as a shared project folder) and printed its text in the traceback."""
    import json

    import distlab

    path = tmp_path / "train.py"
    path.write_text("def boom():\n    return 1 / 0\n\nboom()\n")
    origins.origins_path(path).write_text(json.dumps(
        [{"qualname": "boom", "first": 1, "last": 2, "where": "PLANTED BY SOMEONE", "line": 1}]))
    with pytest.raises(distlab.WorkerFailedError) as failed:
        distlab.run_script(path, 1, view=None, timeout=60)
    assert "ZeroDivisionError" in str(failed.value) and "PLANTED" not in str(failed.value)


def test_a_hanging_ranks_dump_names_the_cell_only_for_the_runs_own_script(tmp_path):
    import json

    from distlab.capture.origins import annotate_dump

    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    for folder in (run, elsewhere):
        folder.mkdir()
        (folder / "hang.origins.json").write_text(json.dumps(
            [{"qualname": "hang", "first": 5, "last": 9, "where": "Cell In[2]", "line": 3}]))
    dump = (f'  File "{run}/hang.py", line 7 in hang\n'
            f'  File "{elsewhere}/hang.py", line 7 in hang\n'
            f'  File "{run}/hang.py", line 30 in <module>')
    assert annotate_dump(dump, run).splitlines() == [
        f'  File "{run}/hang.py", line 7 in hang',
        "    (from the notebook: Cell In[2], line 5, in hang)",
        f'  File "{elsewhere}/hang.py", line 7 in hang',  # another folder's origins are not trusted
        f'  File "{run}/hang.py", line 30 in <module>']


# ------------------------------------------------------------------ mutation second pass (#60)

def test_a_cell_is_labelled_as_ipython_names_it_and_a_real_file_by_its_path(tmp_path, monkeypatch):
    """Without a notebook label the learner's traceback names no cell; a file on disk keeps its path."""
    import IPython

    class Compiler:
        def format_code_name(self, name):
            return ("Cell", "In[3]") if name == "<cell 3>" else None

    class Shell:
        compile = Compiler()

    real = tmp_path / "train.py"
    real.write_text("x = 1\n")
    monkeypatch.setattr(IPython, "get_ipython", lambda: Shell())
    assert origins.ipython_cell_label("<cell 3>") == "Cell In[3]"
    assert origins.ipython_cell_label(str(real)) == f'File "{real}"'  # IPython has no name for it
    assert origins.ipython_cell_label("<cell 4>") is None
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)  # plain python: no shell
    assert origins.ipython_cell_label("<cell 3>") is None
    assert origins.ipython_cell_label(str(real)) == f'File "{real}"'
    assert origins.ipython_cell_label(str(tmp_path / "gone.py")) is None


def test_static_and_class_methods_are_found_and_names_that_are_no_function_are_skipped():
    source = ("class C:\n"
              "    @staticmethod\n    def s():\n        pass\n\n"
              "    @classmethod\n    def c(cls):\n        pass\n\n"
              "def f():\n    pass\n\n"
              "def g():\n    pass\n\n"
              "class Gone:\n    def m(self):\n        pass\n")
    ns = run_cells(source)
    ns["g"] = 3  # rebound to something without code
    del ns["Gone"]  # a class the namespace no longer has
    found = origins.origins(source, ns, lambda filename: "Cell In[1]")
    assert [(o["qualname"], o["first"], o["line"]) for o in found] == [("C.s", 2, 2), ("C.c", 6, 6), ("f", 10, 10)]


def test_the_innermost_range_holding_a_line_names_it_from_its_first_line_on(tmp_path):
    import json

    path = tmp_path / "x.py"
    json_text = json.dumps([{"qualname": "Outer", "first": 1, "last": 10, "where": "Cell In[1]", "line": 1},
                            {"qualname": "Outer.inner", "first": 8, "last": 9, "where": "Cell In[2]", "line": 5}])
    origins.origins_path(path).write_text(json_text)
    assert origins.place(str(path), 8) == "Cell In[2], line 5, in Outer.inner"
    assert origins.place(str(path), 7) == "Cell In[1], line 7, in Outer"
    assert origins.place(str(path), 1) == "Cell In[1], line 1, in Outer"
    assert origins.place(str(path), 11) is None
    cache = {}
    origins.place(str(path), 8, cache)
    assert list(cache) == [origins.origins_path(path)]  # the caller's cache is the one filled


def test_each_origins_file_is_read_once_per_dump_traceback_and_warning_formatter(tmp_path, monkeypatch):
    """A stack of many frames of the script must not read its origins file once per frame."""
    import json
    import traceback

    path = tmp_path / "hang.py"
    origins.origins_path(path).write_text(json.dumps(
        [{"qualname": "hang", "first": 5, "last": 9, "where": "Cell In[2]", "line": 3}]))
    reads = []
    real_loads = json.loads
    monkeypatch.setattr(json, "loads", lambda text: reads.append(1) or real_loads(text))
    dump = f'  File "{path}", line 7 in hang\n  File "{path}", line 8 in hang'
    assert origins.annotate_dump(dump, tmp_path).count("from the notebook") == 2
    assert len(reads) == 1
    frames = [traceback.FrameSummary(str(path), n, "hang", line="pass") for n in (6, 7)]
    assert origins.format_frames(frames, str(path)).count("from the notebook") == 2
    assert len(reads) == 2
    shown = origins.warning_formatter(warnings.formatwarning, str(path))
    assert all(shown("w", UserWarning, str(path), n, "pass").startswith("Cell In[2]") for n in (6, 7))
    assert len(reads) == 3


def test_frames_without_a_script_format_exactly_as_pythons_own():
    import traceback

    frames = [traceback.FrameSummary("/a.py", 3, "f", line="x = 1"),
              traceback.FrameSummary("/b.py", 4, "g", line="y = 2")]
    assert origins.format_frames(frames) == "".join(traceback.format_list(frames))
    assert origins.format_frames(frames, "/a.py") == "".join(traceback.format_list(frames))  # no origins file


def test_a_warnings_own_line_text_is_used_and_passed_on(tmp_path):
    import json

    path = tmp_path / "w.py"
    path.write_text("\n" * 10)
    origins.origins_path(path).write_text(json.dumps(
        [{"qualname": "f", "first": 1, "last": 9, "where": "Cell In[2]", "line": 1}]))
    calls = []

    def plain(*args):
        calls.append(args)
        return "plain\n"

    shown = origins.warning_formatter(plain, str(path))
    assert shown("m", UserWarning, str(path), 2, "given code ") == (
        "Cell In[2], line 2, in f: UserWarning: m\n  given code\n")
    assert shown("m", UserWarning, str(path), 2, "") == "Cell In[2], line 2, in f: UserWarning: m\n"  # no source line
    assert shown("m", UserWarning, "/other.py", 2, "its line") == "plain\n"
    assert calls == [("m", UserWarning, "/other.py", 2, "its line")]


def test_a_launch_that_cannot_name_cells_warns_at_the_callers_line_and_the_file_is_readable(tmp_path):
    import inspect
    import json
    import re

    callers = []

    def label(filename):
        """Notes the line of save's caller (the frame outside save's own: under mutation testing,
        mutmut's trampoline stands between them), then fails as an odd namespace would."""
        frames = [f.frame for f in inspect.stack()]
        inside = next(i for i, f in enumerate(frames) if re.fullmatch(r"(x_)?save(__mutmut_\w+)?", f.f_code.co_name))
        callers.append((frames[inside + 1].f_code.co_filename, frames[inside + 1].f_lineno))
        raise RuntimeError("no label")

    path = tmp_path / "f.py"
    path.write_text("def f(rank):\n    return rank\n")
    with pytest.warns(UserWarning, match="will not name notebook cells") as caught:
        origins.save(path, run_cells("def f(rank):\n    return rank\n"), label)
    assert (caught[0].filename, caught[0].lineno) == callers[0]  # the line that called save, not save's own
    origins.save(path, run_cells("def f(rank):\n    return rank\n"), lambda filename: "Cell In[1]")
    found = [{"qualname": "f", "first": 1, "last": 2, "where": "Cell In[1]", "line": 1}]
    assert origins.origins_path(path).read_text() == json.dumps(found, indent=1)  # one field a line, for people
