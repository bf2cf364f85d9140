"""``python -m distlab.check script.py [args]``: print the report; exit 1 on any finding, 0 when clean."""
from __future__ import annotations

import argparse
import sys

from distlab.check.run import check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distlab.check",
                                     description="Run a DDP training script on N ranks and name its silent mistakes.")
    parser.add_argument("--nprocs", type=int, default=2, help="ranks for a torchrun-style script (default 2)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before each rank's line is reported")
    parser.add_argument("--steps", type=int, default=None, help="stop after this many optimizer steps")
    parser.add_argument("--mode", choices=("auto", "torchrun", "python"), default="auto")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    ns = parser.parse_args(argv)
    report = check(ns.script, ns.nprocs, ns.args, timeout=ns.timeout, steps=ns.steps, mode=ns.mode, view=None)
    print(report.text())
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
