"""Temporary files and torch.compile's cache of every process distlab (or the book) starts stay in
the user's private runs root, not in the shared temp folder where another user could plant them."""
import ast
import getpass
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from second_user import as_other

import distlab
from distlab.folders import compile_cache, privtmp

# --- the compile cache in fresh interpreters (its pure rules: tests/test_compile_cache.py) ---------


BEFORE_DISTLAB = """
    import os, sys, warnings
    warnings.simplefilter("always")
    import torch._dynamo  # torch.compile's first import: torch sets TORCHINDUCTOR_CACHE_DIR to its shared default
    shared = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    with warnings.catch_warnings(record=True) as said:
        import distlab
    import torch._inductor.codecache as codecache
    from torch._inductor.runtime import cache_dir_utils, runtime_utils
    from torch._dynamo.package import DynamoCache
    print(repr({"shared": shared, "env": os.environ["TORCHINDUCTOR_CACHE_DIR"], "said": [str(w.message) for w in said],
                "defaults": [cache_dir_utils.default_cache_dir(), runtime_utils.default_cache_dir(),
                             codecache.default_cache_dir()],
                "headers": codecache._HEADER_DIR, "dynamo": DynamoCache.path_prefix()}))
"""


@pytest.mark.slow
def test_torch_imported_before_distlab_still_compiles_into_the_private_cache(shared_tmp):
    done = _fresh_python(BEFORE_DISTLAB, _env_in(shared_tmp))
    assert done.returncode == 0, done.stderr[-3000:]
    seen = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    private = seen["env"]
    assert private != seen["shared"] and not private.startswith(str(shared_tmp / "torchinductor_")), seen
    assert seen["said"] == [compile_cache.CACHE_REPLACED.format(
        folder=seen["shared"], why=compile_cache.TORCH_DEFAULT, private=private)]
    assert seen["defaults"] == [private] * 3
    assert seen["headers"] == os.path.join(private, "precompiled_headers")
    assert seen["dynamo"] == os.path.join(private, "dynamo")


@pytest.mark.slow
def test_a_cache_folder_the_user_chose_gets_the_precompiled_headers_too(tmp_path):
    """Before: with TORCHINDUCTOR_CACHE_DIR set, the headers still went to <tmp>/torchinductor_<user>."""
    mine = tmp_path / "mine"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(mine)}
    done = _fresh_python("import distlab, torch._inductor.codecache as c; print(c._HEADER_DIR)", env)
    assert done.stdout.strip() == str(mine / "precompiled_headers"), done.stderr[-3000:]

def _fresh_python(code: str, env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _env_in(shared_tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISTLAB_RUNS", "XDG_RUNTIME_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    env.update(TMPDIR=str(shared_tmp), XDG_CACHE_HOME=str(shared_tmp / "root-cache"))
    return env


@pytest.mark.slow
def test_a_compile_never_uses_an_inductor_folder_another_user_made_first(other_user, shared_tmp):

    planted = shared_tmp / f"torchinductor_{getpass.getuser()}"  # the name torch would use
    made = as_other(f"mkdir -m 0777 {planted} && chmod 0777 {planted}")
    assert made.returncode == 0 and planted.stat().st_uid == other_user.pw_uid, made.stderr
    done = _fresh_python("""
        import os, distlab, torch
        f = torch.compile(lambda x: x.sin() + 1)
        assert torch.equal(f(torch.ones(3)), torch.ones(3).sin() + 1)
        print(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    """, _env_in(shared_tmp))
    assert done.returncode == 0, done.stderr[-3000:]
    cache = Path(done.stdout.split()[-1])
    assert list(planted.iterdir()) == [], "the compile wrote into the other user's folder"
    assert cache.is_dir() and any(cache.rglob("*.py")), "nothing compiled into the private cache"
    assert cache.parent.stat().st_uid == os.getuid() and cache.parent.stat().st_mode & 0o077 == 0


def test_the_user_s_own_compile_cache_folder_is_kept(tmp_path):
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "mine")}
    done = _fresh_python("import os, distlab; print(os.environ['TORCHINDUCTOR_CACHE_DIR'])", env, timeout=60)
    assert done.stdout.strip() == str(tmp_path / "mine"), done.stderr


# --- what ranks get -------------------------------------------------------------------------------

def where_temp_and_cache_are(rank=None):
    import os

    return {"tmp": tempfile.gettempdir(), "TMPDIR": os.environ.get("TMPDIR"),
            "cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR"), "runs": os.environ.get("DISTLAB_RUNS")}


@pytest.mark.slow
@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_every_rank_has_its_temporary_files_and_compile_cache_in_the_private_root(start):
    from distlab.folders.private import private_root

    root = private_root()
    seen = distlab.spawn(where_temp_and_cache_are, nprocs=2, view=None, start=start).returns
    for rank, got in seen.items():
        assert Path(got["tmp"]).parent == root and Path(got["tmp"]).name.startswith("proc-"), (rank, got)
        assert got["TMPDIR"] == got["tmp"] and got["runs"] == str(root)
        assert got["cache"] == os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(root / "compile-cache")
    assert os.environ.get("TMPDIR") != seen[0]["TMPDIR"]  # the kernel's own environment is as it was


@pytest.mark.slow
def test_warm_ranks_have_their_temporary_files_in_the_private_root():
    from distlab.folders.private import private_root

    with distlab.Ranks(2) as ranks:
        seen = ranks.run(where_temp_and_cache_are)
    for got in seen.values():
        assert Path(got["tmp"]).parent == private_root() and got["TMPDIR"] == got["tmp"]


def test_a_block_of_private_temporary_files_gives_children_its_folder_and_restores_the_environment(monkeypatch):
    monkeypatch.setenv("TMPDIR", "/somewhere")
    monkeypatch.delenv("DISTLAB_RUNS", raising=False)
    with privtmp.private_tempfiles() as folder:
        with privtmp.private_tempfiles():  # nested: the same folder, restored once at the end
            seen = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                                  capture_output=True, text=True, check=True).stdout.strip()
        assert os.environ["TMPDIR"] == str(folder)
    assert seen == str(folder) and os.environ["TMPDIR"] == "/somewhere" and "DISTLAB_RUNS" not in os.environ


# --- torch's error files, outside distlab's launcher ------------------------------------------------

RECORD_ERROR_FILES = """
import tempfile
made = []
_named = tempfile.NamedTemporaryFile
def recording(*args, **kwargs):
    f = _named(*args, **kwargs)
    made.append(f.name)
    return f
tempfile.NamedTemporaryFile = recording
"""


@pytest.mark.slow
def test_the_intro_s_failing_mp_spawn_keeps_torch_s_error_files_private(shared_tmp):
    done = _fresh_python(RECORD_ERROR_FILES + textwrap.dedent("""
        import torch.multiprocessing as mp
        from distlab.folders.private import private_root
        from distlab.teach.intro import child_stderr
        with child_stderr() as said:
            try:
                mp.spawn(print, nprocs=2)  # fails in the children: a builtin is fine, the point is where files go
            except Exception:
                pass
        print(private_root())
        print(made)
    """), _env_in(shared_tmp))
    assert done.returncode == 0, done.stderr[-3000:]
    root, made = done.stdout.strip().splitlines()[-2:]
    made = eval(made)  # a list of paths, printed by the child above
    assert made and all(Path(name).parent.parent == Path(root) for name in made), (root, made)


@pytest.mark.slow
def test_a_script_s_own_mp_spawn_writes_torch_s_error_files_in_the_private_root(tmp_path):
    script = tmp_path / "spawns.py"
    script.write_text(RECORD_ERROR_FILES + textwrap.dedent("""
        import torch.multiprocessing as mp

        def work(rank):
            pass

        if __name__ == "__main__":
            mp.spawn(work, nprocs=2)
            print("ERRORFILES", made)
    """))
    from distlab.folders.private import private_root

    res = distlab.run_script(script, nproc_per_node=1, mode="python", view=None)
    line = next(line for line in res.logs[0].splitlines() if line.startswith("ERRORFILES"))
    made = eval(line.split(" ", 1)[1])
    assert len(made) == 2 and all(Path(name).parent.parent == private_root() for name in made), made
