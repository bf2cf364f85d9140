"""The platform stack: each chapter alone, on the platforms' own software, in a default container.

What a learner who clicks "Open in Colab" gets, as near as this machine comes: for each chapter

- a fresh copy of the platform venv (:mod:`platform_venv`: Colab's pins, torch 2.11.0, no distlab);
- the notebook alone in an empty folder;
- a kernel on that venv's python (ipykernel 6.17), run by nbclient from the book's venv;
- inside the sandbox that refuses namespaces as a default container does (container_sandbox.c), as root;
- the book served on 127.0.0.1 (:func:`serve`) and ``DISTLAB_BOOK`` pointing the first cell there, so that
  the cell installs distlab from the built book's wheel.

:func:`run_alone` returns how long the chapter ran, where it stopped (:func:`stopped_at`: which cell, which
error) and which of the platform's own packages the install replaced (:func:`replaced`).
"""
from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import platform_venv
from nbrun import _cell_seconds
from platform_run import REPO, build_sandbox, run_chapter

#: a line that names a raised exception: ``TypeError: ...``, ``torch.distributed.DistBackendError: ...``
RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*")
#: what a platform-stack run gave, per chapter, for the test session's summary (conftest.py)
RESULTS: dict[str, dict] = {}


@contextlib.contextmanager
def serve(folder: Path):
    """Serve ``folder`` over HTTP on 127.0.0.1 (a free port) while the block runs; yields its address."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def kernel_folder(python: Path, folder: Path) -> Path:
    """A Jupyter data folder whose ``python3`` kernel runs ``python`` (put it on JUPYTER_PATH)."""
    spec = folder / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)", "language": "python"}))
    return folder


def run_alone(chapter: str, venv: Path, book_url: str, wrap, timeout: float = 900) -> dict:
    """Run All of ``book/<chapter>.ipynb`` alone on a copy of ``venv``; see the module docstring.

    Everything lives in a fresh folder that the Slurm job user can read (a job runs the notebook's python),
    removed afterwards."""
    work = Path(tempfile.mkdtemp(prefix="distlab-platform-"))
    try:
        work.chmod(0o755)
        python = platform_venv.layer(venv, work / "venv")
        env = {"DISTLAB_BOOK": book_url, "JUPYTER_PATH": str(kernel_folder(python, work / "jupyter")),
               "PATH": search_path(python.parent), "PYTHONPATH": "", "VIRTUAL_ENV": str(work / "venv")}
        run = run_chapter(wrap, chapter, work, timeout=timeout, env=env, alone=True)
        run["stopped"] = stopped_at(run["notebook"]) if run["error"] else None
        run["install_seconds"] = next(iter(_cell_seconds(run["notebook"])), 0.0)
        run["replaced"] = replaced(python)
        return run
    finally:
        shutil.rmtree(work, ignore_errors=True)


def search_path(venv_bin: Path) -> str:
    """PATH with the platform's python first and nothing of the book's venv (tests/run.sh puts it first):
    a chapter that runs ``python`` or ``torchrun`` must get the platform's, as on Colab."""
    ours = str(Path(sys.executable).parent)
    kept = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != ours]
    return os.pathsep.join([str(venv_bin), *kept])


def stopped_at(nb) -> str:
    """Where Run All stopped: ``code cell N (first line): Error: message``."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    for number, cell in enumerate(code, 1):
        if "raises-exception" in cell.get("metadata", {}).get("tags", []):
            continue                                      # it raises on purpose, and Run All goes on
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                first = next((line for line in cell.source.splitlines() if line.strip()), "")
                said = [line.strip() for line in out["evalue"].splitlines() if line.strip()] or [""]
                raised = [line for line in said[1:] if RAISED.match(line)]         # a rank's own error, last raised
                error = f"{said[0]} ... {raised[-1]}" if raised else said[0]
                return f"code cell {number} of {len(code)} ({first[:60]}): {out['ename']}: {error[:400]}"
    ran = sum(bool(c.get("execution_count")) for c in code)
    return f"after code cell {ran} of {len(code)}, without an error output (a timeout or a dead kernel?)"


def replaced(python: Path) -> dict[str, tuple[str, str]]:
    """The platform's pinned packages that are now another version in ``python``'s venv: {name: (pin, now)}."""
    code = ("import importlib.metadata as m, json; "
            "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120, check=True)
    have = {platform_venv.normalise(name): version for name, version in json.loads(done.stdout).items()}
    return {name: (pin, have.get(name, "missing")) for name, pin in platform_venv.pins().items()
            if have.get(name, "missing").split("+")[0] != pin}


def summary(results: dict[str, dict]) -> list[str]:
    """One line per chapter (seconds, reached the end or where it stopped), and the total."""
    lines = []
    for chapter, run in results.items():
        what = "reached the end" if not run["error"] else f"STOPPED at {run['stopped']}"
        what += f" (install cell {run['install_seconds']:.1f} s)"
        if run["replaced"]:
            what += f"; the install replaced {run['replaced']}"
        lines.append(f"{run['seconds']:6.1f} s  {chapter}  {what}")
    total = sum(run["seconds"] for run in results.values())
    ok = sum(not run["error"] for run in results.values())
    lines.append(f"{total:6.1f} s  {ok} of {len(results)} reached the end")
    return lines


def main(args: list[str]) -> int:
    """``python tests/platform_stack.py [--site BUILT_HTML] CHAPTER...`` (e.g. ``10_performance_lab``).

    Without ``--site``, the site is only the wheel under ``_static/`` (book/wheel.py), not the whole book:
    for trying a chapter while writing it. Needs root, gcc and capsh, as the test does."""
    site = Path(args[args.index("--site") + 1]) if "--site" in args else None
    chapters = [a for a in args if not a.startswith("--") and (site is None or a != str(site))]
    venv = platform_venv.ensure(log=lambda line: print(line, file=sys.stderr))
    with tempfile.TemporaryDirectory(prefix="distlab-stack-") as folder:
        if site is None:
            sys.path.insert(0, str(REPO / "book"))
            import wheel

            site = Path(folder) / "site"
            wheel.build(site / "_static")
        sandbox = build_sandbox(Path(folder))
        with serve(site) as url:
            for chapter in chapters:
                RESULTS[chapter] = run_alone(chapter, venv, url, lambda command: [str(sandbox), command])
                print(summary({chapter: RESULTS[chapter]})[0], flush=True)
    print("\n".join(summary(RESULTS)))
    return 0 if all(not run["error"] and not run["replaced"] for run in RESULTS.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
