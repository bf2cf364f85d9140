"""The check's answer: findings, each with its kind, line, ranks and what to do, as a table.

Pure: a notebook shows :meth:`Report._repr_html_`, the command line prints :meth:`Report.text`.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Finding:
    """One mistake: ``kind`` (a name from :data:`distlab.check.detect.KINDS`), ``line`` in the learner's
    ``file`` ("" is the checked script), the ``ranks`` concerned, a ``message`` that says what
    happens and how to fix it; ``lines``: each rank's own line where they differ (a hang)."""

    kind: str
    line: int | None
    ranks: tuple[int, ...]
    message: str
    file: str = ""
    lines: dict = field(default_factory=dict)

    def where(self) -> str:
        """"line 12", "helpers.py line 3", or each rank's line: "rank 0: line 30, rank 1: line 41"."""
        if self.lines:
            return ", ".join(f"rank {r}: {_at(*self.lines[r])}" for r in sorted(self.lines))
        return _at(self.file, self.line)


def _at(file: str, line: int | None) -> str:
    text = "?" if line is None else f"line {line}"
    return f"{file} {text}" if file else text


@dataclass
class Report:
    """What :func:`distlab.check` found in one run of a script (``findings`` empty: it checks clean).

    ``world_size``: the ranks that ran; ``result``: the run's :class:`distlab.RunResult` (each rank's
    lines in ``result.logs``), None when it did not finish; ``error``: why it did not, as text."""

    script: str
    findings: list[Finding]
    world_size: int = 0
    mode: str = "torchrun"
    result: object = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def kinds(self) -> list[str]:
        return [f.kind for f in self.findings]

    def text(self) -> str:
        head = f"distlab.check: {self.script} on {self.world_size} rank(s) ({self.mode})"
        if not self.findings:
            return f"{head}: no finding."
        rows = [f"{head}: {len(self.findings)} finding(s)"]
        for f in self.findings:
            ranks = ", ".join(map(str, f.ranks)) or "-"
            rows.append(f"\n[{f.kind}] {f.where()} (ranks {ranks})\n  {f.message}")
        return "\n".join(rows)

    __str__ = text

    def __repr__(self) -> str:
        return f"<distlab.check Report {self.script}: {', '.join(self.kinds) or 'no finding'}>"

    def _repr_html_(self) -> str:
        title = html.escape(f"{self.script} on {self.world_size} rank(s) ({self.mode})")
        if not self.findings:
            return f"<p><b>distlab.check</b>: {title}: no finding.</p>"
        cells = "".join(
            "<tr>" + "".join(f"<td style='text-align:left'>{html.escape(str(v))}</td>" for v in (
                f.kind, f.where(), ", ".join(map(str, f.ranks)), f.message)) + "</tr>"
            for f in self.findings)
        head = "".join(f"<th style='text-align:left'>{h}</th>" for h in ("kind", "line", "ranks", "message"))
        return (f"<p><b>distlab.check</b>: {title}: {len(self.findings)} finding(s)</p>"
                f"<table><thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table>")
