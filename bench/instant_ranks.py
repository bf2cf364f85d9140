"""What a learner waits for in a fresh kernel, and what warm ranks cost (issue #28).

Each row is measured in fresh Python processes that run an IPython shell, as a notebook kernel does:

    import distlab / import torch   median wall time of the import alone (goal: ratio <= 1.15)
    first spawn, prestarted         the first 2-rank spawn of a fresh kernel, a few seconds after
                                    `import distlab` (the forkserver started in the background)
    first spawn, DISTLAB_PRESTART=0 the same, with the server started by that first spawn (before)
    warm spawn                      a later spawn in the same kernel (the baseline the first one is held to)
    Ranks(2) start                  distlab.Ranks(2) once the server runs, forked ranks (goal <= 0.5 s)
    Ranks(2) start, spawn           the same with start="spawn" (fresh interpreters, before)
    USS per rank                    unique memory of each forked warm rank after a collective (goal <= 40 MB),
                                    and of a fresh-interpreter rank

Last line: `ratio: X` = first spawn (prestarted) / warm spawn (goal: the first is as fast as a warm one).
Usage: python bench/instant_ranks.py [--repeats 3] [--settle 6]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

KERNEL = """
import json, sys, time
from IPython.core.interactiveshell import InteractiveShell
InteractiveShell.instance()
out = {}
began = time.perf_counter()
import distlab
out["import"] = time.perf_counter() - began
import torch  # a chapter's first cell imports torch too
time.sleep(SETTLE)  # the learner reads the next cell
sys.path.insert(0, "TESTS")
from fake_kernel import run_cells
cells = run_cells('''
def job(rank):
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
''')
for name in ("first", "warm"):
    began = time.perf_counter()
    distlab.spawn(cells["job"], nprocs=2, view=None)
    out[name] = time.perf_counter() - began
print("RESULT", json.dumps(out), flush=True)
"""

RANKS = """
import json, time, psutil
import distlab
from distlab.forkserver import client as forkserver
out = {}
if START == "forkserver":
    forkserver.ensure_server()
    time.sleep(SETTLE)  # the server has imported torch
began = time.perf_counter()
ranks = distlab.Ranks(2, start=START)
out["start"] = time.perf_counter() - began
ranks.exec("t = torch.ones(1); dist.all_reduce(t); t.item()")
out["uss_mb"] = [psutil.Process(p).memory_full_info().uss / 2**20 for p in ranks.pids]
ranks.close()
print("RESULT", json.dumps(out), flush=True)
"""

IMPORT = "import time; t = time.perf_counter(); import {module}; print('RESULT', time.perf_counter() - t)"


def run(code: str, env: dict | None = None):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env={**os.environ, **(env or {})})
    line = [s for s in out.stdout.splitlines() if s.startswith("RESULT")]
    if not line:
        raise RuntimeError(out.stdout + out.stderr)
    return json.loads(line[0].split(" ", 1)[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--settle", type=float, default=6.0)
    args = parser.parse_args()
    tests = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")
    kernel = textwrap.dedent(KERNEL).replace("SETTLE", str(args.settle)).replace("TESTS", tests)
    rows: dict[str, list[float]] = {}
    for _ in range(args.repeats):  # alternated, so a load change hits every row alike
        rows.setdefault("import distlab", []).append(run(IMPORT.format(module="distlab")))
        rows.setdefault("import torch", []).append(run(IMPORT.format(module="torch")))
        on = run(kernel)
        off = run(kernel, {"DISTLAB_PRESTART": "0"})
        rows.setdefault("first spawn, prestarted", []).append(on["first"])
        rows.setdefault("first spawn, DISTLAB_PRESTART=0", []).append(off["first"])
        rows.setdefault("warm spawn", []).extend([on["warm"], off["warm"]])
        for start, label in (("forkserver", "Ranks(2) start"), ("spawn", "Ranks(2) start, spawn")):
            r = run(textwrap.dedent(RANKS).replace("START", repr(start)).replace("SETTLE", str(args.settle)))
            rows.setdefault(label, []).append(r["start"])
            rows.setdefault(f"USS per rank (MB), {start}", []).extend(r["uss_mb"])
    med = {k: statistics.median(v) for k, v in rows.items()}
    for name, value in med.items():
        unit = "" if "MB" in name else " s"
        print(f"{name:36s} {value:8.3f}{unit}   (n={len(rows[name])})")
    print(f"import ratio (distlab / torch)       {med['import distlab'] / med['import torch']:8.3f}   (goal <= 1.15)")
    print(f"ratio: {med['first spawn, prestarted'] / med['warm spawn']:.3f}")


if __name__ == "__main__":
    main()
