"""Whether a ``%%needs`` requirement holds here, and if not, the one line a section says. Pure.

The probes (:mod:`distlab.needs.probe`) reduce to :class:`Facts`: the text of the error that
:class:`distlab.Nodes` and ``slurm.local_cluster`` would raise here, or None where they would start.
Those errors already name the precise cause (a container's missing privilege, a sysctl, a missing
program, not root) and what to change, so this module only says which section they stop.
"""
from __future__ import annotations

from dataclasses import dataclass

WHAT = {  # requirement -> what a section needs, in words
    "nodes": "two machines on this one (distlab.Nodes: network namespaces)",
    "slurm": "a Slurm cluster on this machine (slurm.local_cluster: Slurm's packages and root)",
    "slurm-nodes": "a Slurm cluster of two nodes (slurm.local_cluster on distlab.Nodes: Slurm's packages, root "
                   "and network namespaces)",
    "slurm-accounting": "a Slurm cluster that keeps job accounting (slurm.local_cluster with slurmdbd and MariaDB)",
}
REASON = ("Not run here: this section needs {what}. {problem} Its cells show what they printed when the book was "
          "built, labelled as recorded; the rest of the chapter runs.")
USAGE = ("usage: %%needs nodes | slurm | slurm-nodes | slurm-accounting  (the first line of a cell; the cell's "
         "code follows)")


@dataclass(frozen=True)
class Facts:
    """What the probes found: why each thing cannot start here (an error's text), None where it can."""

    nodes_problem: str | None
    slurm_problem: str | None
    accounting_problem: str | None = None  # why the cluster would keep no job accounting (sacct)


def parse(line: str) -> str:
    """The requirement named on the magic's line; a ValueError with the usage for anything else."""
    words = line.split()
    if len(words) != 1 or words[0] not in WHAT:
        raise ValueError(f"%%needs: {line.strip()!r} is not a requirement. {USAGE}")
    return words[0]


def problems(requirement: str, facts: Facts) -> list[str]:
    """What stands in the way of ``requirement``, Slurm's problem first (it says what to install)."""
    found = []
    if requirement in ("slurm", "slurm-nodes", "slurm-accounting") and facts.slurm_problem:
        found.append(facts.slurm_problem)
    if requirement == "slurm-accounting" and facts.accounting_problem and not facts.slurm_problem:
        found.append(f"distlab.slurm: {facts.accounting_problem}")
    if requirement in ("nodes", "slurm-nodes") and facts.nodes_problem:
        found.append(facts.nodes_problem)
    return found


def verdict(requirement: str, facts: Facts) -> str | None:
    """None where ``requirement`` holds; else the section's one line: why not, and what would allow it."""
    found = problems(requirement, facts)
    if not found:
        return None
    problem = " ".join(" ".join(text.split()) for text in found)  # one line, whatever the errors' layout
    if not problem.endswith("."):
        problem += "."
    return REASON.format(what=WHAT[requirement], problem=problem)
