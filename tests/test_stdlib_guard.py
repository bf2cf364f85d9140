"""distlab's use of multiprocessing's private parts: checked per Python, and the standard behaviour elsewhere.

No process starts here: the resource tracker's ``ensure_running`` is replaced by fakes that record
what they were lent, and the Python version is handed in or faked."""
from __future__ import annotations

import os
import sys
from multiprocessing import resource_tracker, util
from types import SimpleNamespace

import pytest

from distlab.forkserver import mode, stdlib, tracker


@pytest.fixture
def fresh(monkeypatch):
    """Forget what was asked and warned before; give the tracker module a fake tracker instance."""
    tracker.current_problem.cache_clear()
    monkeypatch.setattr(stdlib, "_warned", set())
    monkeypatch.setattr(resource_tracker, "_resource_tracker", SimpleNamespace(_pid=None, _fd=None))
    yield
    tracker.current_problem.cache_clear()


def test_this_python_is_checked_and_has_every_name():
    assert stdlib.missing() == []
    assert sys.version_info[:2] in stdlib.CHECKED
    assert stdlib.problem() is None


def test_an_unknown_python_or_a_missing_name_is_a_reason():
    assert stdlib.problem((3, 15, 0), gone=[]) == (
        "Python 3.15 is not among the versions whose multiprocessing distlab was checked against "
        "(3.10, 3.11, 3.12, 3.13, 3.14)")
    assert stdlib.problem((3, 9, 18), gone=[]).startswith("Python 3.9 is not among")
    assert stdlib.problem((3, 13, 0), gone=["multiprocessing.util.spawnv_passfds"]) == (
        "this Python's multiprocessing lacks multiprocessing.util.spawnv_passfds")
    assert stdlib.problem((3, 14, 2), gone=[]) is None


def test_missing_names_are_found_in_fake_modules():
    import importlib

    modules = {name: importlib.import_module(name) for name in stdlib.SURFACE}
    modules["multiprocessing.util"] = SimpleNamespace()  # a util with nothing in it
    modules["multiprocessing.forkserver"] = SimpleNamespace(
        **{n: None for n in stdlib.SURFACE["multiprocessing.forkserver"] if n != "_forkserver"},
        _forkserver=SimpleNamespace(_forkserver_pid=None))
    gone = stdlib.missing(modules)
    assert "multiprocessing.util.spawnv_passfds" in gone and "multiprocessing.util._close_stdin" in gone
    assert "multiprocessing.forkserver._forkserver._forkserver_alive_fd" in gone
    assert not [g for g in gone if g.startswith(("multiprocessing.spawn", "multiprocessing.forkserver.read"))]


def test_on_an_unchecked_python_the_tracker_starts_the_standard_way_with_a_warning(fresh, monkeypatch):
    lent = []
    monkeypatch.setattr(resource_tracker, "ensure_running", lambda: lent.append(resource_tracker.util))
    monkeypatch.setattr(sys, "version_info", (3, 99, 0, "final", 0))
    with pytest.warns(RuntimeWarning, match=r"Python 3\.99 is not among .*resource tracker starts the "
                                            r"standard way"):
        tracker.ensure_running()
    assert lent == [util]  # multiprocessing's own util: no session of its own


def test_on_a_checked_python_the_tracker_is_lent_distlabs_spawn(fresh, monkeypatch, recwarn):
    lent = []

    def start():
        lent.append(resource_tracker.util)
        resource_tracker._resource_tracker._pid = resource_tracker.util.spawnv_passfds("/bin/true", ["true"], [])

    monkeypatch.setattr(resource_tracker, "ensure_running", start)
    monkeypatch.setattr(tracker, "spawn_in_own_session", lambda path, args, fds: 4242)
    tracker.ensure_running()
    assert isinstance(lent[0], tracker._OwnSession) and resource_tracker.util is util
    assert not [w for w in recwarn if "distlab" in str(w.message)]


def test_a_tracker_started_without_the_lent_spawn_is_a_warning(fresh, monkeypatch):
    def start():  # a changed resource_tracker: spawns some other way
        resource_tracker._resource_tracker._pid = 4343

    monkeypatch.setattr(resource_tracker, "ensure_running", start)
    with pytest.warns(RuntimeWarning, match="started its resource tracker without the spawnv_passfds"):
        tracker.ensure_running()


def test_on_an_unchecked_python_ranks_start_fresh_with_a_warning(fresh, monkeypatch):
    monkeypatch.setattr(sys, "version_info", (3, 99, 0, "final", 0))
    with pytest.warns(RuntimeWarning, match=r"Python 3\.99 .*ranks start as fresh interpreters"):
        works = mode.forkserver_works()
    assert works is False
    assert mode.resolve_start("auto", env={}, platform="linux", forkserver_works=works) == "spawn"


def test_distlab_never_asks_multiprocessing_for_its_default_start_method():
    """Python 3.14 makes forkserver the default on Linux: distlab names a start method everywhere."""
    import re
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "distlab"
    bare = re.compile(r"(?<!def )get_context\(\s*\)|multiprocessing\.(Process|Pool|Queue|SimpleQueue|Manager)\(")
    found = [f"{p.relative_to(src)}:{i}" for p in src.rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if bare.search(line) and "forkserver.get_context()" not in line]
    assert found == []


def test_a_module_that_is_gone_is_named_and_the_others_still_checked():
    import importlib

    modules = {name: importlib.import_module(name) for name in stdlib.SURFACE}
    del modules["multiprocessing.forkserver"]  # cannot be imported: named once, its instance skipped
    modules["multiprocessing.spawn"] = SimpleNamespace()  # checked after it
    gone = stdlib.missing(modules)
    assert gone == ["multiprocessing.forkserver", "multiprocessing.spawn._main", "multiprocessing.spawn.get_executable"]


def test_a_module_without_its_instance_has_no_fields_to_check():
    import importlib

    modules = {name: importlib.import_module(name) for name in stdlib.SURFACE}
    modules["multiprocessing.resource_tracker"] = SimpleNamespace(
        **{n: None for n in stdlib.SURFACE["multiprocessing.resource_tracker"] if n != "_resource_tracker"})
    assert stdlib.missing(modules) == ["multiprocessing.resource_tracker._resource_tracker"]


def test_every_name_gone_is_listed_and_by_default_this_python_is_asked(monkeypatch):
    assert stdlib.problem((3, 13, 0), gone=["a.b", "c.d"]) == "this Python's multiprocessing lacks a.b, c.d"
    monkeypatch.setattr(stdlib, "missing", lambda: ["multiprocessing.util.close_fds"])
    assert stdlib.problem((3, 13, 0)) == "this Python's multiprocessing lacks multiprocessing.util.close_fds"


def test_a_warning_is_given_once_and_points_at_the_caller_of_distlabs_function(fresh, monkeypatch):
    def distlab_function():
        stdlib.warn_once("a reason", "a fallback")

    with pytest.warns(RuntimeWarning) as caught:
        distlab_function()  # the line the warning names
        distlab_function()
    assert [str(w.message) for w in caught] == ["distlab: a reason; a fallback"]
    if "MUTANT_UNDER_TEST" not in os.environ:  # mutmut calls every function through frames of its own
        named = open(__file__).read().splitlines()[caught[0].lineno - 1]
        assert caught[0].filename == __file__ and "distlab_function()  # the line the warning names" in named
    levels: list = []  # and the level asked for, which holds under mutation too
    monkeypatch.setattr(stdlib, "_warned", set())
    monkeypatch.setattr(stdlib.warnings, "warn", lambda *args, stacklevel=1: levels.append(stacklevel))
    distlab_function()
    assert levels == [3]  # warn_once <- distlab's function <- its caller
