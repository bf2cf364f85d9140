"""What a platform refuses: the ``%%needs`` cell magic, and the recorded outputs it shows instead.

A chapter's multi-machine section starts each of its cells with ``%%needs nodes`` (two machines on
this one, :class:`distlab.Nodes`), ``%%needs slurm`` (a one-machine Slurm cluster) or ``%%needs
slurm-nodes`` (a Slurm cluster on two nodes). Where the machine gives that, the cell runs as any
other. Where it does not (a container that refuses namespaces, an ordinary user and Slurm, no
Slurm at all), the cell runs nothing: the section says once, in one line, why and what would allow
it, and each cell shows what it printed when the book was built, labelled as recorded. So Run All
reaches the last cell everywhere, and nothing pretends to be a node.

Modules, each with the process it runs in (all in the kernel):

* ``verdict``: whether a requirement holds, and the line that says why not, from probe results. Pure.
* ``probe``: the real, cheap probes behind ``verdict`` (``unshare``, Slurm's programs, root), once per kernel.
* ``recorded``: the recordings (``recorded/<chapter>.json``, shipped with the package, so a learner
  with only a notebook and ``pip install distlab`` sees them too): each cell's key, reading them, showing one.
* ``magic``: the ``%%needs`` cell magic (``%load_ext distlab.needs``).

May import: ``nodes`` and ``slurm`` (their own checks give the precise reasons) and everything below them.
"""


def load_ipython_extension(ipython) -> None:
    """``%load_ext distlab.needs``: adds the ``%%needs`` cell magic (:mod:`distlab.needs.magic`).

    A separate extension from ``%load_ext distlab`` because it sits above ``slurm`` and ``nodes``,
    whose checks it reuses, and the face below them must not import it. Re-running the cell that
    loads it prints nothing, as for ``%load_ext distlab``."""
    from distlab.needs.magic import forget_loaded, register

    register(ipython)
    if forget_loaded not in ipython.events.callbacks["post_run_cell"]:
        ipython.events.register("post_run_cell", forget_loaded)
