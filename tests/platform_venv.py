"""The platforms' own software in a venv: the pins of ``tests/constraints-platform.txt`` (Colab's runtime).

torch 2.11.0 installs as PyPI's CUDA build, about 5 GB and 3 minutes, so the venv is built once per machine
and kept under ``~/.cache/distlab/`` (``$XDG_CACHE_HOME`` is honoured), in a folder named by a hash of the
pins and of this Python: other pins or another Python get a new venv (the old one is removed), a new machine
builds it from scratch.
It holds what a platform has and nothing of distlab's: a chapter installs distlab itself, into a copy of
its own (:func:`layer`), so the cached venv never changes after it is built.

    python tests/platform_venv.py        # builds it (if needed) and prints its folder
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import subprocess
import sys
from pathlib import Path

PINS = Path(__file__).with_name("constraints-platform.txt")
DONE = "built-from.txt"   # written last: a folder without it is a build that did not finish


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "distlab"


def folder() -> Path:
    """Where the venv for these pins and this Python lives."""
    key = hashlib.sha256(PINS.read_bytes() + f"{sys.version} {platform.machine()}".encode()).hexdigest()[:16]
    return cache_root() / f"platform-{key}"


def pins() -> dict[str, str]:
    """``{name: version}`` of the pins file, names as pip normalises them."""
    found = {}
    for line in PINS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            found[normalise(name)] = version.strip()
    return found


def normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


def ensure(log=print) -> Path:
    """The built venv, building it first when this machine has none for these pins (minutes)."""
    venv = folder()
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)            # two runs at once build it once
        if not (venv / DONE).exists():
            log(f"building the platform venv at {venv} from {PINS.name} (torch's CUDA build: minutes, GBs)")
            _build(venv)
            _remove_others(venv)
    return venv


def _remove_others(venv: Path) -> None:
    """The venvs of earlier pins (5 GB each): one is kept per machine."""
    for other in venv.parent.glob("platform-*"):
        if other.name not in (venv.name, f"{venv.name}.lock"):
            subprocess.run(["rm", "-rf", str(other)], check=False)


def _build(venv: Path) -> None:
    subprocess.run(["rm", "-rf", str(venv)], check=True)   # what an interrupted build left
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "-r", str(PINS)], check=True)
    (venv / DONE).write_text(PINS.read_text())


def layer(venv: Path, into: Path) -> Path:
    """A copy of ``venv`` at ``into`` for one chapter, made of hard links (a second, not 5 GB); its python.

    A chapter's ``%pip install`` changes the copy, never the cached venv: pip writes new files and
    unlinks old ones, it never writes into an installed file. The copy is a venv of its own, as a
    platform's Python is, so its ``site-packages`` is all a process needs (a Slurm job's ``PYTHONPATH``
    included). Console scripts are rewritten to start the copy's python."""
    done = subprocess.run(["cp", "-al", str(venv), str(into)], capture_output=True, text=True)
    if done.returncode != 0:                      # another file system: a real copy
        subprocess.run(["rm", "-rf", str(into)], check=True)
        subprocess.run(["cp", "-a", str(venv), str(into)], check=True)
    (into / DONE).unlink()
    old, new = f"#!{venv}/bin/".encode(), f"#!{into}/bin/".encode()
    for script in (into / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        text = script.read_bytes()
        if text.startswith(old):
            script.unlink()                       # a new file: the cached venv's stays as it is
            script.write_bytes(new + text[len(old):])
            script.chmod(0o755)
    return into / "bin" / "python"


if __name__ == "__main__":
    print(ensure(log=lambda line: print(line, file=sys.stderr)))
