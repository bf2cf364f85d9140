"""``python -m distlab.slurm.watchdog KERNEL_PID KERNEL_START_TIME FOLDER``: stop the one-machine cluster in FOLDER once
the process that started it is gone (a killed kernel runs no ``atexit``).

Started by :func:`distlab.slurm.cluster.local_cluster` in its own session, so an interrupt of the
kernel does not reach it; ``LocalCluster.stop()`` ends it when the cluster stops normally.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil

from .stopping import stop_folder

POLL_S = 0.5


def _same_process(pid: int, started: float) -> bool:
    try:
        return abs(psutil.Process(pid).create_time() - started) < 0.01
    except psutil.NoSuchProcess:
        return False


def main(argv: list[str]) -> None:
    pid, started, folder = int(argv[0]), float(argv[1]), Path(argv[2])  # the start time: a recycled pid is not it
    while _same_process(pid, started):
        time.sleep(POLL_S)
    stop_folder(folder)


if __name__ == "__main__":
    main(sys.argv[1:])
