"""What a run brings back to the notebook: return values, logs and metrics per rank."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distlab.folders.private import check_private_file
from distlab.folders.runfolder import ATTEMPT, RunFolder


@dataclass
class RunResult:
    """Outcome of one launch. ``returns[rank]``, ``logs[rank]``, ``metrics[rank]`` are per rank."""

    run_dir: Path
    script: Path | None
    world_size: int
    returns: dict[int, Any] = field(default_factory=dict)
    logs: dict[int, str] = field(default_factory=dict)
    metrics: dict[int, list[dict]] = field(default_factory=dict)
    wall_s: float = 0.0

    def series(self, key: str, rank: int = 0) -> list:
        """Values of one reported metric on one rank, in the order they were reported."""
        return [row[key] for row in self.metrics.get(rank, []) if key in row]

    def __repr__(self) -> str:
        return (f"RunResult(world_size={self.world_size}, wall_s={self.wall_s:.2f}, "
                f"returns={self.returns!r}, run_dir='{self.run_dir}')")


def _folder(run_dir) -> RunFolder:
    return run_dir if isinstance(run_dir, RunFolder) else RunFolder(run_dir)


def log_files(run_dir, rank: int) -> list[Path]:
    """Every log file of a rank, oldest attempt first (torchelastic restarts make new attempts)."""
    return _folder(run_dir).log_files(rank)


def read_logs(run_dir, rank: int) -> str:
    """A rank's output; after a torchelastic restart each attempt starts with a header line."""
    files = log_files(run_dir, rank)
    attempts = {f.parent for f in files}
    parts = []
    for f in files:
        if len(attempts) > 1 and f.suffix == ".out":
            k = ATTEMPT.match(f.parent.name).group(1)
            parts.append(f"--- attempt {k} ---\n")
        with open(f, errors="replace", newline="") as text:  # a progress bar's '\r' kept: no line per redraw
            parts.append(text.read())
    return "".join(parts)


def read_metrics(run_dir, rank: int) -> list[dict]:
    path = _folder(run_dir).metrics(rank)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_returns(run_dir, world_size: int) -> dict[int, Any]:
    """Each rank's return value. These files are unpickled, so the folder and each file are checked
    first: still private, and yours (a :class:`~distlab.errors.RunFolderError` otherwise)."""
    import torch

    folder = _folder(run_dir)
    folder.check()
    out = {}
    for rank in range(world_size):
        path = folder.returned(rank)
        if path.exists():
            check_private_file(path)
            out[rank] = torch.load(path, map_location="cpu", weights_only=False)
        else:
            out[rank] = None
    return out


def collect(run_dir, script: Path | None, world_size: int, wall_s: float, returns: bool = True) -> RunResult:
    folder = _folder(run_dir)
    ranks = range(world_size)
    reporting = {rank for rank, _ in folder.metric_streams()}  # a script's own ranks too
    return RunResult(
        run_dir=folder.path, script=script, world_size=world_size,
        returns=read_returns(folder, world_size) if returns else {},
        logs={r: read_logs(folder, r) for r in ranks},
        metrics={r: read_metrics(folder, r) for r in sorted(set(ranks) | reporting)},
        wall_s=wall_s,
    )
