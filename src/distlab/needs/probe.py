"""The real probes behind :mod:`distlab.needs.verdict`, run once per kernel (a few milliseconds).

Nodes: the very check :class:`distlab.Nodes` makes before it starts (its tools, then ``unshare``
of a network namespace, in a user namespace for an ordinary user). Slurm: the check
``slurm.local_cluster`` makes (Slurm's and munge's programs, root); accounting: whether its cluster
would keep job accounting (:func:`distlab.slurm.accounting.problem`: slurmdbd's and MariaDB's programs,
a loopback host name). Each keeps the text of the error it would raise, which names the cause and the
fix; nothing is started.
"""
from __future__ import annotations

from distlab.errors import NodesError
from distlab.needs.verdict import Facts
from distlab.nodes import namespaces
from distlab.slurm import accounting
from distlab.slurm.cluster import check_can_start
from distlab.slurm.errors import ClusterError

_FACTS: Facts | None = None


def nodes_problem() -> str | None:
    try:
        namespaces.check_possible()
    except NodesError as e:
        return str(e)
    except OSError as e:  # unshare itself could not be started
        return f"distlab: cannot start nodes: {e}. Install util-linux (Debian: apt-get install util-linux)."
    return None


def slurm_problem() -> str | None:
    try:
        check_can_start()
    except ClusterError as e:
        return str(e)
    return None


def facts(fresh: bool = False) -> Facts:
    """This machine's :class:`Facts`, probed once per kernel (``fresh``: again, after installing something)."""
    global _FACTS
    if _FACTS is None or fresh:
        nodes = nodes_problem()
        _FACTS = Facts(nodes_problem=nodes, slurm_problem=slurm_problem(),
                       accounting_problem=accounting.problem(on_nodes=nodes is None))
    return _FACTS


def holds(requirement: str) -> bool:
    """Whether this machine gives ``requirement`` (``"nodes"``, ``"slurm"``, ``"slurm-nodes"``): what a chapter
    asks to choose, say, a cluster of two nodes or of one."""
    from distlab.needs.verdict import parse, verdict

    return verdict(parse(requirement), facts()) is None
