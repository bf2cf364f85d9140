"""capture: notebook code -> worker script. Pure tests, no processes.

Where a promise is about the script, the test runs the script (the ``run_as_rank0`` fixture).
"""
import ast
import collections
import inspect
import threading

import pytest
import torch
from article_code import DEMO_BASIC, IMPORTS, SETUP_CLEANUP, TOY_MODEL
from fake_kernel import as_main, run_cells

from distlab import CaptureError
from distlab.capture.collect import capture, global_names, import_line, is_literal, reached_by_attributes
from distlab.capture.script import render

ARTICLE_CELLS = (IMPORTS, SETUP_CLEANUP, TOY_MODEL, DEMO_BASIC)
Pair = collections.namedtuple("Pair", "first second")  # importable: pickled by reference


def _data_file(tmp_path, name):
    """The one ``<name>.pt`` the last run wrote."""
    (path,) = (tmp_path / "runs").rglob(f"{name}.pt")
    return path


def test_class_source_is_unavailable_to_inspect_as_in_a_kernel():
    ns = run_cells(*ARTICLE_CELLS)
    with pytest.raises((OSError, TypeError)):
        inspect.getsource(ns["ToyModel"])


def test_article_code_is_captured_with_imports_aliases_and_dependencies():
    ns = run_cells(*ARTICLE_CELLS)
    cap = capture(ns["demo_basic"])
    assert cap.imports == [  # in order of first use
        "import os", "import torch.distributed as dist", "import torch.nn as nn",
        "from torch.nn.parallel.distributed import DistributedDataParallel as DDP", "import torch.optim as optim",
        "import torch",
    ]
    names = [d.split("(")[0].split()[-1] for d in cap.definitions]
    assert names == ["setup", "ToyModel", "cleanup", "demo_basic"]  # in order of first use
    assert cap.definitions[1].startswith("class ToyModel(nn.Module):")
    assert "return self.net2(self.relu(self.net1(x)))" in cap.definitions[1]
    assert cap.values == {}


def test_rendered_script_compiles_and_defines_everything():
    ns = run_cells(*ARTICLE_CELLS)
    text = render(capture(ns["demo_basic"]), args=(2,), nprocs=2, style="spawn", backend="auto", filename="d.py")
    compile(text, "d.py", "exec")
    assert "_distlab.main(demo_basic, args=(2,), nprocs=2, style='spawn', backend='auto')" in text
    assert "torchrun --standalone --nproc-per-node 2 d.py" in text
    scope = {"__name__": "not_main"}
    exec(text, scope)  # defines everything without running the entry point
    assert scope["ToyModel"]()(torch.randn(3, 10)).shape == (3, 5)


def test_base_class_and_helper_come_before_their_users():
    ns = run_cells(
        "import torch.nn as nn",
        "class Base(nn.Module):\n    def hello(self):\n        return 1\n",
        "class Child(Base):\n    def forward(self, x):\n        return helper(x)\n",
        "def helper(x):\n    return x + 1\n",
        "def work(rank):\n    return Child().forward(rank)\n",
    )
    order = [d.split("(")[0].split()[-1].rstrip(":") for d in capture(ns["work"]).definitions]
    assert order.index("Base") < order.index("Child") < order.index("work")
    assert "helper" in order


def test_constants_and_locals():
    ns = run_cells(
        "LR = 0.01\nSIZES = [1, 2, 3]\nmodel = object()\nNAME = 'toy'\n",
        "def work(rank):\n    model = LR * 2\n    return model, SIZES, NAME\n",
    )
    cap = capture(ns["work"])
    assert cap.constants == ["LR = 0.01", "SIZES = [1, 2, 3]", "NAME = 'toy'"]
    assert cap.values == {}  # the local `model` never pulls in the notebook's global `model`


def test_tensor_global_travels_as_data():
    ns = run_cells("import torch\nW = torch.arange(3.0)\n", "def work(rank):\n    return W * rank\n")
    cap = capture(ns["work"])
    assert list(cap.values) == ["W"] and torch.equal(cap.values["W"], torch.arange(3.0))


def test_instance_of_notebook_class_in_args_pulls_in_its_class(monkeypatch, run_as_rank0):
    ns = run_cells("LR = 0.1\nclass Cfg:\n    def __init__(self):\n        self.lr = LR\n    def twice(self):\n"
                   "        return self.lr * 2\n", "def work(rank, cfg):\n    return cfg.twice()\n")
    as_main(monkeypatch, ns)
    assert run_as_rank0(ns["work"], args=(ns["Cfg"](),))[0] == 0.2


def test_class_without_methods_is_found_in_the_input_history():
    ns = run_cells("class Config:\n    lr = 0.5\n    epochs = 2\n", "def work(rank):\n    return Config.lr\n")
    assert capture(ns["work"]).definitions[0] == "class Config:\n    lr = 0.5\n    epochs = 2\n"


def test_function_alias_defined_in_notebook(run_as_rank0):
    ns = run_cells("def original(x):\n    return x + 1\n", "alias = original\n",
                   "def work(rank):\n    return alias(rank)\n")
    assert run_as_rank0(ns["work"])[0] == 1


def test_class_alias_is_written_after_the_class(run_as_rank0):
    ns = run_cells("class Net:\n    def out(self):\n        return 'net'\n", "Model = Net\n",
                   "def work(rank):\n    return Model().out()\n")
    returned, text = run_as_rank0(ns["work"])
    assert returned == "net"
    assert text.index("class Net:") < text.index("Model = Net")


def test_closure_is_refused_with_advice():
    ns = run_cells("def outer():\n    k, n = 3, 4\n    def inner(rank):\n        return k + n\n    return inner\n")
    with pytest.raises(CaptureError) as e:
        capture(ns["outer"]())
    assert str(e.value) == (
        "distlab: cannot ship function 'inner' to the worker processes: it is a closure over k, n. Define it at the "
        "top level of a cell and pass those values through args= (a decorator must use functools.wraps for distlab "
        "to ship what it decorates)."
    )


def test_unpicklable_global_is_refused_by_name():
    ns = run_cells("def work(rank):\n    return LOCK\n")
    ns["LOCK"] = threading.Lock()
    with pytest.raises(CaptureError) as e:
        capture(ns["work"])
    assert str(e.value) == (
        "distlab: cannot ship the global 'LOCK' (lock) to the worker processes: it is neither source code nor "
        "picklable (TypeError: cannot pickle '_thread.lock' object). Create it inside the function instead, or "
        "pass something picklable through args=."
    )


def test_lambda_dependency_is_refused():
    ns = run_cells("f = lambda x: x\n", "def work(rank):\n    return f(rank)\n")
    with pytest.raises(CaptureError) as e:
        capture(ns["work"])
    assert str(e.value) == ("distlab: cannot ship a lambda to the worker processes: a lambda has no name to call it "
                            "by in a script. Define it with def.")


def test_global_names_ignores_locals_attributes_and_builtins():
    src = "def f(a):\n    b = a + GLOBAL_ONE\n    print(b.real)\n    return [x for x in OTHER]\n"
    assert global_names(src) == ["GLOBAL_ONE", "OTHER"]


def test_names_a_class_body_defines_itself_are_not_globals():
    assert global_names("class A:\n    size = 3\n    double = size * SCALE\n") == ["SCALE"]


def test_module_dunders_are_never_shipped_but_other_underscored_names_are():
    # shipping the notebook's __name__ ('__main__') would make the script's ranks start ranks themselves
    assert global_names("def f():\n    return __name__, __file__, __cache, data__\n") == ["__cache", "data__"]


@pytest.mark.parametrize("length,inline", [(2000, True), (2001, False)])
def test_constants_up_to_2000_characters_are_written_inline(length, inline):
    assert is_literal("a" * (length - 2)) is inline  # repr adds the two quotes


@pytest.mark.parametrize("module,qualname,name,line", [
    ("torch", None, "torch", "import torch"),
    ("torch.nn", None, "nn", "import torch.nn as nn"),
    ("torch.nn.parallel.distributed", "DistributedDataParallel", "DDP",
     "from torch.nn.parallel.distributed import DistributedDataParallel as DDP"),
    ("math", "sqrt", "sqrt", "from math import sqrt"),
    ("datetime", "datetime.now", "now", "from datetime import datetime; now = datetime.now"),
])
def test_import_line(module, qualname, name, line):
    assert import_line(module, qualname, name) == line


def test_a_module_hidden_by_its_packages_attribute_is_imported_by_importlib():
    assert import_line("distlab.launch.compat", None, "compat", reachable=False) == \
        "import importlib; compat = importlib.import_module('distlab.launch.compat')"
    assert import_line("torch", None, "torch", reachable=False) == "import torch"  # binds what it names


def test_which_modules_attribute_lookups_reach():
    import types

    pkg, sub, leaf = (types.ModuleType(n) for n in ("pkg", "pkg.sub", "pkg.sub.leaf"))
    pkg.sub, sub.leaf = sub, leaf
    modules = {"pkg": pkg, "pkg.sub": sub, "pkg.sub.leaf": leaf}
    assert reached_by_attributes("pkg", modules) and reached_by_attributes("pkg.sub.leaf", modules)
    pkg.sub = lambda: None                       # a function of the package hides its subpackage
    assert not reached_by_attributes("pkg.sub.leaf", modules) and not reached_by_attributes("pkg.sub", modules)
    assert not reached_by_attributes("pkg.other", modules) and not reached_by_attributes("gone", modules)
    assert reached_by_attributes("torch.nn") and not reached_by_attributes("distlab.launch.compat")


def test_a_module_its_package_hides_reaches_the_rank(run_as_rank0):
    """``distlab.launch`` is a function of the package ``distlab`` and the package of ``compat``: the script's
    ``import distlab.launch.compat as compat`` failed in the rank with AttributeError."""
    ns = run_cells("from distlab.launch import compat\n",
                   "def work(rank):\n    return compat.__name__\n")
    returned, text = run_as_rank0(ns["work"])
    assert returned == "distlab.launch.compat"
    assert "compat = importlib.import_module('distlab.launch.compat')" in text


@pytest.mark.parametrize("value,expected", [
    (1, True), ("a", True), ((1, [2, {"k": None}]), True), (float("nan"), False),
    (torch.ones(1), False), (object(), False), (list(range(5000)), False),
])
def test_is_literal(value, expected):
    assert is_literal(value) is expected


def test_every_notebook_function_inside_a_global_dict_is_shipped(monkeypatch):
    ns = run_cells("def f():\n    return 'f'\n", "G = 'g'\ndef g():\n    return G\n", "TABLE = {'f': f, 'g': g}\n",
                   "def work(rank):\n    return TABLE['g']()\n")
    as_main(monkeypatch, ns)
    cap = capture(ns["work"])
    assert [d.split("(")[0] for d in cap.definitions] == ["def f", "def g", "def work"]
    assert list(cap.values) == ["TABLE"]


def test_unpicklable_argument_is_refused_before_any_process():
    ns = run_cells("def work(rank, lock):\n    return rank\n")
    with pytest.raises(CaptureError, match=r"cannot ship an argument.*neither source code nor picklable"):
        capture(ns["work"], args=(threading.Lock(),))


# --- notebook code that must work (issue #14) -------------------------------------------------

def test_names_used_only_in_annotations_are_shipped(run_as_rank0):
    ns = run_cells(
        "from dataclasses import dataclass\nfrom typing import List, Optional\n",
        "class Summary:\n    def __init__(self):\n        self.total = 0\n",
        "@dataclass\nclass Cfg:\n    sizes: List[int]\n    lr: Optional[float] = None\n",
        "def work(rank, scale: Optional[float] = None) -> Summary:\n"
        "    cfg = Cfg([rank, 2])\n    return (cfg.sizes, cfg.lr, scale, work.__annotations__['return'].__name__)\n",
    )
    returned, text = run_as_rank0(ns["work"])
    assert returned == ([0, 2], None, None, "Summary")
    assert "from typing import List" in text and "from typing import Optional" in text


def test_future_annotations_in_the_notebook_are_kept_in_the_script(run_as_rank0):
    ns = run_cells("from __future__ import annotations\n",
                   "class Node:\n    def join(self, other: Node) -> Node:\n        return other\n",
                   "def work(rank):\n    return Node().join(Node()).__class__.__name__\n")
    returned, text = run_as_rank0(ns["work"])
    assert returned == "Node"
    first_statement = ast.parse(text).body[1]  # after the docstring, where a __future__ import must be
    assert isinstance(first_statement, ast.ImportFrom) and first_statement.module == "__future__"


def test_future_annotations_are_found_when_the_name_annotations_is_reused(run_as_rank0):
    ns = run_cells("def helper():\n    return 1\n", "from __future__ import annotations\n",
                   "annotations = ['cat', 'dog']  # a data set's labels\n",
                   "class Node:\n    def join(self, other: Node) -> Node:\n        return other\n",
                   "def work(rank):\n    return helper(), type(Node().join(Node())).__name__, annotations\n")
    assert run_as_rank0(ns["work"])[0] == (1, "Node", ["cat", "dog"])


def test_future_annotations_of_a_class_defined_after_the_function(run_as_rank0):
    ns = run_cells("def work(rank):\n    return type(Node().join(Node())).__name__\n",
                   "from __future__ import annotations\n",
                   "class Node:\n    def join(self, other: Node) -> Node:\n        return other\n")
    assert run_as_rank0(ns["work"])[0] == "Node"


def test_torch_no_grad_decorated_function_ships_with_its_decorator(run_as_rank0):
    ns = run_cells("import torch\n",
                   "@torch.no_grad()\ndef work(rank):\n    w = torch.ones(2, requires_grad=True)\n"
                   "    return (w * 2).requires_grad\n")
    returned, text = run_as_rank0(ns["work"])
    assert returned is False
    assert "@torch.no_grad()\ndef work(rank):" in text


def test_wraps_decorator_and_what_it_references_are_shipped(run_as_rank0):
    ns = run_cells(
        "import functools\nCALLS = []\n",
        "def logged(f):\n    @functools.wraps(f)\n    def wrapper(*a, **k):\n"
        "        return ('logged', f(*a, **k))\n    return wrapper\n",
        "@logged\ndef helper(x):\n    return x * 10\n",
        "@logged\ndef work(rank):\n    return helper(rank + 1)\n",
    )
    returned, _ = run_as_rank0(ns["work"])
    assert returned == ("logged", ("logged", 10))


def test_lru_cache_helper_is_shipped_as_its_source(run_as_rank0, monkeypatch):
    ns = run_cells("import functools\n", "@functools.lru_cache(maxsize=None)\ndef table(n):\n    return n * 2\n",
                   "def work(rank):\n    return table(21), table.cache_info().misses\n")
    as_main(monkeypatch, ns)
    assert run_as_rank0(ns["work"])[0] == (42, 1)


def test_wrapper_applied_outside_the_def_is_refused():
    ns = run_cells("import functools\n",
                   "def logged(f):\n    @functools.wraps(f)\n    def wrapper(*a):\n        return f(*a)\n"
                   "    return wrapper\n",
                   "def work(rank):\n    return rank\n", "work = logged(work)\n")
    with pytest.raises(CaptureError) as e:
        capture(ns["work"])
    assert str(e.value) == (
        "distlab: cannot ship function 'work' to the worker processes: it is wrapped 1 time(s) but its source has 0 "
        "decorator line(s): it was wrapped by a call outside its def. Write the wrapper as a decorator line "
        "(@wrapper) above the def, and re-run that cell."
    )


def test_decorator_without_wraps_is_refused_with_advice():
    ns = run_cells("def plain(f):\n    def inner(*a):\n        return f(*a)\n    return inner\n",
                   "@plain\ndef work(rank):\n    return rank\n")
    with pytest.raises(CaptureError, match="closure over f.*must use functools.wraps"):
        capture(ns["work"])


@pytest.mark.parametrize("decorator", ["@dataclass", "@dataclass(\n    frozen=True,\n)"])
def test_dataclass_keeps_its_decorator(run_as_rank0, decorator):
    ns = run_cells("from dataclasses import dataclass, field\n",
                   f"{decorator}\nclass Cfg:\n    lr: float = 0.5\n    tags: list = field(default_factory=list)\n\n"
                   "    def doubled(self):\n        return self.lr * 2\n",
                   "def work(rank):\n    cfg = Cfg(lr=0.25)\n    return cfg.doubled(), cfg.tags\n")
    assert run_as_rank0(ns["work"])[0] == (0.5, [])


def test_dataclass_without_methods_keeps_its_decorator(run_as_rank0):
    ns = run_cells("import dataclasses\n", "@dataclasses.dataclass\nclass Cfg:\n    lr: float = 0.5\n",
                   "def work(rank):\n    return Cfg(lr=0.1).lr\n")
    assert run_as_rank0(ns["work"])[0] == 0.1


def test_partial_with_literal_arguments_is_the_entry(run_as_rank0):
    import functools

    ns = run_cells("def work(rank, world, scale=1):\n    return (rank, world, scale)\n")
    returned, text = run_as_rank0(functools.partial(ns["work"], scale=3), args=(2,))
    assert returned == (0, 2, 3)
    assert "work_partial = functools.partial(work, scale=3)" in text


def test_partial_with_positional_literal_arguments(run_as_rank0):
    import functools

    ns = run_cells("def work(offset, rank, scale=1):\n    return (offset + rank) * scale\n")
    returned, text = run_as_rank0(functools.partial(ns["work"], 10, scale=2))
    assert returned == 20 and "work_partial = functools.partial(work, 10, scale=2)" in text


def test_partial_binding_an_instance_of_a_notebook_class(run_as_rank0, monkeypatch):
    import functools

    ns = run_cells("DEFAULT_LR = 0.5\nclass Cfg:\n    def __init__(self):\n        self.lr = DEFAULT_LR\n",
                   "def work(rank, cfg):\n    return cfg.lr\n")
    as_main(monkeypatch, ns)
    assert run_as_rank0(functools.partial(ns["work"], cfg=ns["Cfg"]()))[0] == 0.5


def test_partial_binding_something_unpicklable_is_refused_by_name():
    import functools

    ns = run_cells("def work(rank, lock):\n    return rank\n")
    with pytest.raises(CaptureError, match=r"cannot ship the arguments functools.partial binds to 'work' to the "
                                           r"worker processes: it is neither source code nor picklable"):
        capture(functools.partial(ns["work"], lock=threading.Lock()))


def test_partial_with_tensor_arguments_travels_as_data(run_as_rank0, tmp_path):
    import functools

    ns = run_cells("def work(rank, weights, bias=0):\n    return (weights * rank + bias).tolist()\n")
    fn = functools.partial(ns["work"], torch.arange(3.0), bias=torch.tensor(1.0))
    assert run_as_rank0(fn)[0] == [1.0, 1.0, 1.0]
    assert _data_file(tmp_path, "values").exists()


# --- tensors travel as data, and only their elements -------------------------------------------

def test_tensor_arguments_are_written_to_args_pt(run_as_rank0, tmp_path):
    ns = run_cells("def work(rank, t):\n    return t.sum().item()\n")
    returned, text = run_as_rank0(ns["work"], args=(torch.arange(4.0),))
    assert returned == 6.0
    assert 'args=_distlab.load_data(__file__, "args")' in text and _data_file(tmp_path, "args").exists()


def test_a_small_view_of_a_large_tensor_ships_only_its_elements(run_as_rank0, tmp_path):
    big = torch.arange(1_000_000.0)  # 4 MB of storage
    ns = run_cells("def work(rank, a, nested):\n"
                   "    return a.tolist(), nested['v'][0].tolist(), nested['w'].sum().item()\n")
    args = (big[:4], {"v": [big[5:7]], "w": big[:3]})
    assert run_as_rank0(ns["work"], args=args)[0] == ([0.0, 1.0, 2.0, 3.0], [5.0, 6.0], 3.0)
    assert _data_file(tmp_path, "args").stat().st_size < 20_000
    assert args[0].untyped_storage().nbytes() == 4_000_000  # the caller's tensors are left alone


def test_a_global_view_ships_only_its_elements(run_as_rank0, tmp_path):
    ns = run_cells("import torch\nBIG = torch.zeros(1_000_000)\nSMALL = BIG[:4]\n",
                   "def work(rank):\n    return SMALL.shape[0]\n")
    assert run_as_rank0(ns["work"])[0] == 4
    assert _data_file(tmp_path, "values").stat().st_size < 20_000


def test_a_view_passed_twice_arrives_as_one_tensor(run_as_rank0):
    big = torch.arange(100_000.0)
    view = big[:3]
    ns = run_cells("def work(rank, a, more):\n    return a is more['again'][0], a is more['twice'], a.tolist()\n")
    assert run_as_rank0(ns["work"], args=(view, {"again": [view], "twice": view}))[0] == (True, True, [0.0, 1.0, 2.0])


def test_a_namedtuple_argument_keeps_its_type_and_ships_only_its_elements(run_as_rank0, tmp_path):
    big = torch.arange(1_000_000.0)
    ns = run_cells("def work(rank, pair, same):\n"
                   "    return type(pair).__name__, pair.first.tolist(), pair.second, same.first is same.second\n")
    view = big[:1]
    args = (Pair(big[2:4], "label"), Pair(view, view))
    assert run_as_rank0(ns["work"], args=args)[0] == ("Pair", [2.0, 3.0], "label", True)
    assert _data_file(tmp_path, "args").stat().st_size < 20_000


def test_tensors_that_share_storage_still_share_it_on_the_worker(run_as_rank0):
    whole = torch.zeros(4)
    ns = run_cells("def work(rank, a, b):\n    a.add_(1)\n    return b.sum().item()\n")
    assert run_as_rank0(ns["work"], args=(whole, whole.view(2, 2)))[0] == 4.0


@pytest.mark.parametrize("requires_grad", [True, False])
def test_a_parameter_viewing_a_large_tensor_ships_as_a_small_parameter(run_as_rank0, tmp_path, requires_grad):
    big = torch.arange(1_000_000.0)
    ns = run_cells("def work(rank, p):\n    return type(p).__name__, p.requires_grad, p.tolist()\n")
    param = torch.nn.Parameter(big[:2], requires_grad=requires_grad)
    assert run_as_rank0(ns["work"], args=(param,))[0] == ("Parameter", requires_grad, [0.0, 1.0])
    assert _data_file(tmp_path, "args").stat().st_size < 20_000


def test_a_method_of_a_library_class_is_imported(run_as_rank0):
    ns = run_cells("import torch\nlinear_forward = torch.nn.Linear.forward\n",
                   "def work(rank):\n    layer = torch.nn.Linear(2, 1)\n"
                   "    return linear_forward(layer, torch.ones(1, 2)).shape\n")
    returned, text = run_as_rank0(ns["work"])
    assert returned == (1, 1)
    assert "from torch.nn.modules.linear import Linear; linear_forward = Linear.forward" in text


def test_a_bound_method_global_travels_with_its_object(run_as_rank0):
    ns = run_cells("import fractions\nlimit = fractions.Fraction(10, 30).limit_denominator\n",
                   "def work(rank):\n    return str(limit(10))\n")
    returned, text = run_as_rank0(ns["work"])
    assert returned == "1/3" and "Fraction.limit_denominator" not in text


def test_the_script_a_person_reads_word_for_word():
    import functools

    ns = run_cells(
        "import math\nimport torch\nfrom collections import OrderedDict\n",
        "SCALE = 2\nWEIGHTS = torch.ones(2)\n",
        "class Acc:\n    def __init__(self):\n        self.total = OrderedDict()\n",
        "Total = Acc\n",
        "def work(rank, n, scale=1):\n    acc = Total()\n"
        "    return math.sqrt(n) * SCALE * scale + WEIGHTS.sum().item()\n",
    )
    cap = capture(functools.partial(ns["work"], scale=3))
    text = render(cap, args=(torch.ones(1),), nprocs=2, style="launch", backend="gloo", filename="work.py")
    assert text == '''"""Worker script written by distlab for `work` (2 ranks, launch style).

Run it yourself, outside the notebook:
    python work.py                                    # starts 2 ranks with torch.multiprocessing.spawn
    torchrun --standalone --nproc-per-node 2 work.py  # torchrun starts the 2 ranks
"""

import distlab.worker as _distlab  # distlab's worker runtime: main(), load_data()
import functools
import math
from collections import OrderedDict

# Constants from the notebook
SCALE = 2


class Acc:
    def __init__(self):
        self.total = OrderedDict()


Total = Acc


def work(rank, n, scale=1):
    acc = Total()
    return math.sqrt(n) * SCALE * scale + WEIGHTS.sum().item()


# Values from the notebook that are not source code: saved next to this script
globals().update(_distlab.load_data(__file__, "values"))


# fn was a functools.partial: the same one, rebuilt
work_partial = functools.partial(work, scale=3)


if __name__ == "__main__":
    _distlab.main(work_partial, args=_distlab.load_data(__file__, "args"), nprocs=2, style='launch', backend='gloo')
'''


def test_objects_that_are_not_containers_pass_unchanged(run_as_rank0):
    import ast as syntax

    ns = run_cells("import ast\n", "def work(rank, tree):\n    return ast.dump(tree)\n")
    assert run_as_rank0(ns["work"], args=(syntax.parse("x = 1"),))[0] == syntax.dump(syntax.parse("x = 1"))


def test_values_keep_their_types_even_when_they_print_like_literals(run_as_rank0, monkeypatch):
    ns = run_cells("class Tag(str):\n    pass\n", "class Registry(dict):\n    pass\n",
                   "TABLE = Registry(a=1)\nIN_LIST = [Tag('x')]\nAS_VALUE = {'k': Tag('x')}\nAS_KEY = {Tag('k'): 1}\n",
                   "def work(rank):\n    return (type(TABLE).__name__, type(IN_LIST[0]).__name__,\n"
                   "            type(AS_VALUE['k']).__name__, type(next(iter(AS_KEY))).__name__)\n")
    as_main(monkeypatch, ns)
    assert run_as_rank0(ns["work"])[0] == ("Registry", "Tag", "Tag", "Tag")
