"""Run the multi-process test files while other programs hold every core, as CI's machine may be.

    .venv/bin/python bench/busy_machine.py                 # the default files, both cores busy
    .venv/bin/python bench/busy_machine.py tests/test_ranks.py -k restart

A test that passes only on a quiet machine is one CI will fail some day (issue #51). This starts one
busy loop per core (plain Python spinning, at the default priority), runs pytest on the files, stops the
loops whatever happens, and prints pytest's summary with the load average it ran under.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the multi-process test files issue #51 names
FILES = ["tests/test_nodes.py", "tests/test_nodes_spawn.py", "tests/test_two_node.py", "tests/test_slurm_nodes.py",
         "tests/test_spare_ranks.py", "tests/test_ranks.py"]
SPIN = "while True: pass"


def start_load(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(n)]


def stop_load(loops: list[subprocess.Popen]) -> None:
    for loop in loops:
        loop.kill()
        loop.wait()


def main(args: list[str]) -> int:
    loops = start_load(os.cpu_count() or 2)
    started = time.monotonic()
    try:
        time.sleep(1)
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(args or FILES)],
                              cwd=ROOT)
        load = os.getloadavg()
    finally:
        stop_load(loops)
    print(f"busy machine: {len(loops)} busy loops, load average {load[0]:.1f} / {load[1]:.1f} (1 / 5 min), "
          f"{time.monotonic() - started:.0f} s, pytest exit code {done.returncode}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
