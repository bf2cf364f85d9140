"""Execute every chapter of the book on this machine's GPU, the way the test suite executes them.

    DISTLAB_DEVICE=cuda python bench/gpu_chapters.py [book/11_*.ipynb ...]   (bench/gpu_check.sh runs it)

With ``DISTLAB_DEVICE=cuda`` every rank computes on a GPU through gloo (all on ``cuda:0`` when there is
one GPU), so one GPU exercises every chapter's GPU path: models and tensors on CUDA, the GPU branches of
the cells, the asserts. Exercise solutions run too. Prints one line per chapter (PASS/FAIL, seconds,
slowest cells) and exits 1 if any chapter failed, 2 when there is no GPU or no Jupyter to run them with:
it never skips.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NEEDS = ("nbclient", "nbformat", "ipykernel", "matplotlib", "psutil", "tqdm")


def preflight() -> str | None:
    """Why the chapters cannot run here, or None."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        return "no CUDA device visible (torch.cuda.is_available() is False): this check needs a GPU"
    missing = [m for m in NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        return f"missing Python packages {missing}: pip install {' '.join(missing)}"
    if os.environ.get("DISTLAB_DEVICE", "").lower() != "cuda":
        return "DISTLAB_DEVICE is not cuda: run with DISTLAB_DEVICE=cuda (bench/gpu_check.sh sets it)"
    return None


def chapters(args: list[str]) -> list[Path]:
    if args:
        return [Path(a).resolve() for a in args]
    return sorted(p for p in (ROOT / "book").glob("*.ipynb") if p.stem[:2].isdigit() or p.stem == "intro")


def main(args: list[str]) -> int:
    problem = preflight()
    if problem:
        print(f"FAIL gpu_chapters: {problem}", flush=True)
        return 2
    sys.path.insert(0, str(ROOT / "tests"))
    from nbrun import execute  # the suite's own runner: fresh kernel, cwd = book/, solutions included

    failed = 0
    start = time.perf_counter()
    for path in chapters(args):
        ex = execute(path)
        slow = sorted(enumerate(ex.cell_seconds), key=lambda t: -t[1])[:3]
        if ex.error:
            failed += 1
            print(f"FAIL {path.name} ({ex.seconds:.0f}s): {ex.error[-1500:]}", flush=True)
        else:
            print(f"PASS {path.name} ({ex.seconds:.0f}s; slowest cells {[(i, round(s, 1)) for i, s in slow]})",
                  flush=True)
    print(f"{'FAIL' if failed else 'PASS'} gpu_chapters: {failed} failed, {time.perf_counter() - start:.0f}s in all")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
