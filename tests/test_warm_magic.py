"""The ``%%ranks`` magic and the end of ranks a notebook replaced, in this process (issue #60: distlab.warm.magic
and distlab.warm.replaced mutated; starts no process): fake ranks and shells stand in for warm ranks and a kernel.
Real ranks in a real kernel: tests/test_ranks_kernel.py."""
import re
import sys
import weakref
from types import SimpleNamespace

import IPython
import pytest
from IPython.core.error import UsageError

from distlab.warm import magic, replaced
from distlab.warm.errors import RanksStoppedError
from distlab.warm.ranks import DEFAULT

USAGE = "usage: %%ranks [RANK,RANK,...] [--timeout SECONDS] [--push NAME,NAME,...]"


# --- the magic's line ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line, expected", [
    ("0,,2,", ([0, 2], DEFAULT, [])),
    ("0, --timeout NONE", ([0], None, [])),
    ("--push ,x,,y, --timeout=1e1", (None, 10.0, ["x", "y"])),
    ("  ", (None, DEFAULT, [])),
])
def test_a_line_s_loose_spellings(line, expected):
    assert magic.parse_line(line) == expected


@pytest.mark.parametrize("line, message", [
    ("--timeout", "%%ranks: --timeout needs a number of seconds. "),
    ("0 --push", "%%ranks: --push needs names. "),
    ("0 1", "%%ranks: unexpected '1'. "),
    ("--push ,", "%%ranks: --push takes variable names written x,y (no spaces), not ','. "),
    ("--push x,1y", "%%ranks: --push takes variable names written x,y (no spaces), not 'x,1y'. "),
    ("--timeout soon", "%%ranks: --timeout must be a number of seconds or None, not 'soon'. "),
    ("0,a", "%%ranks: ranks are written 0,2 (no spaces), not '0,a'. "),
])
def test_each_wrong_line_is_one_usage_error(line, message):
    with pytest.raises(UsageError) as wrong:
        magic.parse_line(line)
    assert str(wrong.value) == message + USAGE
    assert wrong.value.__cause__ is None and (wrong.value.__context__ is None or wrong.value.__suppress_context__)


def test_the_helpers_raise_the_error_they_are_given():
    class Wrong(Exception):
        pass

    for helper, text in ((magic._names, "1x"), (magic._number, "x"), (magic._ranks, "x")):
        with pytest.raises(Wrong):
            helper(text, Wrong)
    assert magic._names("a,b", Wrong) == ["a", "b"] and magic._number("none", Wrong) is None
    assert magic._ranks(" 3 ,4", Wrong) == [3, 4] and magic._number("2", Wrong) == 2.0


def test_a_missing_variable_is_named_first_of_those_missing():
    with pytest.raises(UsageError) as missing:
        magic.pushed_values(["a", "c", "d"], {"a": 1})
    assert str(missing.value) == ("%%ranks --push: the notebook has no variable 'c' (run the cell that sets it "
                                  "first).")
    assert magic.pushed_values(["b", "a"], {"a": 1, "b": 2, "c": 3}) == {"b": 2, "a": 1}


# --- the magic, on fake ranks ----------------------------------------------------------------------------------

class FakeRanks:
    def __init__(self, answer):
        self.answer, self.calls = answer, []

    def push(self, values, ranks=None, timeout=DEFAULT):
        self.calls.append(("push", values, ranks, timeout))

    def _exec(self, *args, **kwargs):
        self.calls.append(("exec", args, kwargs))
        return self.answer


@pytest.fixture
def on(monkeypatch):
    """Run the magic on FakeRanks answering ``answer``, in ``shell`` (None: outside IPython)."""
    def setup(answer, shell=None):
        ranks = FakeRanks(answer)
        monkeypatch.setattr(magic, "current", lambda: ranks)
        monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
        return ranks

    return setup


def test_a_cell_runs_on_the_selected_ranks_with_its_limit_and_its_number(on):
    shell = SimpleNamespace(user_ns={"x": 1, "y": 2}, execution_count=8)
    ranks = on({0: 5, 2: None}, shell)
    assert magic.ranks_magic("0,2 --timeout 3 --push x", "x + 1\n") == {0: 5}
    assert ranks.calls == [("push", {"x": 1}, [0, 2], 3.0),
                           ("exec", ("\nx + 1\n", "Cell In[7]", "Cell In[7]", [0, 2], 3.0), {"live": True})]


def test_outside_ipython_the_cell_is_number_zero_and_pushes_from_nothing(on):
    ranks = on({0: None, 1: None})
    assert magic.ranks_magic("", "pass") is None  # no rank has a value
    assert ranks.calls == [("exec", ("\npass", "Cell In[0]", "Cell In[0]", None, DEFAULT), {"live": True})]
    with pytest.raises(UsageError, match="no variable 'x'"):
        magic.ranks_magic("--push x", "pass")


def test_the_values_keep_the_type_the_ranks_answered_with(on):
    class Answer(dict):
        pass

    on(Answer({1: 0, 0: None}))
    shown = magic.ranks_magic("", "1")
    assert type(shown) is Answer and shown == {1: 0}


def test_a_rank_s_exception_is_raised_as_it_came(on):
    error = ZeroDivisionError("on rank 1")
    on(error)
    with pytest.raises(ZeroDivisionError) as raised:
        magic.ranks_magic("", "1 / 0")
    assert raised.value is error


def test_stopped_ranks_are_one_line_not_a_traceback(monkeypatch):
    def stopped():
        raise RanksStoppedError("the ranks are closed")

    monkeypatch.setattr(magic, "current", stopped)
    with pytest.raises(UsageError) as said:
        magic.ranks_magic("", "1")
    assert str(said.value) == "the ranks are closed" and said.value.__suppress_context__


def test_the_magic_is_registered_as_a_cell_magic_named_ranks():
    seen = []
    magic.register(SimpleNamespace(register_magic_function=lambda *args: seen.append(args)))
    assert seen == [(magic.ranks_magic, "cell", "ranks")]


# --- ranks a notebook replaced ----------------------------------------------------------------------------------

class Ranks:
    def __init__(self, state="running"):
        self.state, self.closed = state, 0

    def close(self):
        self.closed += 1


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(replaced, "_named", weakref.WeakSet())
    monkeypatch.setattr(replaced, "_watched", weakref.WeakSet())


@pytest.mark.parametrize("name, history", [
    ("_", True), ("__", True), ("___", True), ("____", False), ("_7", True), ("_i", True), ("_iii", True),
    ("_iiii", False), ("_i7", True), ("In", True), ("Out", True), ("_ih", True), ("_oh", True), ("_dh", True),
    ("ranks", False), ("_x", False), ("Out2", False), ("_7a", False), ("", False),
])
def test_ipython_s_history_names(name, history):
    assert bool(replaced.HISTORY_NAME.fullmatch(name)) is history


def test_let_go_are_the_ranks_named_after_the_last_cell_and_named_no_more(fresh):
    a, b, c, closed = Ranks(), Ranks(), Ranks(), Ranks("closed")
    every = [a, b, c, closed]
    ns = {"ranks": a, "other": b, "_": c, "gone": closed}
    assert replaced._let_go(ns, lambda: every) == []  # not named before this cell: nothing to let go
    assert set(replaced._named) == {a, b}  # c only under a history name, a closed Ranks never
    ns = {"ranks": b, "_": a, "Out": {1: c}}
    dropped = replaced._let_go(ns, lambda: every)
    assert [ref() for ref in dropped] == [a] and all(isinstance(ref, weakref.ref) for ref in dropped)
    assert set(replaced._named) == {b}


def test_a_ranks_named_again_is_not_let_go(fresh):
    a = Ranks()
    replaced._let_go({"ranks": a}, lambda: [a])
    assert replaced._let_go({"again": a}, lambda: [a]) == [] and set(replaced._named) == {a}
    assert [r() for r in replaced._let_go({}, lambda: [a])] == [a] and set(replaced._named) == set()


def fake_shell():
    return SimpleNamespace(user_ns={}, user_ns_hidden={}, history_manager=SimpleNamespace(output_hist={}),
                           displayhook=SimpleNamespace(), last_execution_result=SimpleNamespace())


HELD = object()  # the Ranks asked about


def holders(monkeypatch, *found):
    """gc.get_referrers as held_only_by_history asks it: ``found`` hold HELD, nothing holds anything else."""
    monkeypatch.setattr(replaced.gc, "get_referrers", lambda obj: list(found) if obj is HELD else [])


def test_only_ipython_s_history_may_hold_a_replaced_ranks(monkeypatch):
    from IPython.core.displayhook import DisplayHook
    from IPython.core.interactiveshell import ExecutionResult

    shell = fake_shell()
    history = [shell.user_ns, shell.user_ns_hidden, shell.history_manager.output_hist, vars(shell.displayhook),
               vars(shell.last_execution_result), DisplayHook.__new__(DisplayHook),
               ExecutionResult.__new__(ExecutionResult)]
    holders(monkeypatch, *history)
    assert replaced.held_only_by_history(HELD, shell)
    for other in ({}, [], SimpleNamespace(), dict(shell.user_ns), sys._getframe()):
        holders(monkeypatch, *history, other)
        assert not replaced.held_only_by_history(HELD, shell)
    del shell.user_ns_hidden
    holders(monkeypatch, {})
    assert not replaced.held_only_by_history(HELD, shell)
    holders(monkeypatch, shell.user_ns)
    assert replaced.held_only_by_history(HELD, shell)


def test_its_own_frame_does_not_count(monkeypatch):
    """A frame becomes an object (a referrer) under a debugger, a profiler or coverage."""
    monkeypatch.setattr(replaced.gc, "get_referrers", lambda obj: [sys._getframe(1)])
    assert replaced.held_only_by_history(Ranks(), fake_shell())
    assert not replaced._is_own_frame(sys._getframe()) and not replaced._is_own_frame({})


def test_a_dict_is_history_only_when_it_is_the_display_hook_s_or_the_last_result_s():
    shell = fake_shell()
    assert replaced._is_history_dict(vars(shell.displayhook), shell)
    assert replaced._is_history_dict(vars(shell.last_execution_result), shell)
    assert not replaced._is_history_dict({}, shell) and not replaced._is_history_dict([], shell)
    del shell.last_execution_result
    assert not replaced._is_history_dict({}, shell) and replaced._is_history_dict(vars(shell.displayhook), shell)
    shell.displayhook = object()  # no __dict__
    assert not replaced._is_history_dict({}, shell)


def test_end_replaced_closes_only_what_history_alone_holds(fresh, monkeypatch):
    a, b = Ranks(), Ranks()
    shell = fake_shell()
    shell.user_ns.update(ranks=a, other=b)
    replaced.end_replaced(shell, lambda: [a, b])
    shell.user_ns.clear()
    shell.user_ns["_"] = a
    monkeypatch.setattr(replaced, "held_only_by_history", lambda ranks, seen: ranks is a and seen is shell)
    replaced.end_replaced(shell, lambda: [a, b], result=object())
    assert (a.closed, b.closed) == (1, 0)


def test_a_ranks_gone_before_it_is_looked_at_is_skipped(fresh, monkeypatch):
    shell = fake_shell()
    monkeypatch.setattr(replaced, "_let_go", lambda ns, open_ranks: [lambda: None])
    monkeypatch.setattr(replaced, "held_only_by_history", lambda ranks, shell: pytest.fail("looked at None"))
    replaced.end_replaced(shell, list)


def test_watch_registers_once_per_shell_and_only_in_ipython(fresh, monkeypatch):
    registered = []

    class Shell:
        events = SimpleNamespace(register=lambda event, f: registered.append((event, f)))

    shell = Shell()
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    replaced.watch(list)
    replaced.watch(list)
    assert [event for event, _ in registered] == ["post_run_cell"] and shell in replaced._watched
    callback = registered[0][1]
    assert callback.func is replaced.end_replaced and callback.args == (shell, list)
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    replaced.watch(list)
    monkeypatch.delitem(sys.modules, "IPython")
    replaced.watch(list)
    assert len(registered) == 1


def test_in_a_real_shell_a_replaced_ranks_shown_by_a_cell_ends(fresh):
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    every: weakref.WeakSet = weakref.WeakSet()

    def make():
        ranks = Ranks()
        every.add(ranks)
        return ranks

    try:
        replaced.watch(lambda: list(every))
        ip.user_ns["make"] = make
        ip.run_cell("ranks = make()", store_history=True)
        ip.run_cell("ranks", store_history=True)  # shown: Out, _ and the display hook hold it
        first = ip.user_ns["ranks"]
        ip.run_cell("ranks = make()", store_history=True)
        assert first.closed == 1
        ip.run_cell("kept = ranks", store_history=True)
        ip.run_cell("ranks = make()", store_history=True)
        ip.run_cell("keep = [ranks]", store_history=True)
        ip.run_cell("ranks = make()", store_history=True)
        second, third = ip.user_ns["kept"], ip.user_ns["keep"][0]
        assert (first.closed, second.closed, third.closed) == (1, 0, 0)  # a name or a list holds them
    finally:
        InteractiveShell.clear_instance()


def test_an_error_from_the_ranks_in_a_shell_shows_no_frame_of_the_magic(monkeypatch, capsys):
    """The magic's own frame is hidden (__tracebackhide__): what failed below it shows, the magic does not."""
    from IPython.core.interactiveshell import InteractiveShell

    class Refusing(FakeRanks):
        def _exec(self, *args, **kwargs):
            raise ValueError("refused by the ranks")

    ip = InteractiveShell.instance()
    try:
        monkeypatch.setattr(magic, "current", lambda: Refusing(None))
        monkeypatch.setattr(IPython, "get_ipython", lambda: ip)
        magic.register(ip)
        assert not ip.run_cell("%%ranks\n1 / 0\n").success
        out = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # IPython's colours
        assert "refused by the ranks" in out and not re.search(r"in \w*ranks_magic", out), out
    finally:
        InteractiveShell.clear_instance()
