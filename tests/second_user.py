"""A second, unprivileged Unix user for the shared-machine tests, and what it needs.

The tests run as root (as CI does): ``other_user`` creates the account once with ``useradd``,
and ``as_other`` runs plain shell commands as that user (``runuser``). The other user gets a
world-readable copy of distlab's pure-Python modules (``readable_src``): the checkout itself may
sit under a folder only its owner can enter.
"""
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

OTHER = "distlab-other"
SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(scope="session")
def other_user():
    """An unprivileged account: one that exists already, or one made here for the session and removed
    at its end (with whatever it still runs), as everything a test creates is."""
    try:
        yield pwd.getpwnam(OTHER)
        return
    except KeyError:
        pass
    made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER],
                          capture_output=True, text=True)
    try:
        account = pwd.getpwnam(OTHER)
    except KeyError:
        raise AssertionError(f"could not create the second user: {made.stderr}") from None
    try:
        yield account
    finally:
        subprocess.run(["pkill", "-KILL", "-u", OTHER], capture_output=True)
        subprocess.run(["userdel", OTHER], capture_output=True)


@pytest.fixture
def shared_tmp(monkeypatch):
    """A fresh /tmp-like folder (sticky, world-writable) as tempfile's directory for this test."""
    path = Path(tempfile.mkdtemp(prefix="distlab-shared-test-", dir=world_traversable_tmp()))
    path.chmod(0o1777)
    monkeypatch.setattr("tempfile.tempdir", str(path))
    monkeypatch.delenv("DISTLAB_RUNS", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(path / "root-cache"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def world_traversable_tmp() -> str:
    """The system temp folder (``/tmp``), whatever ``tempfile.tempdir`` a test set."""
    for candidate in (os.environ.get("TMPDIR"), "/tmp", "/var/tmp"):
        if candidate and os.path.isdir(candidate) and os.stat(candidate).st_mode & 0o001:
            return candidate
    raise AssertionError("no temp folder that other users can enter")


@pytest.fixture(scope="session")
def readable_src():
    """A copy of ``src/distlab`` that the other user can read, in a folder it can enter."""
    folder = Path(tempfile.mkdtemp(prefix="distlab-src-copy-", dir=world_traversable_tmp()))
    shutil.copytree(SRC / "distlab", folder / "distlab", ignore=shutil.ignore_patterns("__pycache__"))
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def as_other(command: str, env: dict | None = None, timeout: float = 60, **kwargs):
    """Run a shell command as the other user (never as root)."""
    prefix = ["runuser", "-u", OTHER, "--"]
    if env:
        prefix += ["env", *(f"{k}={v}" for k, v in env.items())]
    return subprocess.run([*prefix, "sh", "-c", command], capture_output=True, text=True, errors="replace",
                          timeout=timeout, **kwargs)


def start_as_other(command: str, env: dict | None = None) -> subprocess.Popen:
    """Like :func:`as_other`, but in the background (an attacker that watches while a run goes)."""
    prefix = ["runuser", "-u", OTHER, "--"]
    if env:
        prefix += ["env", *(f"{k}={v}" for k, v in env.items())]
    return subprocess.Popen([*prefix, "sh", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace", start_new_session=True)


def stop_other(proc: subprocess.Popen) -> str:
    """End a :func:`start_as_other` program and everything it started; its output."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.communicate(timeout=10)[0]
        except subprocess.TimeoutExpired:
            continue
    return proc.communicate()[0]


def other_python() -> str:
    """A Python the other user may execute (this venv may live in root's home)."""
    for candidate in (sys.executable, sys._base_executable, shutil.which("python3", path="/usr/local/bin:/usr/bin")):
        if candidate and as_other(f"{candidate} -c pass").returncode == 0:
            return candidate
    raise AssertionError("no Python that the second user can run")


def write_readable(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    path.chmod(0o644)
    return path
