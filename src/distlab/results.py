"""What a run brings back to the notebook: return values, logs and metrics per rank."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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


def log_files(run_dir: Path, rank: int) -> list[Path]:
    """Every log file of a rank, oldest attempt first (torchelastic restarts make new attempts)."""
    attempts = sorted((run_dir / "logs").glob("attempt*"), key=lambda p: int(p.name[7:]))
    return [f for a in attempts for f in (a / f"rank{rank}.out", a / f"rank{rank}.err") if f.exists()]


def read_logs(run_dir: Path, rank: int) -> str:
    """A rank's output; after a torchelastic restart each attempt starts with a header line."""
    files = log_files(run_dir, rank)
    attempts = {f.parent.name for f in files}
    parts = []
    for f in files:
        if len(attempts) > 1 and f.suffix == ".out":
            parts.append(f"--- {f.parent.name.replace('attempt', 'attempt ')} ---\n")
        parts.append(f.read_text(errors="replace"))
    return "".join(parts)


def read_metrics(run_dir: Path, rank: int) -> list[dict]:
    path = run_dir / "metrics" / f"rank{rank}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_returns(run_dir: Path, world_size: int) -> dict[int, Any]:
    import torch

    out = {}
    for rank in range(world_size):
        path = run_dir / "returns" / f"rank{rank}.pt"
        out[rank] = torch.load(path, map_location="cpu", weights_only=False) if path.exists() else None
    return out


def collect(run_dir: Path, script: Path | None, world_size: int, wall_s: float, returns: bool = True) -> RunResult:
    ranks = range(world_size)
    reporting = {int(p.stem[4:]) for p in (run_dir / "metrics").glob("rank*.jsonl")}  # a script's own ranks too
    return RunResult(
        run_dir=run_dir, script=script, world_size=world_size,
        returns=read_returns(run_dir, world_size) if returns else {},
        logs={r: read_logs(run_dir, r) for r in ranks},
        metrics={r: read_metrics(run_dir, r) for r in sorted(set(ranks) | reporting)},
        wall_s=wall_s,
    )
