"""Whether a ``%%needs`` requirement holds, and if not, what a section says. Pure.

The probes (:mod:`distlab.needs.probe`) reduce to :class:`Facts`: the text of the error that
:class:`distlab.Nodes` and ``slurm.local_cluster`` would raise here, or None where they would start.
Those errors name the precise cause (a container's missing privilege, a sysctl, a missing program, not
root) and the operator's fix, which a learner on Kaggle or Colab cannot act on. So a section leads with a
plain sentence, what this platform does not allow and where the section runs live, and keeps the
technical cause apart (:class:`Reason`): the full line once per chapter, a short form after it.
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
LIVE = {  # requirement -> where its sections run live
    "nodes": "on Linux as root, or as a user where user namespaces are allowed (Debian, Fedora, Arch)",
    "slurm": "as root with Slurm's packages installed (apt-get install slurm-wlm munge), in a container too",
    "slurm-nodes": "as root on a Linux machine or VM with Slurm's packages installed",
    "slurm-accounting": "as root with Slurm, slurmdbd and MariaDB installed",
}
# what stands in the way, for a notebook user: (a phrase of the technical error, the plain sentence)
PLAIN_NODES = (("this machine refuses", "this platform does not allow network namespaces, which this "
                                        "section's machines are made of"),
               ("not found", "this machine lacks the programs that make the machines of this section "
                             "(iproute2, util-linux)"))
PLAIN_SLURM = (("needs root", "a Slurm cluster needs root, and this notebook runs as an ordinary user"),
               ("missing", "Slurm is not installed here"))
FULL = ("Not run here: {plain}. This section runs live {live}; below, each cell shows what it printed when the "
        "book was built.")
SHORT = "Not run here, as said above: {plain}. Each cell shows what it printed when the book was built."
START = FULL.split("{")[0]          # "Not run here: " (every line, full or short, starts with "Not run here")
USAGE = ("usage: %%needs nodes | slurm | slurm-nodes | slurm-accounting  (the first line of a cell; the cell's "
         "code follows)")


@dataclass(frozen=True)
class Facts:
    """What the probes found: why each thing cannot start here (an error's text), None where it can."""

    nodes_problem: str | None
    slurm_problem: str | None
    accounting_problem: str | None = None  # why the cluster would keep no job accounting (sacct)


@dataclass(frozen=True)
class Reason:
    """Why a section does not run here: ``plain``, for a notebook user; ``cause``, the technical errors."""

    requirement: str
    plain: str
    cause: str

    @property
    def full(self) -> str:
        """The line the first skipped section of a chapter shows (the cause folded under it)."""
        return FULL.format(plain=self.plain, live=LIVE[self.requirement])

    @property
    def short(self) -> str:
        """The line of every later section skipped for the same reason."""
        return SHORT.format(plain=self.plain)


def parse(line: str) -> str:
    """The requirement named on the magic's line; a ValueError with the usage for anything else."""
    words = line.split()
    if len(words) != 1 or words[0] not in WHAT:
        raise ValueError(f"%%needs: {line.strip()!r} is not a requirement. {USAGE}")
    return words[0]


def problems(requirement: str, facts: Facts) -> list[tuple[str, str]]:
    """What stands in the way of ``requirement``, Slurm's problem first (it says what to install): (kind, text)."""
    found = []
    if requirement in ("slurm", "slurm-nodes", "slurm-accounting") and facts.slurm_problem:
        found.append(("slurm", facts.slurm_problem))
    if requirement == "slurm-accounting" and facts.accounting_problem and not facts.slurm_problem:
        found.append(("accounting", f"distlab.slurm: {facts.accounting_problem}"))
    if requirement in ("nodes", "slurm-nodes") and facts.nodes_problem:
        found.append(("nodes", facts.nodes_problem))
    return found


def plain(kind: str, text: str) -> str:
    """One problem for a notebook user: what this platform does not allow, without its operator's fix."""
    if kind == "accounting":
        return "Slurm's job accounting (slurmdbd and MariaDB) is not installed here"
    for phrase, sentence in PLAIN_NODES if kind == "nodes" else PLAIN_SLURM:
        if phrase in text:
            return sentence
    return "this machine cannot make the machines of this section" if kind == "nodes" else \
        "a Slurm cluster cannot start here"


def verdict(requirement: str, facts: Facts) -> Reason | None:
    """None where ``requirement`` holds; else why not, plainly and technically."""
    found = problems(requirement, facts)
    if not found:
        return None
    cause = " ".join(" ".join(text.split()) for _, text in found)  # one line, whatever the errors' layout
    if not cause.endswith("."):
        cause += "."
    return Reason(requirement, "; and ".join(plain(kind, text) for kind, text in found), cause)
