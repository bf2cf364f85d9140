"""push / scatter / pull without processes: names, per-rank splitting, pickling, the rank's answer."""
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from IPython.core.error import UsageError

import distlab
from distlab.warm import data, proto
from distlab.warm.magic import pushed_values


def test_push_takes_keywords_and_a_dict_for_names_that_clash_with_its_options():
    assert data.merge(None, {"x": 1}, "push") == {"x": 1}
    assert data.merge({"ranks": 4, "timeout": 2}, {"y": [1, 2]}, "push") == {"ranks": 4, "timeout": 2, "y": [1, 2]}


@pytest.mark.parametrize("names, words", [
    ([], "names no variable"),
    (["1x"], "is not a Python variable name"),
    (["class"], "is not a Python variable name"),
    (["rank"], "is predefined on every rank"),
    (["dist"], "is predefined on every rank"),
])
def test_names_a_rank_cannot_hold_are_refused_with_the_reason(names, words):
    with pytest.raises(distlab.LaunchArgumentError, match=words):
        data.check_names(names, "push")


def test_pull_may_read_the_predefined_names_and_says_how_it_is_called():
    assert data.check_names(["rank", "device"], "pull") == ["rank", "device"]
    with pytest.raises(distlab.LaunchArgumentError, match=r'For example ranks.pull\("x"\)'):
        data.check_names([], "pull")


def test_the_positional_argument_must_be_a_dict():
    with pytest.raises(distlab.LaunchArgumentError, match="must be a dict of names, not list"):
        data.merge([1, 2], {}, "push")


def test_scatter_gives_each_selected_rank_its_own_item_in_rank_order():
    assert data.split({"x": [10, 11], "y": ("a", "b")}, [0, 1]) == {0: {"x": 10, "y": "a"}, 1: {"x": 11, "y": "b"}}
    assert data.split({"x": [7, 9]}, [1, 3]) == {1: {"x": 7}, 3: {"x": 9}}
    assert data.split({"x": {0: "zero", 2: "two"}}, [0, 2]) == {0: {"x": "zero"}, 2: {"x": "two"}}


@pytest.mark.parametrize("value, words", [
    ([1, 2, 3], "one value per selected rank: 2 values, not 3"),
    ({0: 1, 5: 2}, r"one key per selected rank, exactly \[0, 1\]"),
    ({0: 1, "a": 2}, r"one key per selected rank, exactly \[0, 1\], not \['a', 0\]"),  # keys of mixed types
    (torch.arange(2), "needs a list .* not Tensor.*list\\(t.chunk\\(n\\)\\)"),
    (5, "not int"),
])
def test_scatter_refuses_what_is_not_one_value_per_rank(value, words):
    with pytest.raises(distlab.LaunchArgumentError, match=words) as info:
        data.split({"x": value}, [0, 1])
    assert info.value.name == "x"


def test_a_long_value_is_cut_in_the_message():
    with pytest.raises(distlab.LaunchArgumentError) as info:
        data.split({"x": list(range(1000))}, [0, 1])
    assert "..." in str(info.value) and "999" not in str(info.value)


def test_pack_round_trips_tensors_and_names_a_value_that_cannot_travel():
    values = {"t": torch.arange(4.0), "lr": 0.1}
    back = pickle.loads(data.pack(values))
    assert torch.equal(back["t"], values["t"]) and back["lr"] == 0.1
    with pytest.raises(distlab.CaptureError, match="the value of 'lock'.*cannot be pickled"):
        data.pack({"ok": 1, "lock": threading.Lock()})


def test_a_rank_answers_pull_with_one_value_or_a_tuple_and_names_what_is_missing():
    ns = {"x": 1, "y": [2]}
    assert proto.pulled(("x",), ns) == 1
    assert proto.pulled(("x", "y"), ns) == (1, [2])
    with pytest.raises(NameError, match="'z' is not defined on this rank"):
        proto.pulled(("x", "z"), ns)


def test_magic_push_reads_the_notebooks_variables_and_names_a_missing_one():
    assert pushed_values(["a"], {"a": 3, "b": 4}) == {"a": 3}
    with pytest.raises(UsageError, match="the notebook has no variable 'c'"):
        pushed_values(["a", "c"], {"a": 3})


def test_a_notebook_function_or_class_is_refused_before_it_reaches_a_rank():
    """It pickles in the kernel (``__main__.mine``) and failed on the rank with a bare
    AttributeError; a lambda already got this error."""
    ns = {"__name__": "__main__"}
    exec("def mine(r):\n    return r\nclass Box:\n    pass\n", ns)
    for name, value in (("mine", ns["mine"]), ("Box", ns["Box"])):
        with pytest.raises(distlab.CaptureError, match=rf"the value of '{name}'.*defined in the notebook.*%%ranks"):
            data.pack({name: value})
    assert pickle.loads(data.pack({"f": len, "n": 1})) == {"f": len, "n": 1}  # importable functions still travel


SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.mark.slow  # a fresh interpreter (the marker's meaning): also keeps it out of the mutation run's selection
def test_re_running_load_ext_prints_nothing(tmp_path):
    """A learner re-runs a chapter's first cell: IPython's "already loaded" note is noise."""
    program = ("from IPython.core.interactiveshell import InteractiveShell\n"
               "shell = InteractiveShell.instance()\n"
               "for _ in range(3):\n"
               "    shell.run_cell('%load_ext distlab')\n"
               "print('ranks magic:', 'ranks' in shell.magics_manager.magics['cell'])\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "DISTLAB_PRESTART": "0", "PYTHONPATH": str(SRC)})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ranks magic: True\n"


# --- what the mutation run (bench/mutation.py) found untested in distlab.warm.data, word for word -------------
def error_text(call, *args) -> str:
    with pytest.raises((distlab.LaunchArgumentError, distlab.CaptureError)) as info:
        call(*args)
    return str(info.value)


def test_the_name_errors_word_for_word():
    assert error_text(data.check_names, [], "push") == ("distlab: invalid argument push=[]: names no variable. "
                                                        "For example ranks.push(x=...).")
    assert error_text(data.check_names, (), "pull") == ('distlab: invalid argument pull=[]: names no variable. '
                                                        'For example ranks.pull("x").')
    assert error_text(data.check_names, ["ok", 3], "push") == "distlab: invalid argument push=3: is not a Python " \
                                                              "variable name."
    assert error_text(data.check_names, ["world_size"], "scatter") == (
        "distlab: invalid argument scatter='world_size': is predefined on every rank and must stay as it is. "
        "Choose another name.")
    assert error_text(data.merge, (1,), {}, "scatter") == (
        "distlab: invalid argument scatter=(1,): the positional argument must be a dict of names, not tuple. "
        "For example ranks.scatter(x=...).")
    assert error_text(data.merge, {"device": 1}, {"y": 2}, "push").startswith("distlab: invalid argument "
                                                                               "push='device': is predefined")
    assert data.merge({}, {"y": 2}, "push") == {"y": 2}
    assert data.merge({"y": 1}, {"y": 2}, "push") == {"y": 2}  # the keyword wins


def test_the_pack_errors_word_for_word():
    ns = {"__name__": "__main__"}
    exec("def mine(r):\n    return r\nclass Box:\n    pass\n", ns)
    assert error_text(data.pack, {"ok": 1, "b": ns["Box"]}) == (
        "distlab: cannot ship the value of 'b' to the worker processes: Box is a class defined in the notebook, "
        "and a rank has no notebook to find it in. Define it on the ranks: run the cell that defines Box with "
        "%%ranks, or call ranks.run(f) with a function f that uses it (both send its source).")
    assert "mine is a function defined in the notebook" in error_text(data.pack, {"f": ns["mine"]})
    with pytest.raises(distlab.CaptureError) as info:
        data.pack({"ok": 1, "lock": threading.Lock()})
    assert str(info.value) == (
        "distlab: cannot ship the value of 'lock' to the worker processes: it cannot be pickled (TypeError: cannot "
        "pickle '_thread.lock' object). Send data (tensors, numbers, lists, dicts); define functions and classes "
        "on the ranks instead (a %%ranks cell or ranks.run).")
    assert info.value.__suppress_context__  # the failed pickling of the whole dict is not shown above it


def test_only_a_function_defined_in_the_notebook_is_sent_as_source():
    ns = {"__name__": "__main__"}
    exec("def mine(r):\n    return r\nclass Box:\n    pass\n", ns)
    assert data.notebook_function(ns["mine"])
    assert not data.notebook_function(ns["Box"]) and not data.notebook_function(error_text)
    assert not data.notebook_function(len) and not data.notebook_function(1)


def test_the_scatter_errors_word_for_word():
    assert error_text(data.split, {"x": {10: 1, 9: 2}}, [0, 1]) == (
        "distlab: invalid argument x={10: 1, 9: 2}: a dict to scatter needs one key per selected rank, exactly "
        "[0, 1], not [10, 9].")
    assert error_text(data.split, {"x": [1, 2]}, [0]) == (
        "distlab: invalid argument x=[1, 2]: scatter needs one value per selected rank: 1 value, not 2. To give "
        "every rank the same value, use ranks.push.")
    assert error_text(data.split, {"x": 5}, [0]) == (
        "distlab: invalid argument x=5: scatter needs a list (one value per rank, 1 here) or a dict {rank: value}, "
        "not int. A tensor: list(t.chunk(n)). The same value everywhere: ranks.push.")


def test_a_value_in_a_message_is_cut_after_80_characters():
    assert repr(data._short("a" * 78)) == "'" + "a" * 78 + "'"  # 80 characters with its quotes: whole
    assert repr(data._short("a" * 79)) == "'" + "a" * 79 + "..."


def test_data_that_says_it_comes_from_the_notebook_is_still_data():
    value = SimpleNamespace(__module__="__main__", lr=0.1)  # neither a function nor a class
    assert pickle.loads(data.pack({"x": value})) == {"x": value}


class PicklesOnSecondTry:
    """A value whose first pickling fails (state that settles as it is read)."""

    tries = 0

    def __reduce__(self):
        PicklesOnSecondTry.tries += 1
        if PicklesOnSecondTry.tries == 1:
            raise RuntimeError("not yet")
        return (PicklesOnSecondTry, ())


def test_pack_sends_the_values_when_each_pickles_on_its_own_second_look():
    PicklesOnSecondTry.tries = 0
    back = pickle.loads(data.pack({"n": 1, "v": PicklesOnSecondTry()}))
    assert back["n"] == 1 and isinstance(back["v"], PicklesOnSecondTry)
