"""capture: notebook code -> worker script. Pure tests, no processes."""
import inspect
import threading

import pytest
import torch
from article_code import DEMO_BASIC, IMPORTS, SETUP_CLEANUP, TOY_MODEL
from fake_kernel import as_main, run_cells

from distlab import CaptureError
from distlab.capture import capture, global_names, import_line, is_literal
from distlab.script import render

ARTICLE_CELLS = (IMPORTS, SETUP_CLEANUP, TOY_MODEL, DEMO_BASIC)


def test_class_source_is_unavailable_to_inspect_as_in_a_kernel():
    ns = run_cells(*ARTICLE_CELLS)
    with pytest.raises((OSError, TypeError)):
        inspect.getsource(ns["ToyModel"])


def test_article_code_is_captured_with_imports_aliases_and_dependencies():
    ns = run_cells(*ARTICLE_CELLS)
    cap = capture(ns["demo_basic"])
    assert set(cap.imports) == {
        "import os", "import torch", "import torch.distributed as dist", "import torch.nn as nn",
        "import torch.optim as optim",
        "from torch.nn.parallel.distributed import DistributedDataParallel as DDP",
    }
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
    assert "torchrun --nproc-per-node 2 d.py" in text
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


def test_instance_of_notebook_class_in_args_pulls_in_its_class(monkeypatch):
    ns = run_cells("class Cfg:\n    def __init__(self):\n        self.lr = 0.1\n",
                   "def work(rank, cfg):\n    return cfg.lr\n")
    as_main(monkeypatch, ns)
    cap = capture(ns["work"], args=(ns["Cfg"](),))
    assert any(d.startswith("class Cfg") for d in cap.definitions)


def test_class_without_methods_is_found_in_the_input_history():
    ns = run_cells("class Config:\n    lr = 0.5\n    epochs = 2\n", "def work(rank):\n    return Config.lr\n")
    assert capture(ns["work"]).definitions[0] == "class Config:\n    lr = 0.5\n    epochs = 2\n"


def test_function_alias_defined_in_notebook():
    ns = run_cells("def original(x):\n    return x\n", "alias = original\n",
                   "def work(rank):\n    return alias(rank)\n")
    cap = capture(ns["work"])
    assert "alias = original" in cap.constants
    assert cap.definitions[0].startswith("def original")


def test_closure_is_refused_with_advice():
    ns = run_cells("def outer():\n    k = 3\n    def inner(rank):\n        return k\n    return inner\n")
    with pytest.raises(CaptureError, match="closure over k.*pass those values through args="):
        capture(ns["outer"]())


def test_unpicklable_global_is_refused_by_name():
    ns = run_cells("def work(rank):\n    return LOCK\n")
    ns["LOCK"] = threading.Lock()
    with pytest.raises(CaptureError, match=r"the global 'LOCK' \(lock\).*Create it inside the function"):
        capture(ns["work"])


def test_lambda_dependency_is_refused():
    ns = run_cells("f = lambda x: x\n", "def work(rank):\n    return f(rank)\n")
    with pytest.raises(CaptureError, match="a lambda"):
        capture(ns["work"])


def test_global_names_ignores_locals_attributes_and_builtins():
    src = "def f(a):\n    b = a + GLOBAL_ONE\n    print(b.real)\n    return [x for x in OTHER]\n"
    assert global_names(src) == ["GLOBAL_ONE", "OTHER"]


@pytest.mark.parametrize("module,qualname,name,line", [
    ("torch", None, "torch", "import torch"),
    ("torch.nn", None, "nn", "import torch.nn as nn"),
    ("torch.nn.parallel.distributed", "DistributedDataParallel", "DDP",
     "from torch.nn.parallel.distributed import DistributedDataParallel as DDP"),
    ("math", "sqrt", "sqrt", "from math import sqrt"),
])
def test_import_line(module, qualname, name, line):
    assert import_line(module, qualname, name) == line


@pytest.mark.parametrize("value,expected", [
    (1, True), ("a", True), ((1, [2, {"k": None}]), True), (float("nan"), False),
    (torch.ones(1), False), (object(), False), (list(range(5000)), False),
])
def test_is_literal(value, expected):
    assert is_literal(value) is expected


def test_every_notebook_function_inside_a_global_dict_is_shipped(monkeypatch):
    ns = run_cells("def f():\n    return 'f'\n", "def g():\n    return 'g'\n", "TABLE = {'f': f, 'g': g}\n",
                   "def work(rank):\n    return TABLE['g']()\n")
    as_main(monkeypatch, ns)
    cap = capture(ns["work"])
    assert [d.split("(")[0] for d in cap.definitions] == ["def f", "def g", "def work"]
    assert list(cap.values) == ["TABLE"]


def test_unpicklable_argument_is_refused_before_any_process():
    ns = run_cells("def work(rank, lock):\n    return rank\n")
    with pytest.raises(CaptureError, match=r"cannot ship an argument.*neither source code nor picklable"):
        capture(ns["work"], args=(threading.Lock(),))
