"""The compile cache's rules, in this process (issue #60: mutated; starts no process): which folder torch.compile's
cache may use, and how torch's ``default_cache_dir`` and what it computed are redirected there. What a real torch
does with it, in fresh interpreters and ranks: tests/test_private_caches.py."""
import getpass
import os
import sys
import tempfile
import types
import warnings

import pytest

from distlab.errors import RunFolderError
from distlab.folders import compile_cache


def test_the_compile_cache_goes_under_the_runs_root_unless_the_user_chose_one(tmp_path):
    assert compile_cache.wanted({}, tmp_path) == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "compile-cache")}
    assert compile_cache.wanted({"TORCHINDUCTOR_CACHE_DIR": "/mine"}, tmp_path) == {}


def test_a_runs_root_that_cannot_be_used_gives_a_fresh_private_folder_not_the_shared_name(monkeypatch):
    def refused():
        raise RunFolderError("no root")

    monkeypatch.setattr("distlab.folders.private.private_root", refused)
    env: dict = {}
    folder = compile_cache.use_private_cache(env)
    try:
        assert env == {"TORCHINDUCTOR_CACHE_DIR": folder} and "torchinductor_" not in folder
        assert os.stat(folder).st_mode & 0o777 == 0o700 and os.stat(folder).st_uid == os.getuid()
    finally:
        os.rmdir(folder)



def test_torch_s_own_default_or_a_folder_others_could_write_counts_as_unset(tmp_path):
    """Before: any TORCHINDUCTOR_CACHE_DIR was the user's choice, torch's shared default included (torch sets
    it when torch._dynamo or torch._inductor is imported before distlab)."""
    root = tmp_path / "root"
    private = {"TORCHINDUCTOR_CACHE_DIR": str(root / "compile-cache")}
    default = compile_cache.shared_default()
    assert default == os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    assert compile_cache.wanted({"TORCHINDUCTOR_CACHE_DIR": default}, root) == private
    opened, mine = tmp_path / "open", tmp_path / "mine"
    opened.mkdir(mode=0o700)
    os.chmod(opened, 0o777)
    mine.mkdir(mode=0o700)
    assert compile_cache.wanted({"TORCHINDUCTOR_CACHE_DIR": str(opened)}, root) == private
    assert compile_cache.distrust(str(opened)) == "is writable by others (mode 777)"
    assert compile_cache.distrust(str(mine)) is None
    assert compile_cache.distrust(str(mine), uid=os.getuid() + 1) == f"belongs to uid {os.getuid()}, not you"
    assert compile_cache.distrust(default).startswith("is torch's shared default")


def test_a_cache_folder_others_could_write_is_replaced_with_a_warning(tmp_path, monkeypatch):
    patched = []
    monkeypatch.setattr(compile_cache, "replace_default_cache_dir", patched.append)
    opened = tmp_path / "open"
    opened.mkdir()
    os.chmod(opened, 0o777)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(opened)}
    with pytest.warns(RuntimeWarning) as caught:
        folder = compile_cache.use_private_cache(env)
    assert str(caught[0].message) == compile_cache.CACHE_REPLACED.format(
        folder=opened, why="is writable by others (mode 777)", private=folder)
    assert env == {"TORCHINDUCTOR_CACHE_DIR": folder} and patched == [folder] and folder != str(opened)


def test_the_user_s_own_folder_is_kept_and_still_gets_the_header_folder(tmp_path, monkeypatch):
    patched = []
    monkeypatch.setattr(compile_cache, "replace_default_cache_dir", patched.append)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "mine")}
    assert compile_cache.use_private_cache(env) is None
    assert env == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "mine")} and patched == [str(tmp_path / "mine")]
    assert os.stat(tmp_path / "mine").st_mode & 0o777 == 0o700  # made by distlab, for you alone


def test_a_torch_that_moved_what_distlab_patches_is_said_not_ignored(tmp_path, monkeypatch):
    """Before: the import hook waited for a module name that a newer torch might not have, and did nothing."""

    moved = types.ModuleType(compile_cache.TORCH_MODULE)  # a torch without default_cache_dir there
    codecache = types.ModuleType(compile_cache.HEADERS_MODULE)
    codecache._HEADER_DIR = os.path.join(compile_cache.shared_default(), "precompiled_headers")
    monkeypatch.setitem(sys.modules, compile_cache.TORCH_MODULE, moved)
    monkeypatch.setitem(sys.modules, compile_cache.HEADERS_MODULE, codecache)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    with pytest.warns(RuntimeWarning) as caught:
        compile_cache.check_loaded(str(tmp_path))
    said = [str(w.message) for w in caught]
    assert said == [compile_cache.CACHE_UNPATCHED.format(what=f"{compile_cache.TORCH_MODULE}.default_cache_dir",
                                                         folder="(not found)", private=tmp_path),
                    compile_cache.CACHE_UNPATCHED.format(what=f"{compile_cache.HEADERS_MODULE}._HEADER_DIR",
                                                         folder=codecache._HEADER_DIR, private=tmp_path)]


# --- which folder: torch's shared name, a folder of someone else's or that others can write ---------

@pytest.mark.parametrize("user, expected", [
    ("ann", "torchinductor_ann"),
    ('a\\b/c:d*e?f"g<h>i|j', "torchinductor_a_b_c_d_e_f_g_h_i_j"),  # torch's own rule for a file name
])
def test_torch_s_shared_default_is_computed_as_torch_does(monkeypatch, user, expected):
    monkeypatch.setattr(getpass, "getuser", lambda: user)
    assert compile_cache.shared_default() == os.path.join(tempfile.gettempdir(), expected)


@pytest.mark.parametrize("error", [KeyError, OSError])
def test_a_user_without_a_name_gets_torch_s_uid_name(monkeypatch, error):
    def nameless():
        raise error("no name")

    monkeypatch.setattr(getpass, "getuser", nameless)
    assert compile_cache.shared_default() == os.path.join(tempfile.gettempdir(), f"torchinductor_uid_{os.getuid()}")


@pytest.mark.parametrize("mode, expected", [
    (0o700, None), (0o755, None), (0o701, None), (0o1700, None),
    (0o770, "is writable by its group (mode 770)"), (0o771, "is writable by its group (mode 771)"),
    (0o720, "is writable by its group (mode 720)"), (0o702, "is writable by others (mode 702)"),
    (0o1777, "is writable by others (mode 777)"), (0o757, "is writable by others (mode 757)"),
])
def test_which_modes_others_could_plant_code_through(tmp_path, mode, expected):
    folder = tmp_path / "cache"
    folder.mkdir()
    os.chmod(folder, mode)
    assert compile_cache.distrust(str(folder)) == expected
    assert compile_cache.distrust(str(folder), uid=os.geteuid()) == expected


def test_a_folder_not_made_yet_or_of_another_uid(tmp_path):
    assert compile_cache.distrust(str(tmp_path / "not yet")) is None
    assert compile_cache.distrust(str(tmp_path / "not yet"), uid=4242) is None
    assert compile_cache.distrust(str(tmp_path), uid=4242) == f"belongs to uid {os.geteuid()}, not you"
    default = compile_cache.shared_default()
    assert compile_cache.distrust(default + "/") == compile_cache.TORCH_DEFAULT  # the same folder, spelled otherwise


# --- setting the variable ----------------------------------------------------------------------------

@pytest.fixture
def patched(monkeypatch):
    """The folders replace_default_cache_dir was given (torch's modules are left alone here)."""
    seen: list = []
    monkeypatch.setattr(compile_cache, "replace_default_cache_dir", seen.append)
    return seen


def test_an_unset_variable_gets_the_cache_under_the_runs_root_silently(tmp_path, monkeypatch, patched):
    monkeypatch.setattr("distlab.folders.private.private_root", lambda: tmp_path)
    env: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compile_cache.use_private_cache(env) == str(tmp_path / "compile-cache")
        assert compile_cache.use_private_cache(env) is None  # the second import: the folder is already ours
    assert env == {compile_cache.ENV: str(tmp_path / "compile-cache")} and patched == [env[compile_cache.ENV]] * 2
    assert os.stat(tmp_path / "compile-cache").st_mode & 0o777 == 0o700


def test_a_second_kernel_finds_the_cache_folder_made(tmp_path, monkeypatch, patched):
    monkeypatch.setattr("distlab.folders.private.private_root", lambda: tmp_path)
    for _kernel in range(2):
        env: dict = {}
        assert compile_cache.use_private_cache(env) == str(tmp_path / "compile-cache")


def test_os_environ_is_the_default(tmp_path, monkeypatch, patched):
    monkeypatch.setattr("distlab.folders.private.private_root", lambda: tmp_path)
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    assert compile_cache.use_private_cache() == str(tmp_path / "compile-cache")
    assert os.environ[compile_cache.ENV] == str(tmp_path / "compile-cache")


def test_without_a_runs_root_a_fresh_private_folder_is_named_as_distlab_s(monkeypatch, patched):
    for error in (RunFolderError("no root"), OSError("no root")):
        def refused(error=error):
            raise error

        monkeypatch.setattr("distlab.folders.private.private_root", refused)
        env: dict = {}
        folder = compile_cache.use_private_cache(env)
        try:
            assert os.path.basename(folder).startswith("distlab-compile-cache-")
            assert os.path.dirname(folder) == tempfile.gettempdir() and env == {compile_cache.ENV: folder}
        finally:
            os.rmdir(folder)


def test_without_a_runs_root_the_user_s_own_folder_is_still_kept(tmp_path, monkeypatch, patched):
    def refused():
        raise RunFolderError("no root")

    monkeypatch.setattr("distlab.folders.private.private_root", refused)
    env = {compile_cache.ENV: str(tmp_path / "mine")}
    assert compile_cache.use_private_cache(env) is None
    assert env == {compile_cache.ENV: str(tmp_path / "mine")} and patched == [str(tmp_path / "mine")]


def test_a_folder_of_your_own_that_cannot_be_made_is_left_to_torch_to_report(tmp_path, monkeypatch, patched):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr("distlab.folders.private.private_root", lambda: tmp_path / "root")
    env = {compile_cache.ENV: str(tmp_path / "file" / "cache")}
    assert compile_cache.use_private_cache(env) is None and patched == [env[compile_cache.ENV]]


def said_by(monkeypatch) -> list:
    """The warnings compile_cache gives, with their stacklevel: where a warning points is checked through the
    level asked for, since under mutation testing each function is reached through wrapper frames."""
    calls: list = []
    monkeypatch.setattr(compile_cache, "warnings", types.SimpleNamespace(warn=lambda *a, **kw: calls.append((a, kw))))
    return calls


def test_the_warning_points_at_the_line_that_imported_distlab(tmp_path, monkeypatch, patched):
    """stacklevel 3: use_private_cache <- distlab/__init__ <- the import (importlib's frames are skipped)."""
    monkeypatch.setattr("distlab.folders.private.private_root", lambda: tmp_path)
    env = {compile_cache.ENV: compile_cache.shared_default()}
    calls = said_by(monkeypatch)
    compile_cache.use_private_cache(env)
    assert calls == [((compile_cache.CACHE_REPLACED.format(folder=compile_cache.shared_default(),
                                                           why=compile_cache.TORCH_DEFAULT,
                                                           private=tmp_path / "compile-cache"), RuntimeWarning),
                      {"stacklevel": 3})]


# --- torch's default_cache_dir, and what torch computed from it ---------------------------------------

def torch_like(name: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    return module


def test_a_module_gets_the_function_and_the_folders_it_has_and_nothing_more(tmp_path):
    folder = str(tmp_path / "cache")
    runtime = torch_like("runtime", default_cache_dir=lambda: "/tmp/torchinductor_x")
    compile_cache._patch(runtime, folder)
    assert runtime.default_cache_dir() == folder and runtime.default_cache_dir.__name__ == "default_cache_dir"
    assert not hasattr(runtime, "_HEADER_DIR") and not hasattr(runtime, "_HEADER_LOCK_DIR")
    codecache = torch_like("codecache", _HEADER_DIR="/tmp/torchinductor_x/precompiled_headers")
    compile_cache._patch(codecache, folder)
    assert codecache._HEADER_DIR == os.path.join(folder, "precompiled_headers")
    assert codecache._HEADER_LOCK_DIR == os.path.join(folder, "precompiled_headers", "locks")
    assert not hasattr(codecache, "default_cache_dir")
    bare = torch_like("bare")
    compile_cache._patch(bare, folder)
    assert vars(bare).keys() == vars(torch_like("bare")).keys()


def test_dynamo_s_cache_moves_only_from_a_folder_it_must_not_use(tmp_path):
    folder = str(tmp_path / "cache")
    shared = types.SimpleNamespace(_path_prefix=os.path.join(compile_cache.shared_default(), "dynamo"))
    package = torch_like("package", DynamoCache=shared)
    compile_cache._patch(package, folder)
    assert shared._path_prefix == os.path.join(folder, "dynamo")
    mine = types.SimpleNamespace(_path_prefix=str(tmp_path / "mine" / "dynamo"))
    compile_cache._patch(torch_like("package", DynamoCache=mine), folder)
    assert mine._path_prefix == str(tmp_path / "mine" / "dynamo")
    compile_cache._patch(torch_like("package", DynamoCache=types.SimpleNamespace()), folder)  # no prefix: nothing


@pytest.fixture
def no_torch(monkeypatch):
    """sys.modules without torch's watched modules, and a meta path of this test's own."""
    for name in compile_cache.WATCHED:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))


def hooks() -> list:
    return [f for f in sys.meta_path if isinstance(f, compile_cache._DefaultCacheDirHook)]


def test_loaded_modules_are_patched_at_once_and_the_others_on_import(tmp_path, monkeypatch, no_torch):
    runtime = torch_like(compile_cache.TORCH_MODULE, default_cache_dir=lambda: "/shared")
    monkeypatch.setitem(sys.modules, compile_cache.TORCH_MODULE, runtime)
    compile_cache.replace_default_cache_dir(str(tmp_path / "a"))
    compile_cache.replace_default_cache_dir(str(tmp_path / "b"))
    assert runtime.default_cache_dir() == str(tmp_path / "b")
    assert len(hooks()) == 1 and sys.meta_path[0] is hooks()[0] and hooks()[0].folder == str(tmp_path / "b")


def test_no_hook_once_every_watched_module_is_loaded(tmp_path, monkeypatch, no_torch):
    modules = {name: torch_like(name, default_cache_dir=lambda: "/shared") for name in compile_cache.WATCHED}
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    sys.meta_path.insert(3, compile_cache._DefaultCacheDirHook("/old"))
    compile_cache.replace_default_cache_dir(str(tmp_path))
    assert hooks() == [] and all(m.default_cache_dir() == str(tmp_path) for m in modules.values())


# --- what a loaded torch will use ---------------------------------------------------------------------

def check(folder) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compile_cache.check_loaded(str(folder))
    return [str(w.message) for w in caught]


def test_the_warnings_point_at_check_loaded_s_caller(tmp_path, monkeypatch, no_torch):
    monkeypatch.setenv(compile_cache.ENV, compile_cache.shared_default())
    monkeypatch.setitem(sys.modules, compile_cache.TORCH_MODULE,
                        torch_like("m", default_cache_dir=lambda: str(tmp_path)))
    calls = said_by(monkeypatch)
    compile_cache.check_loaded(str(tmp_path))
    assert calls == [((unpatched(compile_cache.ENV, compile_cache.shared_default(), tmp_path), RuntimeWarning),
                      {"stacklevel": 2})]


def unpatched(what, folder, private) -> str:
    return compile_cache.CACHE_UNPATCHED.format(what=what, folder=folder, private=private)


def test_a_patched_torch_says_nothing(tmp_path, monkeypatch, no_torch):
    monkeypatch.setitem(sys.modules, compile_cache.TORCH_MODULE,
                        torch_like("m", default_cache_dir=lambda: str(tmp_path / "sub")))
    monkeypatch.setitem(sys.modules, compile_cache.HEADERS_MODULE,
                        torch_like("c", _HEADER_DIR=str(tmp_path / "precompiled_headers")))
    monkeypatch.setenv(compile_cache.ENV, str(tmp_path))
    assert check(tmp_path) == []
    monkeypatch.delenv(compile_cache.ENV)
    assert check(tmp_path) == []


def test_what_a_loaded_torch_would_use_outside_the_cache_is_said(tmp_path, monkeypatch, no_torch):
    shared = compile_cache.shared_default()
    monkeypatch.setitem(sys.modules, compile_cache.TORCH_MODULE, torch_like("m", default_cache_dir=lambda: shared))
    monkeypatch.setitem(sys.modules, compile_cache.HEADERS_MODULE, torch_like("c"))
    monkeypatch.setenv(compile_cache.ENV, shared)
    assert check(tmp_path) == [unpatched(f"{compile_cache.TORCH_MODULE}.default_cache_dir", shared, tmp_path),
                               unpatched(f"{compile_cache.HEADERS_MODULE}._HEADER_DIR", "(not found)", tmp_path),
                               unpatched(compile_cache.ENV, shared, tmp_path)]


def test_an_unloaded_torch_is_checked_on_import_and_a_missing_one_is_said(tmp_path, monkeypatch, no_torch):
    monkeypatch.delenv(compile_cache.ENV, raising=False)
    def spec_of(answer):
        def find_spec(name):
            assert name == compile_cache.TORCH_MODULE
            return answer
        return find_spec

    monkeypatch.setattr(compile_cache.importlib.util, "find_spec", spec_of(object()))  # torch has it: later
    assert check(tmp_path) == []
    monkeypatch.setattr(compile_cache.importlib.util, "find_spec", spec_of(None))  # this torch moved it
    assert check(tmp_path) == [unpatched(f"{compile_cache.TORCH_MODULE}.default_cache_dir", "(not found)", tmp_path)]


# --- the import hook ------------------------------------------------------------------------------------

class Loader:
    def __init__(self):
        self.ran: list = []

    def exec_module(self, module):
        module.default_cache_dir = lambda: "/shared"
        module._HEADER_DIR = "/shared/precompiled_headers"
        self.ran.append(module.__name__)


@pytest.fixture
def found(monkeypatch):
    """importlib's find_spec as the hook calls it: a fresh spec with a :class:`Loader`, the names asked."""
    asked: list = []

    def find_spec(name):
        asked.append(name)
        return types.SimpleNamespace(name=name, loader=Loader())

    monkeypatch.setattr(compile_cache.importlib.util, "find_spec", find_spec)
    return asked


@pytest.fixture
def checked(monkeypatch):
    seen: list = []
    monkeypatch.setattr(compile_cache, "check_loaded", seen.append)
    return seen


@pytest.mark.parametrize("name", compile_cache.WATCHED)
def test_a_watched_module_is_patched_right_after_it_runs(tmp_path, found, checked, name):
    hook = compile_cache._DefaultCacheDirHook(str(tmp_path))
    spec = hook.find_spec(name)
    module = types.ModuleType(name)
    spec.loader.exec_module(module)
    assert spec.loader.ran == [name] and found == [name]
    assert module.default_cache_dir() == str(tmp_path)
    assert module._HEADER_DIR == os.path.join(str(tmp_path), "precompiled_headers")
    assert checked == ([str(tmp_path)] if name in ("torch._inductor", compile_cache.HEADERS_MODULE) else [])


def test_the_hook_finds_nothing_itself(tmp_path, found, monkeypatch):
    hook = compile_cache._DefaultCacheDirHook(str(tmp_path))
    assert hook.find_spec("json") is None and hook.find_spec("torch") is None and found == []
    for spec in (None, types.SimpleNamespace(loader=None), types.SimpleNamespace(loader=object())):
        monkeypatch.setattr(compile_cache.importlib.util, "find_spec", lambda name, spec=spec: spec)
        assert hook.find_spec(compile_cache.TORCH_MODULE) is spec  # nothing it could patch: as found


def test_the_hook_steps_aside_while_it_asks_the_others(tmp_path, monkeypatch):
    """importlib's find_spec walks the meta path, this hook included: asked again meanwhile, it finds nothing."""
    hook = compile_cache._DefaultCacheDirHook(str(tmp_path))
    inner: list = []

    def find_spec(name):
        inner.append(hook.find_spec(name))
        return types.SimpleNamespace(loader=Loader())

    monkeypatch.setattr(compile_cache.importlib.util, "find_spec", find_spec)
    assert hook.find_spec(compile_cache.TORCH_MODULE) is not None
    assert hook.find_spec(compile_cache.TORCH_MODULE) is not None  # and afterwards it watches again
    assert inner == [None, None] and hook._finding == set()
