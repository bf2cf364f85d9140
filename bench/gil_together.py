"""Chapter 1's GIL experiment, repeated: how far its two measurements stay from the bounds the chapter
asserts, on this machine, quiet or with other programs keeping the cores busy.

Each run of ``gil_experiment`` reports, per kind (serial, threads, processes), the wall time, the cores
busy and *together*, the share of the time both workers ran Python at the same moment. The chapter
asserts threads' together <= THREADS_MAX_TOGETHER and processes' >= PROCESSES_MIN_TOGETHER; this
prints both for every run, the smallest margin seen, and the speed-ups the chapter prints but no
longer asserts (a busy machine moves them either way). With ``--pin-one-core`` the whole experiment
runs on one core, where processes can never be together: the chapter's cell must fail there.

Usage: python bench/gil_together.py [--runs 5] [--busy 2] [--pin-one-core]
"""
import argparse
import os
import subprocess
import sys

from distlab.teach.dp_vs_ddp import PROCESSES_MIN_TOGETHER, THREADS_MAX_TOGETHER, gil_experiment, speedups


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--busy", type=int, default=0, help="this many spinning processes meanwhile")
    parser.add_argument("--pin-one-core", action="store_true", help="run everything on one core (Linux)")
    args = parser.parse_args()
    if args.pin_one_core:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        threads, processes = [], []
        for run in range(args.runs):
            results, rounds = gil_experiment()
            speed = speedups(results)
            threads.append(results["threads"]["together"])
            processes.append(results["processes"]["together"])
            print(f"run {run}: {rounds:2d} rounds; together: threads {threads[-1]:.3f}, processes "
                  f"{processes[-1]:.3f}; speed-up: threads {speed['threads']:.2f}x, processes "
                  f"{speed['processes']:.2f}x", flush=True)
    finally:
        for p in busy:
            p.kill()
    print(f"threads: at most {max(threads):.3f} (bound {THREADS_MAX_TOGETHER}); "
          f"processes: at least {min(processes):.3f} (bound {PROCESSES_MIN_TOGETHER})")
    holds = max(threads) <= THREADS_MAX_TOGETHER and min(processes) >= PROCESSES_MIN_TOGETHER
    print("the chapter's asserts hold in every run" if holds else "the chapter's asserts FAIL in some run")


if __name__ == "__main__":
    main()
