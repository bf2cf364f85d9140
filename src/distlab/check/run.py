"""The front end of the check: run a script on N ranks with the recorder in each, then read the events.

Runs in the notebook (or ``python -m distlab.check``); starts the ranks through
:func:`distlab.run_script`, so a check runs the way the learner's own run would.
"""
from __future__ import annotations

import json
import numbers
import re
import shutil
from pathlib import Path

from distlab import api, config
from distlab.check import detect
from distlab.check.report import Report
from distlab.errors import LaunchArgumentError, WorkerFailedError, WorkerTimeoutError
from distlab.folders.runfolder import RunFolder
from distlab.forkserver import mode as launchmode
from distlab.launch import engine
from distlab.launch.compat import check_torch
from distlab.view.display import make_view

BOOT = Path(__file__).with_name("boot.py")  # each rank's entry (see distlab.check.boot)
GRACE_S = 20.0  # past the ranks' own deadline, the launcher stops whatever is left
_SPAWNS = re.compile(r"\b(spawn|start_processes)\s*\(")


def choose_mode(source: str) -> str:
    """"python" for a script that starts its own ranks (``mp.spawn``), else "torchrun"."""
    return "python" if "multiprocessing" in source and _SPAWNS.search(source) else "torchrun"


def check(script, nprocs: int = 2, args=(), *, timeout: float = 120.0, steps: int | None = None,
          mode: str = "auto", view=None) -> Report:
    """Run ``script`` on ``nprocs`` ranks, unedited, and report the silent DDP mistakes it makes.

    :param script: a training script, written for torchrun (``init_process_group()`` from the
        environment) or starting its own ranks with ``mp.spawn``.
    :param nprocs: ranks for a torchrun-style script (a script with ``mp.spawn`` starts its own).
    :param args: its command-line arguments.
    :param timeout: seconds; a rank still running then is stopped, and the report says where each
        rank was (a hang, or a run too long for a check).
    :param steps: stop every rank after this many steps of its first optimizer (None: run to the end).
    :param mode: ``"torchrun"``, ``"python"`` (the script starts its ranks), or ``"auto"``: ``"python"``
        when the script calls ``torch.multiprocessing``'s ``spawn``.
    :param view: how the ranks' lines show while it runs, as in :func:`distlab.run_script` (None: not).
        A torchrun-style script's ranks are forked from distlab's torch-preloaded server where it works.
    :returns: a :class:`~distlab.check.report.Report`; ``report.findings`` is empty when it checks clean.
    """
    path = Path(script)
    if not path.is_file():
        raise LaunchArgumentError("script", str(path), "no such file", "Write the script first, or fix the path.")
    nprocs = config.check_positive_int("nprocs", nprocs)
    args, timeout = config.check_script_args(args), config.check_timeout(timeout)
    if timeout is None:
        raise LaunchArgumentError("timeout", None, "must be a number of seconds", "A check always has a deadline.")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1):
        raise LaunchArgumentError("steps", steps, "must be a positive integer or None", "For example steps=20.")
    if mode not in ("auto", "torchrun", "python"):
        raise LaunchArgumentError("mode", mode, 'must be "auto", "torchrun" or "python"')
    mode = choose_mode(path.read_text(errors="replace")) if mode == "auto" else mode
    folder = RunFolder.create(f"check-{path.stem}").path / "events"
    folder.mkdir(mode=0o700)
    try:
        result, error = _run(path, folder, nprocs, args, timeout, steps or 0, mode, view)
        ranks = detect.by_rank(read_events(folder))
    finally:
        shutil.rmtree(folder.parent, ignore_errors=True)
    world = len(ranks) or (nprocs if mode == "torchrun" else 0)
    return Report(path.name, detect.find_all(ranks, timeout), world, mode, result, error)


def _run(path: Path, folder: Path, nprocs: int, args: list, timeout: float, steps: int, mode: str, view):
    """The run, and why it did not finish (empty if it did): the findings explain a failure."""
    argv = [str(folder), str(timeout), str(steps), str(path.resolve()), *args]
    try:
        if mode == "python":
            return api.run_script(BOOT, 1, argv, mode="python", timeout=timeout + GRACE_S, view=view), ""
        return _torchrun(argv, nprocs, timeout + GRACE_S, view), ""
    except WorkerFailedError as e:
        return e.result, str(e)
    except WorkerTimeoutError as e:
        return e.result, str(e)


def _torchrun(argv: list[str], nprocs: int, timeout: float, view):
    """``run_script(BOOT, nprocs, argv)``, with its ranks forked from distlab's torch-preloaded server
    where it works (tens of ms instead of a fresh interpreter's import of torch): the check of a
    small script costs little more than the script."""
    config.check_view(view)
    check_torch()
    start = launchmode.resolve_start("auto", forkserver_works=launchmode.forkserver_works())
    plan = engine.Plan(run_dir=engine.new_run_dir("check"), target=BOOT, nproc=nprocs, target_args=argv,
                       timeout=timeout, start=start)
    return engine.execute(plan, make_view(view, plan.world_size), collect_returns=False)


def read_events(folder: Path) -> list[list[dict]]:
    """Each process's events, in the order its process started (a line cut short by a kill is skipped)."""
    processes = []
    for file in sorted(folder.glob("*.jsonl"), key=lambda p: p.stat().st_mtime_ns):
        events = []
        for line in file.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        processes.append(events)
    return processes
