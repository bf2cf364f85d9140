"""Every chapter on every torch a learner's platform has (issue 56): which reach their last cell.

Each torch lives in a virtual environment of its own, ``<venvs>/torch-<version>``, with the book's
other requirements (``requirements.txt`` without its torch line) and this checkout installed in
editable mode. ``--build`` makes the missing ones (a CUDA build from PyPI is several GB: minutes).
Every chapter runs in that environment the way the test suite runs it (``tests/nbrun.py``: a fresh
kernel, the solutions too), one chapter at a time under ``nice``, and the table says for each
chapter and torch: reached the end (seconds), or the cell it stopped at and its error.

    python bench/torch_matrix.py --venvs DIR                        # 2.11.0 2.13.0 2.14.1 2.15.0
    python bench/torch_matrix.py --venvs DIR --build --torch 2.11.0 --torch 2.15.0
    python bench/torch_matrix.py --venvs DIR --chapters 05_collectives 12_beyond_data_parallel
    python bench/torch_matrix.py --venvs DIR --results matrix.json  # keeps each result; a rerun skips them

``--pip-no-config`` builds with ``PIP_CONFIG_FILE`` set to the null device, for a machine whose pip
configuration caps torch below the version asked for. Slow: the whole book once per torch.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSIONS = ("2.11.0", "2.13.0", "2.14.1", "2.15.0")  # Colab's, the book's, the two newer releases
ERROR_CHARS = 110  # of a failing cell's last error line, in the table


def requirements_without_torch(text: str) -> list[str]:
    """The lines of ``requirements.txt`` a matrix environment installs besides its own torch: no torch
    pin, no comment, no ``-e .`` (the checkout is installed by its absolute path instead)."""
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        name = line.split("==")[0].split(">")[0].split("<")[0].strip().lower()
        if line and name != "torch" and not line.startswith("-e"):
            out.append(line)
    return out


def install_command(venv: Path, version: str, root: Path = ROOT) -> list[str]:
    reqs = requirements_without_torch((root / "requirements.txt").read_text())
    return [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", f"torch=={version}", *reqs,
            "-e", str(root)]


def build(venv: Path, version: str, no_config: bool) -> None:
    """``python3 -m venv`` and one pip install; a failed install leaves no half environment behind."""
    env = dict(os.environ, **({"PIP_CONFIG_FILE": os.devnull} if no_config else {}))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    done = subprocess.run(["nice", *install_command(venv, version)], env=env)
    if done.returncode:
        import shutil

        shutil.rmtree(venv, ignore_errors=True)
        raise SystemExit(f"pip could not install torch=={version} into {venv} (exit {done.returncode}); "
                         "see pip's message above (--pip-no-config if this machine's pip caps torch)")


def failed_cell(cells: list[dict]) -> tuple[int, str] | None:
    """(index, last line of its error) of the first code cell whose outputs hold an error, else None.
    ``cells`` are a notebook's cells as nbrun left them (indices are the chapter file's own)."""
    for i, cell in enumerate(cells):
        for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            if out.get("output_type") == "error":
                return i, f"{out.get('ename', 'Error')}: {out.get('evalue', '')}".strip().splitlines()[-1]
    return None


def cell(result: dict | None) -> str:
    """One table cell: ``✓ 36 s``, ``✗ cell 26: TypeError: ...``, or ``not run``."""
    if result is None:
        return "not run"
    if result["ok"]:
        return f"✓ {result['seconds']:.0f} s"
    where = f"cell {result['cell']}" if result.get("cell") is not None else "before any cell"
    error = result["error"].replace("|", "\\|")
    error = error if len(error) <= ERROR_CHARS else error[: ERROR_CHARS - 1] + "…"
    return f"✗ {where}: {error} ({result['seconds']:.0f} s)"


def table(results: dict, chapters: list[str], versions: list[str]) -> str:
    """Markdown: one row per chapter, one column per torch; ``results[(chapter, version)]``."""
    lines = ["| chapter | " + " | ".join(f"torch {v}" for v in versions) + " |",
             "|---|" + "---|" * len(versions)]
    for chapter in chapters:
        lines.append(f"| {chapter} | " + " | ".join(cell(results.get((chapter, v))) for v in versions) + " |")
    ends = [sum(1 for c in chapters if (results.get((c, v)) or {}).get("ok")) for v in versions]
    lines.append("| reached the end | " + " | ".join(f"{n} of {len(chapters)}" for n in ends) + " |")
    return "\n".join(lines)


def run_one(python: Path, chapter: Path, timeout: float) -> dict:
    """Run one chapter in another environment's Python (this file's ``--one``): its JSON result."""
    start = time.perf_counter()
    try:
        done = subprocess.run(["nice", str(python), str(Path(__file__).resolve()), "--one", str(chapter)],
                              capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"ok": False, "cell": None, "error": f"no result in {timeout:.0f} s", "seconds": timeout}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"ok": False, "cell": None, "error": tail, "seconds": time.perf_counter() - start}


def one(chapter: str) -> None:
    """``--one``: executes one chapter here (in the environment under test) and prints its result."""
    sys.path.insert(0, str(ROOT / "tests"))
    import torch
    from nbrun import execute

    run = execute(Path(chapter))
    failed = failed_cell(run.notebook.cells) if run.error else None
    if failed is None and run.error:  # a timeout, a dead kernel: no cell holds the error
        failed = (None, (run.error.strip().splitlines() or ["error"])[0])
    print(json.dumps({"ok": run.error is None, "seconds": run.seconds, "torch": torch.__version__,
                      "cell": failed[0] if failed else None, "error": failed[1] if failed else None}))


def load(path: Path | None) -> dict:
    if path is None or not path.exists():
        return {}
    return {tuple(k.split("@")): v for k, v in json.loads(path.read_text()).items()}


def save(path: Path | None, results: dict) -> None:
    if path is not None:
        path.write_text(json.dumps({f"{c}@{v}": r for (c, v), r in results.items()}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venvs", type=Path, help="folder of the torch-<version> environments")
    parser.add_argument("--torch", action="append", dest="versions", help=f"default: {' '.join(VERSIONS)}")
    parser.add_argument("--chapters", nargs="*", help="chapter names (default: every chapter in _toc.yml)")
    parser.add_argument("--build", action="store_true", help="make the missing environments first")
    parser.add_argument("--pip-no-config", action="store_true", help="build with PIP_CONFIG_FILE=/dev/null")
    parser.add_argument("--results", type=Path, help="JSON file: results kept there, done ones skipped")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a chapter may take (default 900)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return one(args.one)
    if args.venvs is None:
        parser.error("--venvs is required")
    sys.path.insert(0, str(ROOT / "tests"))
    from book_copy import chapter_files

    paths = [ROOT / f"{name}.ipynb" for name in chapter_files()]
    if args.chapters:
        paths = [p for p in paths if p.stem in args.chapters]
    versions = args.versions or list(VERSIONS)
    results = load(args.results)
    for version in versions:
        venv = args.venvs / f"torch-{version}"
        if not (venv / "bin" / "python").exists():
            if not args.build:
                print(f"torch {version}: no environment at {venv} (--build makes it)", file=sys.stderr)
                continue
            build(venv, version, args.pip_no_config)
        for path in paths:
            if (path.stem, version) in results:
                continue
            results[(path.stem, version)] = result = run_one(venv / "bin" / "python", path, args.timeout)
            print(f"torch {version} {path.stem}: {cell(result)}", flush=True)
            save(args.results, results)
    load_avg = os.getloadavg()
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{load_avg[0]:.1f} / {load_avg[1]:.1f} / {load_avg[2]:.1f} (1 / 5 / 15 min), {os.cpu_count()} CPUs\n")
    print(table(results, [p.stem for p in paths], versions))


if __name__ == "__main__":
    main()
