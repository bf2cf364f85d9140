"""capture of notebook classes: the text shipped is checked against the live class. No processes.

A class may have changed after its cell ran, or have been defined in one branch of an ``if``;
each test runs the generated script (``run_as_rank0``) or expects a CaptureError saying why not.
"""
import linecache
import sys
import types

import pytest
from fake_kernel import as_main, run_cells

from distlab import CaptureError
from distlab.capture.collect import capture


def run_file_into(ns: dict, path) -> None:
    """What ``%run -i file.py`` does: the file's code runs in the notebook, but is not in ``In``."""
    exec(compile(path.read_text(), str(path), "exec"), ns)


def test_class_attribute_changed_later_is_shipped_as_it_is_now(run_as_rank0):
    ns = run_cells("class Cfg:\n    lr = 0.5\n    epochs = 2\n    def rate(self):\n        return self.lr\n",
                   "Cfg.lr = 0.1\nCfg.extra = 'new'\n",
                   "def work(rank):\n    return Cfg().rate(), Cfg.epochs, Cfg.extra\n")
    returned, text = run_as_rank0(ns["work"])
    assert returned == (0.1, 2, "new")
    assert "Cfg.lr = 0.1\nCfg.extra = 'new'" in text


def test_class_without_methods_changed_later_is_shipped_as_it_is_now(run_as_rank0):
    ns = run_cells("class Cfg:\n    lr = 0.5\n", "Cfg.lr = 0.1\n", "def work(rank):\n    return Cfg.lr\n")
    assert run_as_rank0(ns["work"])[0] == 0.1


def test_method_replaced_later_is_shipped_as_it_is_now(run_as_rank0):
    ns = run_cells("class Net:\n    def forward(self, x):\n        return x\n    def name(self):\n        return 'n'\n",
                   "SCALE = 10\ndef fast_forward(self, x):\n    return x * SCALE\n",
                   "Net.forward = fast_forward\ndel Net.name\n",
                   "def work(rank):\n    return Net().forward(3), hasattr(Net, 'name')\n")
    assert run_as_rank0(ns["work"])[0] == (30, False)


def test_class_changed_to_something_not_source_is_refused():
    ns = run_cells("import torch\n", "class Net:\n    def forward(self, x):\n        return x\n",
                   "Net.table = torch.ones(2)\n", "def work(rank):\n    return Net.table\n")
    with pytest.raises(CaptureError, match=r"class 'Net'.*Net.table was added after the class was defined "
                                           r"\(it is now a Tensor\).*Make the change inside the class body"):
        capture(ns["work"])


def test_class_defined_in_an_if_is_the_branch_that_ran(run_as_rank0):
    ns = run_cells("class Cfg:\n    lr = 0.5\n",
                   "FAST = True\nif FAST:\n    class Cfg:\n        lr = 1.0\nelse:\n    class Cfg:\n        lr = 0.1\n",
                   "def work(rank):\n    return Cfg.lr\n")
    assert run_as_rank0(ns["work"])[0] == 1.0


def test_class_with_methods_defined_in_an_if_is_the_branch_that_ran(run_as_rank0):
    ns = run_cells("FAST = False\nif FAST:\n    class Net:\n        def speed(self):\n            return 'fast'\n"
                   "else:\n    class Net:\n        def speed(self):\n            return 'slow'\n",
                   "def work(rank):\n    return Net().speed()\n")
    assert run_as_rank0(ns["work"])[0] == "slow"


def test_class_branches_that_cannot_be_told_apart_are_refused():
    ns = run_cells("import math\n", "if True:\n    class Cfg:\n        lr = math.sqrt(4)\n"
                   "else:\n    class Cfg:\n        lr = math.sqrt(9)\n",
                   "def work(rank):\n    return Cfg.lr\n")
    with pytest.raises(CaptureError, match="class 'Cfg'.*defined more than once in one cell.*cannot tell which"):
        capture(ns["work"])


def test_public_attribute_deleted_later_is_deleted_in_the_script(run_as_rank0):
    ns = run_cells("class Cfg:\n    lr = 0.5\n    mode = 'a'\n    _private = 1\n",
                   "del Cfg.mode\n", "def work(rank):\n    return hasattr(Cfg, 'mode'), Cfg.lr, Cfg._private\n")
    assert run_as_rank0(ns["work"])[0] == (False, 0.5, 1)


def test_enum_ships_unchanged(run_as_rank0):
    ns = run_cells("from enum import Enum\n",
                   "class Color(Enum):\n    _ignore_ = []\n    RED = 1\n    GREEN = 2\n",
                   "def work(rank):\n    return Color(2).name, Color.RED.value\n")
    returned, text = run_as_rank0(ns["work"])
    assert returned == ("GREEN", 1)
    assert "after the class was defined" not in text


def test_class_with_slots_ships_unchanged(run_as_rank0):
    ns = run_cells("class Point:\n    __slots__ = ('x', 'y')\n    def __init__(self):\n        self.x, self.y = 1, 2\n",
                   "def work(rank):\n    p = Point()\n    return p.x + p.y\n")
    returned, text = run_as_rank0(ns["work"])
    assert returned == 3 and "after the class was defined" not in text


def test_private_method_added_later_is_shipped(run_as_rank0):
    ns = run_cells("class Net:\n    def forward(self, x):\n        return x\n",
                   "BOOST = 5\ndef _boost(self, x):\n    return x + BOOST\n", "Net._boost = _boost\n",
                   "def work(rank):\n    return Net()._boost(1)\n")
    assert run_as_rank0(ns["work"])[0] == 6


def test_method_replaced_by_a_lambda_is_refused():
    ns = run_cells("class Net:\n    def forward(self, x):\n        return x\n",
                   "Net.forward = lambda self, x: x * 3\n", "def work(rank):\n    return Net().forward(1)\n")
    with pytest.raises(CaptureError) as e:
        capture(ns["work"])
    assert str(e.value) == (
        "distlab: cannot ship class 'Net' to the worker processes: Net.forward was replaced after the class was "
        "defined (it is now a function), so the class's source no longer describes it and that change cannot be "
        "written as source. Make the change inside the class body and re-run that cell, or move the class to a "
        ".py module."
    )


def test_attribute_changed_to_a_value_too_large_for_source_is_refused():
    ns = run_cells("class Cfg:\n    sizes = [1, 2]\n", "Cfg.sizes = list(range(5000))\n",
                   "def work(rank):\n    return len(Cfg.sizes)\n")
    with pytest.raises(CaptureError, match=r"Cfg.sizes was changed after the class was defined \(it is now a list\)"):
        capture(ns["work"])


def test_the_closest_definition_is_patched_when_none_matches(run_as_rank0):
    ns = run_cells("class Cfg:\n    lr = 0.5\n    epochs = 2\n",
                   "if False:\n    class Cfg:\n        lr = 9.0\n        epochs = 9\n",
                   "Cfg.lr = 0.1\n", "def work(rank):\n    return Cfg.lr, Cfg.epochs\n")
    assert run_as_rank0(ns["work"])[0] == (0.1, 2)


def test_class_from_a_file_run_into_the_notebook_is_found_by_its_methods(run_as_rank0, tmp_path):
    path = tmp_path / "helpers.py"
    path.write_text("class Net:\n    scale = 2\n    def forward(self, x):\n        return x * self.scale\n"
                    "    def name(self): return 'net'\n"
                    "class Tag:\n    label = 't'\n    def name(self): return self.label\n")
    ns = run_cells("def work(rank):\n    return Net().forward(3), Net().name(), Tag().name()\n")
    run_file_into(ns, path)
    assert run_as_rank0(ns["work"])[0] == (6, "net", "t")


def test_method_copied_from_an_earlier_definition_is_refused():
    ns = run_cells("class Net:\n    def forward(self, x):\n        return 'old'\n", "OldNet = Net\n",
                   "class Net:\n    def other(self):\n        return 1\n"
                   "    def forward(self, x):\n        return 'new'\n",
                   "Net.forward = OldNet.forward\n", "def work(rank):\n    return Net().forward(1)\n")
    with pytest.raises(CaptureError, match="Net.forward was replaced after the class was defined"):
        capture(ns["work"])


def test_methods_behind_a_decorator_without_wraps_are_recognised(run_as_rank0):
    ns = run_cells("def traced(f):\n    def inner(self, *a):\n        return ('traced', f(self, *a))\n"
                   "    return inner\n",
                   "class Net:\n    @traced\n    def forward(self, x):\n        return x\n",
                   "def work(rank):\n    return Net().forward(2)\n")
    returned, text = run_as_rank0(ns["work"])
    assert returned == ("traced", 2) and "after the class was defined" not in text


def test_nested_class_is_kept_and_replacing_it_is_refused(run_as_rank0):
    cells = ("class Outer:\n    class Inner:\n        size = 3\n", "class Other:\n    size = 4\n")
    ns = run_cells(*cells, "def work(rank):\n    return Outer.Inner.size\n")
    assert run_as_rank0(ns["work"])[0] == 3
    ns = run_cells(*cells, "Outer.Inner = Other\n", "def work(rank):\n    return Outer.Inner.size\n")
    with pytest.raises(CaptureError, match=r"Outer.Inner was replaced after the class was defined \(it is now a "):
        capture(ns["work"])


def test_branches_that_cannot_be_told_apart_say_so_word_for_word():
    ns = run_cells("import math\n", "if True:\n    class Cfg:\n        lr = math.sqrt(4)\n"
                   "else:\n    class Cfg:\n        lr = math.sqrt(9)\n", "def work(rank):\n    return Cfg.lr\n")
    with pytest.raises(CaptureError) as e:
        capture(ns["work"])
    assert str(e.value) == (
        "distlab: cannot ship class 'Cfg' to the worker processes: it is defined more than once in one cell (in "
        "branches of an `if`?) and distlab cannot tell which definition ran. Define it once at the top level of a "
        "cell, or move it to a .py module and import it."
    )


def test_the_script_keeps_the_class_as_written_with_its_comments(run_as_rank0):
    ns = run_cells("if True:\n    class Cfg:\n        # the learning rate the chapter uses\n        lr = 0.5\n",
                   "def work(rank):\n    return Cfg.lr\n")
    returned, text = run_as_rank0(ns["work"])
    assert returned == 0.5
    assert "class Cfg:\n    # the learning rate the chapter uses\n    lr = 0.5\n" in text


def test_indented_class_with_a_docstring_at_column_zero_still_ships(run_as_rank0):
    ns = run_cells('if True:\n    class Cfg:\n        """Settings.\nSecond line at column 0."""\n        lr = 0.5\n',
                   "def work(rank):\n    return Cfg.lr, Cfg.__doc__\n")
    assert run_as_rank0(ns["work"])[0] == (0.5, "Settings.\nSecond line at column 0.")


def test_a_cell_with_a_syntax_error_in_the_history_is_skipped(run_as_rank0):
    ns = run_cells("class Cfg:\n    lr = 0.5\n", "def work(rank):\n    return Cfg.lr\n")
    ns["In"].append("def broken(:\n")  # a cell that failed to compile stays in In
    assert run_as_rank0(ns["work"])[0] == 0.5


def test_class_without_methods_in_a_module_file_is_found(run_as_rank0, tmp_path, monkeypatch):
    path = tmp_path / "labcfg.py"
    path.write_text("class Cfg:\n    lr = 0.25\n\n\ndef work(rank):\n    return Cfg.lr * 2\n")
    module = types.ModuleType("labcfg")
    module.__file__ = str(path)
    monkeypatch.setitem(sys.modules, "labcfg", module)
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    assert run_as_rank0(module.work)[0] == 0.5


def test_class_made_without_source_is_refused():
    ns = run_cells("Dyn = type('Dyn', (), {'x': 1})\n", "def work(rank):\n    return Dyn.x\n")
    with pytest.raises(CaptureError) as e:
        capture(ns["work"])
    assert str(e.value) == ("distlab: cannot ship class 'Dyn' to the worker processes: its source code could not be "
                            "found. Re-run the cell that defines it, or move it to a .py module and import it.")


def test_function_made_without_source_is_refused():
    ns = run_cells("exec('def helper(x):\\n    return x')\n", "def work(rank):\n    return helper(rank)\n")
    with pytest.raises(CaptureError, match="function 'helper' to the worker processes: its source code could not be"):
        capture(ns["work"])


def test_function_source_comes_from_the_history_when_the_line_cache_lost_it(run_as_rank0, monkeypatch):
    ns = run_cells("def helper(x):\n    return x + 1\n", "def work(rank):\n    return helper(rank)\n")
    monkeypatch.delitem(linecache.cache, ns["helper"].__code__.co_filename)
    assert run_as_rank0(ns["work"])[0] == 1


def test_instance_of_a_changed_class_in_args(run_as_rank0, monkeypatch):
    ns = run_cells("class Cfg:\n    lr = 0.5\n    def __init__(self):\n        self.epochs = 1\n", "Cfg.lr = 0.2\n",
                   "def work(rank, cfg):\n    return cfg.lr, cfg.epochs\n")
    as_main(monkeypatch, ns)
    assert run_as_rank0(ns["work"], args=(ns["Cfg"](),))[0] == (0.2, 1)


def test_a_decorator_whose_closure_has_an_empty_cell(run_as_rank0):
    ns = run_cells("def traced(f):\n    def inner(self, *a):\n        if False:\n            return unset\n"
                   "        return ('traced', f(self, *a))\n    if False:\n        unset = None\n    return inner\n",
                   "class Net:\n    @traced\n    def forward(self, x):\n        return x\n",
                   "def work(rank):\n    return Net().forward(4)\n")
    assert run_as_rank0(ns["work"])[0] == ("traced", 4)


def test_class_redefined_in_a_later_cell_ships_its_newest_definition(run_as_rank0):
    ns = run_cells("class Cfg:\n    lr = abs(-0.5)\n", "def work(rank):\n    return Cfg.lr\n",
                   "class Cfg:\n    lr = abs(-0.25)\n")
    returned, text = run_as_rank0(ns["work"])
    assert returned == 0.25 and "-0.5" not in text


def test_annotated_class_attribute_changed_later(run_as_rank0):
    ns = run_cells("class Cfg:\n    lr: float = 0.5\n", "Cfg.lr = 0.1\n", "def work(rank):\n    return Cfg.lr\n")
    assert run_as_rank0(ns["work"])[0] == 0.1


def test_namedtuple_class_ships_unchanged(run_as_rank0):
    ns = run_cells("from typing import NamedTuple\n", "class Point(NamedTuple):\n    x: int\n    y: int = 0\n",
                   "def work(rank):\n    return Point(3)._asdict()\n")
    returned, text = run_as_rank0(ns["work"])
    assert returned == {"x": 3, "y": 0} and "after the class was defined" not in text


def test_static_class_methods_and_properties_ship_unchanged(run_as_rank0):
    ns = run_cells("import functools\n",
                   "class Net:\n    @staticmethod\n    def s():\n        return 's'\n"
                   "    @classmethod\n    def c(cls):\n        return cls.__name__\n"
                   "    @property\n    def p(self):\n        return 'p'\n"
                   "    @functools.cached_property\n    def cached(self):\n        return 'cached'\n",
                   "def work(rank):\n    n = Net()\n    return Net.s(), Net.c(), n.p, n.cached\n")
    returned, text = run_as_rank0(ns["work"])
    assert returned == ("s", "Net", "p", "cached") and "after the class was defined" not in text


def test_a_change_is_written_on_its_own_lines_after_a_cell_without_a_final_newline(run_as_rank0):
    ns = run_cells("class Cfg:\n    # the rate\n    lr = 0.5", "Cfg.lr = 0.1", "def work(rank):\n    return Cfg.lr\n")
    returned, text = run_as_rank0(ns["work"])
    assert returned == 0.1
    assert ("class Cfg:\n    # the rate\n    lr = 0.5\n# changed in the notebook after the class was defined:\n"
            "Cfg.lr = 0.1\n") in text
