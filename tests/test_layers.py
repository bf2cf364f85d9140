"""The engine's shape: folders in layers (import-linter's contracts), no import circle, no borrowed
private name, and no module or file named in a string that does not exist.

The contracts live in pyproject.toml ([tool.importlinter]); each is shown to catch the import it
forbids, in a copy of the package with that one import added.
"""
from __future__ import annotations

import ast
import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
sys.path.insert(0, str(REPO / "bench"))
import import_graph  # noqa: E402  (bench/import_graph.py: the measure the README's "Layout" quotes)

LINT = Path(sys.executable).with_name("lint-imports")


def lint(src: Path, *contracts: str) -> subprocess.CompletedProcess:
    """``lint-imports`` on the package under ``src``, with the contracts of pyproject.toml."""
    args = [str(LINT), str(REPO / "pyproject.toml"), "--no-cache", *(f"--contract={c}" for c in contracts)]
    return subprocess.run(args, cwd=src, env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300)


def test_the_import_contracts_hold():
    done = lint(SRC)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"Contracts: 3 kept, 0 broken", done.stdout), done.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("errors.py", "import distlab.api", "layers"),                       # a lower layer imports a higher one
    ("launch/watch.py", "from distlab.warm import proto", "layers"),      # launch and warm never each other
    ("config.py", "import distlab", "face"),                              # the engine imports the face
    ("warm/loop.py", "from distlab.warm import ranks", "rank-side"),      # a rank imports the front end
    ("worker.py", "from distlab.view import display", "rank-side"),
])
def test_each_contract_catches_the_import_it_forbids(tmp_path, module, line, contract):
    shutil.copytree(SRC / "distlab", tmp_path / "distlab", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "distlab" / module
    target.write_text(target.read_text() + f"\n{line}  # added by the test\n")
    done = lint(tmp_path, contract)
    assert done.returncode == 1 and "BROKEN" in done.stdout, done.stdout + done.stderr


def test_a_folder_missing_from_the_layers_breaks_the_contract(tmp_path):
    """exhaustive: a new folder must be given its place in the order before anything passes."""
    shutil.copytree(SRC / "distlab", tmp_path / "distlab", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "distlab" / "newfolder").mkdir()
    (tmp_path / "distlab" / "newfolder" / "__init__.py").write_text('"""A folder with no layer yet."""\n')
    done = lint(tmp_path, "layers")
    assert done.returncode == 1 and "newfolder" in done.stdout, done.stdout


def test_no_import_circle_and_at_most_ten_floors():
    whole = import_graph.import_graph()
    assert import_graph.circles(whole) == []
    engine = import_graph.engine_only(whole)
    assert import_graph.floors(engine) <= 10, import_graph.longest_chain(engine)


def test_floors_and_circles_are_measured_right():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"b"}, "d": set()}
    assert import_graph.circles(edges) == [["b", "c"]]
    assert import_graph.floors(edges) == 2 and import_graph.arrows(edges) == 3
    assert import_graph.longest_chain({"a": {"b"}, "b": {"c"}, "c": set()}) == ["a", "b", "c"]


def private_borrowings(path: Path) -> list[str]:
    """``module._name`` uses and ``from distlab.x import _name`` imports of another distlab module's
    private names in one file (``_name``, not dunders)."""
    tree = ast.parse(path.read_text())
    modules, found = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("distlab"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.name}:{node.lineno}: from {node.module} import {alias.name}")
                modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            names = [a for a in node.names if a.name.startswith("distlab")]
            modules.update({a.asname or a.name.split(".")[0]: a.name for a in names})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_borrows_another_modules_private_names():
    found = [b for p in sorted((SRC / "distlab").rglob("*.py")) for b in private_borrowings(p)]
    assert found == []


def test_a_borrowed_private_name_is_found(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from distlab import worker\nimport distlab.worker\nfrom distlab.x import _y\n"
                 "worker._die()\ndistlab.worker._z()\nworker.public()\n")
    assert private_borrowings(f) == ["m.py:3: from distlab.x import _y", "m.py:4: worker._die",
                                     "m.py:5: distlab.worker._z"]


DOTTED = re.compile(r"(?<![\w./-])distlab(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w.-])distlab/[\w/]+\.py")
NOT_NAMES = {  # strings that look like module names on purpose
    "distlab.nowhere___",  # tests/test_ranks_pure.py: a class a rank cannot find
    "distlab.capture.collect.x_compact__mutmut_3",  # bench/mutation.py: a mutant's name, as mutmut writes it
}


def named_in_text() -> dict[str, set[str]]:
    """Every ``distlab.x.y`` and ``distlab/x/y.py`` in the code, tests, benches, book and README."""
    files = [*(SRC / "distlab").rglob("*.py"), *(REPO / "tests").glob("*.py"), *(REPO / "bench").glob("*.py"),
             *(REPO / "book").glob("*.ipynb"), *(REPO / "book").glob("*.md"), REPO / "README.md",
             REPO / "pyproject.toml"]
    found: dict[str, set[str]] = {}
    for f in [f for f in files if f.name != Path(__file__).name]:  # this file names stale ones on purpose
        text = f.read_text()
        for name in {*DOTTED.findall(text), *PATH.findall(text)}:
            found.setdefault(name, set()).add(str(f.relative_to(REPO)))
    return found


def resolves(name: str) -> bool:
    """An importable module, or an attribute of one (``distlab.errors.PortInUseError``)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_module_and_file_named_in_a_string_exists():
    """`-m` entry points, the server's `python -c` code and preload list, command-line matches,
    sys.modules lookups, the frame filters' file tuples, and every docstring that names a module."""
    found = named_in_text()
    assert "distlab/worker.py" in found and "distlab.launch.rank" in found  # the scan sees them
    missing = {n: sorted(where) for n, where in found.items() if n not in NOT_NAMES
               and not ((SRC / n).is_file() if n.endswith(".py") else resolves(n))}
    assert missing == {}


def test_a_stale_name_in_a_string_is_caught():
    assert not resolves("distlab.rank_proto") and not resolves("distlab.warm.proto.nothing_here")
    assert resolves("distlab.warm.proto") and resolves("distlab.errors.PortInUseError")
    assert DOTTED.findall('"from distlab._forkserver_main import main"') == ["distlab._forkserver_main"]
    assert PATH.findall('("/src/distlab/_spare_rank.py", "distlab/worker.py")') == [
        "distlab/_spare_rank.py", "distlab/worker.py"]


ENGINE_FOLDERS = ("capture", "folders", "rendezvous", "view", "forkserver", "launch", "warm")


@pytest.mark.parametrize("folder", ENGINE_FOLDERS)
def test_each_folder_init_is_a_docstring_naming_every_module_and_what_it_may_import(folder):
    init = SRC / "distlab" / folder / "__init__.py"
    tree = ast.parse(init.read_text())
    assert len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr), f"{init}: a docstring only, no code"
    doc = ast.get_docstring(tree)
    modules = sorted(p.stem for p in init.parent.glob("*.py") if p.name != "__init__.py")
    assert modules and [m for m in modules if f"``{m}``" not in doc] == []
    assert "May import:" in doc


def test_every_engine_folder_has_its_layer_and_its_init():
    """A folder without __init__.py would be left out of a wheel (setuptools finds packages by it)."""
    folders = sorted(p.name for p in (SRC / "distlab").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert all((SRC / "distlab" / f / "__init__.py").is_file() for f in folders)
    assert set(ENGINE_FOLDERS) <= set(folders)


def test_the_face_keeps_its_names_and_adds_the_errors_a_learner_catches():
    import distlab
    from distlab.warm import errors

    assert {"spawn", "launch", "run_script", "device", "backend", "report", "RunResult", "PendingRun", "Ranks",
            "DistlabError", "LaunchArgumentError", "CaptureError", "WorkerFailedError",
            "WorkerTimeoutError"} <= set(distlab.__all__)
    assert all(hasattr(distlab, name) for name in distlab.__all__)
    assert (distlab.RankError, distlab.RanksTimeoutError, distlab.RanksStoppedError) == (
        errors.RankError, errors.RanksTimeoutError, errors.RanksStoppedError)
    assert distlab.device is distlab.config.device and "device" not in vars(distlab.api)
