"""Warm ranks without processes: the protocol's pure parts, the magic's line, the error messages."""
import io
import pickle
import sys
import traceback
from types import SimpleNamespace

import psutil
import pytest
from fake_kernel import run_cells
from IPython.core.error import UsageError

import distlab
from distlab.capture.collect import capture
from distlab.warm import errors as err
from distlab.warm import proto
from distlab.warm.group import Conversation, OutputSink
from distlab.warm.magic import parse_line
from distlab.warm.ranks import DEFAULT, build_error, definition_unit


def run_compiled(source, filename="Cell In[7]"):
    ns = {}
    body, last = proto.compile_cell(source, filename)
    exec(body, ns)
    return ns, (eval(last, ns) if last is not None else None)


def test_compile_cell_returns_the_last_expression_and_keeps_assignments():
    ns, value = run_compiled("a = 2\nb = a * 3\nb + 1")
    assert (ns["b"], value) == (6, 7)
    ns, value = run_compiled("a = 2\nb = a * 3")
    assert (ns["b"], value) == (6, None)
    assert run_compiled("")[1] is None


def test_a_cell_traceback_names_the_cell_and_its_own_line():
    source = proto.cell_source("x = 1\ny = 2\nraise ValueError('on line 4')\n")  # line 1 is `%%ranks`
    with pytest.raises(ValueError) as info:
        run_compiled(source, "Cell In[12]")
    frame = traceback.extract_tb(info.value.__traceback__)[-1]
    assert (frame.filename, frame.lineno) == ("Cell In[12]", 4)


def test_syntax_errors_name_the_cell_line():
    with pytest.raises(SyntaxError) as info:
        proto.compile_cell(proto.cell_source("x = 1\ny = (\n"), "Cell In[3]")
    assert info.value.filename == "Cell In[3]" and info.value.lineno == 3


def test_locate_finds_a_definition_inside_its_cell():
    lines = ["import torch\n", "\n", "def f(x):\n", "    return x\n", "\n", "def g():\n", "    pass\n"]
    assert proto.locate("def f(x):\n    return x\n", lines) == 3
    assert proto.locate("def g():\n    pass\n", lines) == 6
    assert proto.locate("def h():\n    pass\n", lines) is None
    assert proto.locate("", lines) is None


def test_definition_unit_compiles_at_the_cells_line_numbers():
    ns = run_cells("import math\n\n\ndef helper(x):\n    y = x + 1\n    return math.sqrt(-y)\n")
    (unit,) = [definition_unit(text, ns) for text in capture(ns["helper"]).definitions]
    code, filename, cell = unit
    assert filename.startswith("/tmp/ipykernel_0/") and cell.startswith("import math")
    scope = {"math": __import__("math")}
    exec(compile(code, filename, "exec"), scope)
    with pytest.raises(ValueError) as info:
        scope["helper"](1)
    assert traceback.extract_tb(info.value.__traceback__)[-1].lineno == 6


def test_definition_unit_without_a_known_origin_keeps_plain_source():
    code, filename, cell = definition_unit("def lost():\n    return 1\n", {})
    assert (code, filename, cell) == ("def lost():\n    return 1\n", "<distlab: lost>", "def lost():\n    return 1\n")


def test_captured_head_puts_plain_imports_first_then_constants():
    ns = run_cells("import os\nfrom json import dumps\nN = 3\n\ndef f():\n    return os.sep, dumps, N\n")
    head = proto.captured_head(capture(ns["f"]))
    assert head == "import os\nfrom json import dumps\nN = 3\n"
    assert proto.defined_name("class Model:\n    pass\n") == "Model"
    assert proto.defined_name("x = 1\n") is None


def test_rank_values_show_one_rank_per_line_and_stay_a_dict():
    values = proto.RankValues({1: "b\nc", 0: 2.0})
    assert repr(values) == "[rank0] 2.0\n[rank1] 'b\\nc'"
    assert repr(proto.RankValues({0: proto.Shown("line1\nline2")})) == "[rank0] line1\n[rank0] line2"
    assert values[0] == 2.0 and dict(values) == {0: 2.0, 1: "b\nc"}
    from IPython.lib.pretty import pretty

    assert pretty(values) == repr(values)


def test_shown_stands_for_a_value_by_its_repr_and_pickles():
    shown = pickle.loads(pickle.dumps(proto.Shown("<Model on rank 1>")))
    assert repr(shown) == "<Model on rank 1>" and shown == proto.Shown("<Model on rank 1>")
    assert shown != proto.Shown("other")


def test_a_value_the_kernel_cannot_load_spoils_only_itself():
    missing = pickle.dumps(proto.Shown("x")).replace(b"distlab.warm.proto", b"distlab.nowhere___")
    shown = proto.load_value(missing)
    assert isinstance(shown, proto.Shown) and repr(shown).startswith("<a value this kernel cannot load: ")
    assert "ModuleNotFoundError" in repr(shown)
    assert proto.load_value(pickle.dumps([1, 2.0])) == [1, 2.0]


def test_line_joiner_keeps_unfinished_lines_per_key():
    joiner = proto.LineJoiner()
    assert joiner.feed("a", "one\ntw") == ["one"]
    assert joiner.feed("b", "x") == []
    assert joiner.feed("a", "o\nthree\n") == ["two", "three"]
    assert joiner.drain() == [("b", "x")]
    assert joiner.drain() == []


DUMP = """Thread 0x00007f01 (most recent call first):
  File "/venv/lib/python3.11/threading.py", line 331 in wait
  File "/src/distlab/worker.py", line 88 in _exit_with_parent
  File "/venv/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007f02 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "Cell In[5]", line 3 in <module>
  File "/src/distlab/warm/loop.py", line 120 in _exec
  File "<string>", line 1 in <module>
"""


def test_clean_stack_keeps_the_users_frames_only():
    from distlab.warm.group import rank_stack

    text = rank_stack(DUMP)
    assert text == ('File "torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n'
                    'File "Cell In[5]", line 3 in <module>')


FORKED_DUMP = """Thread 0x00007f03 (most recent call first):
  File "/src/distlab/warm/watch.py", line 44 in _watch
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007f04 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "Cell In[3]", line 2 in <module>
  File "/src/distlab/warm/loop.py", line 120 in _exec
  File "/src/distlab/warm/forked.py", line 37 in run_warm_rank
  File "/usr/lib/python3.11/multiprocessing/process.py", line 108 in run
  File "/usr/lib/python3.11/multiprocessing/process.py", line 314 in _bootstrap
  File "/usr/lib/python3.11/multiprocessing/spawn.py", line 135 in _main
  File "/usr/lib/python3.11/multiprocessing/forkserver.py", line 313 in _serve_one
  File "/usr/lib/python3.11/multiprocessing/forkserver.py", line 274 in main
"""


SPARE_FRAMES = """  File "/src/distlab/forkserver/spare.py", line 44 in become_rank
  File "/src/distlab/forkserver/spare.py", line 71 in wait_then_run
  File "/src/distlab/forkserver/server.py", line 201 in _in_child
  File "/src/distlab/forkserver/server.py", line 167 in add_spare
  File "/src/distlab/forkserver/server.py", line 112 in serve
  File "/src/distlab/forkserver/server.py", line 230 in main
  File "<string>", line 1 in <module>
"""


SPARE_DUMP = FORKED_DUMP.split('  File "/usr/lib/python3.11/multiprocessing/forkserver')[0] + SPARE_FRAMES


@pytest.mark.parametrize("dump", [FORKED_DUMP, SPARE_DUMP], ids=["forked-on-request", "spare"])
def test_clean_stack_of_a_forked_rank_drops_the_fork_and_the_interrupt_watch(dump):
    from distlab.warm.group import rank_stack

    assert rank_stack(dump) == (
        'File "torch/distributed/distributed_c10d.py", line 3252 in all_reduce\nFile "Cell In[3]", line 2 in <module>')


def test_user_traceback_drops_runtime_frames():
    def runtime_frame():
        exec(compile("\n\n1 / 0\n", "Cell In[2]", "exec"), {})

    try:
        runtime_frame()
    except ZeroDivisionError as e:
        text = proto.user_traceback(e, ("test_ranks_pure.py",))
    assert text == ('Traceback (most recent call last):\n  File "Cell In[2]", line 3, in <module>\n'
                    'ZeroDivisionError: division by zero\n')


@pytest.mark.parametrize("line, expected", [
    ("", (None, DEFAULT, [])),
    ("0,2", ([0, 2], DEFAULT, [])),
    ("1 --timeout 2.5", ([1], 2.5, [])),
    ("--timeout=4", (None, 4.0, [])),
    ("--timeout None", (None, None, [])),
    ("--push x,y_2 0,1", ([0, 1], DEFAULT, ["x", "y_2"])),
    ("--push=x --timeout 3 --push y", (None, 3.0, ["x", "y"])),
])
def test_magic_line(line, expected):
    assert parse_line(line) == expected


@pytest.mark.parametrize("line, words", [
    ("0, 2", "unexpected '2'"),
    ("a,b", "ranks are written 0,2"),
    ("--timeout", "--timeout needs a number"),
    ("--timeout soon", "must be a number of seconds or None, not 'soon'"),
    ("--push", "--push needs names"),
    ("--push x,1y", "variable names written x,y"),
])
def test_magic_line_errors_say_how_to_write_it(line, words):
    with pytest.raises(UsageError, match=words) as info:
        parse_line(line)
    assert "usage: %%ranks [RANK,RANK,...] [--timeout SECONDS] [--push NAME,NAME,...]" in str(info.value)


def no_new_children(before):
    """No process started since ``before``, except the forkserver's spare ranks (forked in the
    background whenever the server is idle)."""
    new = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    return [p for p in new if _name(p) != "distlab-spare"] == []


def _name(p: psutil.Process) -> str | None:
    try:
        return p.name()
    except psutil.NoSuchProcess:
        return None


@pytest.mark.parametrize("kwargs, name", [
    ({"nprocs": 0}, "nprocs"), ({"nprocs": 2, "backend": "mpi"}, "backend"),
    ({"nprocs": 2, "backend": "nccl"}, "backend"), ({"nprocs": 2, "timeout": -1}, "timeout"),
])
def test_bad_arguments_fail_before_any_process_starts(kwargs, name):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(distlab.LaunchArgumentError) as info:
        distlab.Ranks(**kwargs)
    assert info.value.name == name and no_new_children(before)


def fake_conv(replies, ranks=(0, 1), reason=None):
    return SimpleNamespace(replies=replies, ranks=list(ranks), reason=reason)


def test_rank_raised_message_word_for_word():
    tb = 'Traceback (most recent call last):\n  File "Cell In[4]", line 3, in <module>\nValueError: boom\n'
    conv = fake_conv({1: ("error", 9, "ValueError", tb), 0: ("error", 9, "ValueError", tb)})
    e = build_error(conv, [1, 0], {}, "Cell In[4]", None, err.STATE_USABLE, True)
    assert isinstance(e, err.RankError) and (e.rank, e.name, e.usable) == (1, "ValueError", True)
    assert str(e) == (
        "distlab: rank 1 raised ValueError in Cell In[4] (rank 0 raised too).\n" + tb.rstrip() + "\n"
        "The ranks are still usable: the process group passed a health check and every variable is kept.")


def test_blocked_after_failure_message_shows_where_the_others_were():
    conv = fake_conv({1: ("error", 3, "KeyError", "KeyError: 'x'\n")})
    state = err.restarted("rank 0 stayed blocked after rank 1 failed", ["Cell In[2]", "ranks.push(x)"])
    e = build_error(conv, [1], {0: 'File "Cell In[6]", line 4 in <module>'}, "Cell In[6]", None, state, False)
    assert str(e) == (
        "distlab: rank 1 raised KeyError in Cell In[6].\nKeyError: 'x'\n"
        "Ranks still running after that failure, and where they were:\n"
        '--- rank 0 ---\nFile "Cell In[6]", line 4 in <module>\n'
        "The process group could not be recovered (rank 0 stayed blocked after rank 1 failed), so the ranks were "
        "restarted: every variable on them is lost. To set them up again, re-run, in this order: Cell In[2], "
        "ranks.push(x).")
    assert err.restarted("rank 1 died", []).endswith("Nothing had been set up on them before this call.")


def test_died_message_word_for_word():
    conv = fake_conv({1: ("died", 2, -9, "last words")})
    state = err.restarted("rank 1 died", [])
    e = build_error(conv, [1], {}, "ranks.exec", None, state, False)
    assert str(e) == ("distlab: rank 1 died (exit code -9) in ranks.exec.\n"
                      "--- last lines of its log ---\nlast words\n" + state)


def test_timeout_message_word_for_word():
    conv = fake_conv({1: ("done", 5, None)}, reason="timeout")
    state = err.restarted("rank 0 did not come back", ["Cell In[2]"])
    e = build_error(conv, [], {0: "File \"Cell In[5]\", line 3 in <module>"}, "Cell In[5]", 3.0, state, False)
    assert isinstance(e, err.RanksTimeoutError) and set(e.stacks) == {0, 1}
    assert str(e) == (
        "distlab: Cell In[5] did not finish within timeout=3.0s on rank 0.\nWhere each rank was:\n"
        '--- rank 0 ---\nFile "Cell In[5]", line 3 in <module>\n--- rank 1 ---\n(finished this call)\n'
        "A rank waiting in a collective usually means another rank never called it.\n"
        "The process group could not be recovered (rank 0 did not come back), so the ranks were restarted: "
        "every variable on them is lost. To set them up again, re-run, in this order: Cell In[2].")


def test_interrupt_is_a_keyboard_interrupt_with_the_stacks():
    conv = fake_conv({}, ranks=(0, 1), reason="interrupt")
    e = build_error(conv, [], {0: "a", 1: "b"}, "ranks.exec", None, err.STATE_USABLE, True)
    assert isinstance(e, KeyboardInterrupt) and type(e) is err.RanksInterrupted
    assert str(e) == ("distlab: ranks.exec was interrupted on ranks 0, 1.\nWhere each rank was:\n"
                      "--- rank 0 ---\na\n--- rank 1 ---\nb\n" + err.STATE_USABLE)
    shown = e._render_traceback_()  # IPython shows these lines instead of distlab's frames
    assert shown[0] == "\x1b[0;31mKeyboardInterrupt: distlab: ranks.exec was interrupted on ranks 0, 1.\x1b[0m"
    assert shown[1:] == str(e).splitlines()[1:]


class FakeGroup:
    def __init__(self, n):
        self.conns = [None] * n


def test_failures_put_a_lost_peer_after_the_root_cause():
    conv = Conversation(FakeGroup(3), 7, [0, 1, 2], {}, SimpleNamespace(raised=False))
    conv._record(0, ("error", 7, "RuntimeError", "RuntimeError: Connection closed by peer [127.0.0.1]:1"))
    conv._record(2, ("done", 7, None))
    conv._record(1, ("error", 7, "ValueError", "ValueError: the real cause"))
    assert conv.failures() == [1, 0]


def test_output_sink_prefixes_whole_lines_and_keeps_other_calls_output_apart(monkeypatch):
    out, errs, late = io.StringIO(), io.StringIO(), {}
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", errs)
    sink = OutputSink(req=5, late=late)
    sink.write(1, 5, "stdout", "hel")
    sink.write(0, 5, "stdout", "a\nb\n")
    sink.write(1, 5, "stdout", "lo\npart")
    sink.write(0, 4, "stdout", "from an earlier call\n")
    sink.write(1, 5, "stderr", "warn\n")
    sink.finish()
    assert out.getvalue() == "[rank0] a\n[rank0] b\n[rank1] hello\n[rank1] part\n"
    assert errs.getvalue() == "[rank1] warn\n"
    assert late == {0: "from an earlier call\n"}


class CountingStream(io.StringIO):
    flushes = 0

    def flush(self):
        self.flushes += 1


def test_output_sink_flushes_in_batches_not_per_line(monkeypatch):
    """A kernel's flush waits for its I/O thread: once per line made a chatty cell 8x slower."""
    out = CountingStream()
    monkeypatch.setattr(sys, "stdout", out)
    sink = OutputSink(req=1, late={})
    for i in range(1000):
        sink.write(0, 1, "stdout", f"{i}\n")
        sink.tick()
    sink.finish()
    assert out.getvalue().count("\n") == 1000 and out.getvalue().endswith("[rank0] 999\n")
    assert 1 <= out.flushes < 50


def test_state_messages_word_for_word():
    assert err.NO_RANKS == "distlab: no warm ranks are running. Start them first, e.g. `ranks = distlab.Ranks(2)`."
    assert err.CLOSED == ("distlab: these ranks are closed. Start new ones with distlab.Ranks(...), "
                          "or call ranks.restart().")
    assert err.STOPPED.format(why="rank 1 died") == (
        "distlab: these ranks were stopped (rank 1 died). Run ranks.restart() for fresh ranks "
        "(every variable on the ranks is lost).")
    assert err.START_FAILED.format(rank=1, problem="exited with code 1", detail="ImportError: x") == (
        "distlab: rank 1 could not start (exited with code 1).\nImportError: x\nNothing is left running.")


def test_a_name_error_for_a_name_the_notebook_defines_says_where_it_is_missing():
    tb = ('Traceback (most recent call last):\n  File "Cell In[4]", line 1, in <module>\n'
          "NameError: name 'mine' is not defined\n")
    hint = err.not_on_the_ranks("NameError", tb, {"mine": print})
    assert "`mine` is defined in this notebook, not on the ranks" in hint and "%%ranks" in hint and "ranks.run" in hint
    assert err.not_on_the_ranks("NameError", tb, {}) == ""  # a typo: the notebook has no such name either
    assert err.not_on_the_ranks("ValueError", tb, {"mine": print}) == ""


# --- what the mutation run (bench/mutation.py) found untested in distlab.warm.proto -------------------
def test_captured_head_and_shipped_names_read_a_constants_name_before_its_first_equals_sign():
    cap = SimpleNamespace(imports=["from json import dumps", "import os"], values={"device": "cuda:0", "lr": 0.1},
                          constants=["N = 3", "rank = 'a = b'", "label = 'world_size = 2'"])
    assert proto.captured_head(cap) == "import os\nfrom json import dumps\nN = 3\nlabel = 'world_size = 2'\n"
    assert proto.shipped_rank_names(cap) == ["rank", "device"]
    assert proto.shipped_rank_names(SimpleNamespace(constants=["N = 3"], values={"lr": 0.1})) == []


def test_defined_name_of_an_empty_or_unparsable_source_is_none():
    assert proto.defined_name("") is None
    assert proto.defined_name("def broken(:\n") is None
    assert proto.defined_name("async def fetch():\n    pass\n") == "fetch"


def test_locate_compares_lines_whole_trailing_spaces_and_all():
    lines = ["x = 1  \n", "A = X\n", "y = 2\n"]
    assert proto.locate("x = 1\n", lines) is None
    assert proto.locate("x = 1  \nA = X\n", lines) == 1
    assert proto.locate("A = X\n", lines) == 2


def test_prefix_lines_cuts_at_newlines_only():
    assert proto.prefix_lines(3, "a b\tc\nd") == "[rank3] a b\tc\n[rank3] d"
    assert proto.prefix_lines(0, "") == "[rank0] "


class _Callable:
    def __call__(self):
        return 1


def _a_function():
    return 1


@pytest.mark.parametrize("value, shown", [
    (_a_function, "<only shown: T, defined on the rank, stays there>"),
    (lambda: 1, "<only shown: T, defined on the rank, stays there>"),
    (_Callable, "<only shown: T, defined on the rank, stays there>"),  # a class
    (staticmethod(_a_function), "<only shown: T, defined on the rank, stays there>"),  # __func__, no __code__
    (_Callable(), "T"),  # callable, but neither a class nor a function
    (len, "T"),
    (SimpleNamespace(__code__=1, __func__=2), "T"),  # not callable
    (3, "T"),
])
def test_shown_text_says_a_function_or_class_stays_on_the_rank(value, shown):
    assert proto.shown_text(value, "T") == shown


def test_calling_a_shown_value_says_where_to_call_it():
    with pytest.raises(TypeError) as info:
        proto.Shown("<function f>")(1, key=2)
    assert str(info.value) == ("<function f> is what a rank showed of its value, not the value: it cannot be "
                               "called here. Call it on the ranks (a %%ranks cell, or ranks.run of a function "
                               "that calls it).")


def test_user_traceback_keeps_every_user_frame_and_every_line_of_the_exception():
    scope = {}
    exec(compile("def inner():\n    raise ValueError('deep')\n\ndef outer():\n    inner()\n", "Cell In[4]", "exec"),
         scope)
    try:
        scope["outer"]()
    except ValueError as e:
        e.add_note("a note")
        text = proto.user_traceback(e, ("test_ranks_pure.py",))
        bare = proto.user_traceback(e, ("test_ranks_pure.py", "Cell In[4]"))
    assert text == ('Traceback (most recent call last):\n  File "Cell In[4]", line 5, in outer\n'
                    '  File "Cell In[4]", line 2, in inner\nValueError: deep\na note\n')
    assert bare == "ValueError: deep\na note\n"  # no frame of the user's: no traceback header


def test_line_joiner_hands_over_only_redrawn_lines_and_drains_in_the_order_of_the_keys_repr():
    joiner = proto.LineJoiner()
    assert joiner.take_redrawn("never fed") == ""
    for key, text in [(10, "b"), (9, "a"), ("x", "c"), ((1, 2), "d")]:
        joiner.feed(key, text)
    assert joiner.drain() == [("x", "c"), ((1, 2), "d"), (10, "b"), (9, "a")]  # "'x'" < "(1, 2)" < "10" < "9"


# --- what the mutation run found untested in distlab.warm.errors ---------------------------------------------
def test_stacks_keep_their_indentation_and_lose_their_trailing_newlines_in_rank_order():
    stacks = {1: '  File "Cell In[2]", line 1 in <module>\n\n', 0: "  (finished this call)\n"}
    assert err.format_stacks(stacks) == ('--- rank 0 ---\n  (finished this call)\n'
                                         '--- rank 1 ---\n  File "Cell In[2]", line 1 in <module>')


def test_a_name_error_that_names_no_variable_gets_no_hint():
    traceback = "NameError: cannot access free variable 'x' where it is not associated with a value"
    assert err.not_on_the_ranks("NameError", traceback, {"x": 1}) == ""


# --- what the mutation run found untested in distlab.view.stacks ---------------------------------------------
TWO_THREADS = """Current thread 0x00007f05 (most recent call first):
  File "Cell In[5]", line 3 in <module>
  File "/src/distlab/warm/loop.py", line 120 in _exec

Thread 0x00007f06 (most recent call first):
  File "/home/me/loader.py", line 9 in fill
Thread 0x00007f07 (most recent call first):
  File "/src/distlab/worker.py", line 88 in _exit_with_parent
"""


def test_clean_stack_keeps_each_users_thread_apart_and_drops_only_the_watchdogs():
    from distlab.view.stacks import clean_stack

    assert clean_stack(TWO_THREADS, ("/distlab/",)) == (
        'Current thread 0x00007f05 (most recent call first):\n  File "Cell In[5]", line 3 in <module>\n\n'
        'Thread 0x00007f06 (most recent call first):\n  File "/home/me/loader.py", line 9 in fill')
    assert clean_stack(TWO_THREADS, ("/distlab/",), compact=True) == (
        'File "Cell In[5]", line 3 in <module>\n\nFile "/home/me/loader.py", line 9 in fill')
