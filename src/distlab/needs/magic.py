"""The ``%%needs`` cell magic: run a multi-machine cell where the machine allows it, show its recording where not.

    %%needs nodes          two machines on this one (distlab.Nodes)
    %%needs slurm          a one-machine Slurm cluster (slurm.local_cluster)
    %%needs slurm-nodes    a Slurm cluster of two nodes
    %%needs slurm-accounting   a Slurm cluster that keeps job accounting (sacct)

Where the requirement holds, the cell's code runs as a plain cell would: in the notebook's namespace,
its output live, its last expression its value, its exception raised. Where it does not, nothing
runs (no files, no asserts); the first skipped cell of a section (a run of skipped cells with the same
requirement) prints one line, and every skipped cell shows its recording. That line leads with what this
platform does not allow and where the section runs live; the first section of a chapter gives it in full, the
technical cause folded under it, and every later section skipped for the same reason a short form.
"""
from __future__ import annotations

import ast

from distlab.needs import probe, recorded, verdict

_LAST_SKIPPED: dict = {"count": None, "requirement": None}   # the last skipped cell: a section goes on
_EXPLAINED: dict = {}   # a reason's full line -> the key of the cell that gave it (once per chapter)


def needs_magic(line: str, cell: str):
    """``%%needs REQUIREMENT``: run the cell, or say why not and show its recording."""
    __tracebackhide__ = True
    from IPython import get_ipython
    from IPython.core.error import UsageError

    try:
        requirement = verdict.parse(line)
    except ValueError as e:
        raise UsageError(str(e)) from None
    shell = get_ipython()
    why = verdict.verdict(requirement, probe.facts())
    if why is None:
        return run_here(shell, cell)
    skip(shell, requirement, why, cell)
    return None


def new_section(count: int | None, requirement: str, last: dict) -> bool:
    """Whether a skipped cell starts a section: the cell before it was not skipped for the same requirement. Pure."""
    return count is None or last["count"] != count - 1 or last["requirement"] != requirement


def in_full(why: verdict.Reason, key: str, explained: dict) -> bool:
    """Whether a section's first cell gives the full line: no cell gave it before in this kernel, or this very
    cell did (Run All again). Notes that it did. Pure but for ``explained``."""
    first = explained.setdefault(why.full, key)
    return first == key


def skip(shell, requirement: str, why: verdict.Reason, cell: str) -> None:
    count = shell.execution_count if shell is not None else None
    if new_section(count, requirement, _LAST_SKIPPED):
        if in_full(why, recorded.cell_key(requirement, cell), _EXPLAINED):
            recorded.note(why.full, detail=why.cause)
        else:
            recorded.note(why.short)
    _LAST_SKIPPED.update(count=count, requirement=requirement)
    found = recorded.find(requirement, cell)
    if found is None:
        recorded.note(recorded.NO_RECORDING.format(what=verdict.WHAT[requirement]))
        return
    recorded.show(found)
    line = recorded.checked(cell)
    if line is not None:
        recorded.note(line)


def run_here(shell, cell: str):
    """Run ``cell`` (IPython syntax) in the notebook's namespace; its last expression's value, as a cell shows it.

    The code is registered in ``linecache`` as IPython does for a cell, so tracebacks show its lines
    and distlab can capture the functions and classes it defines for the ranks."""
    __tracebackhide__ = True
    code = shell.transform_cell(cell)
    filename = shell.compile.cache(code, shell.execution_count, raw_code=cell)
    tree = ast.parse(code, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr) and not cell.rstrip().endswith(";"):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), shell.user_ns)
    if last is not None:
        return eval(compile(last, filename, "eval"), shell.user_ns)
    return None


def register(ipython) -> None:
    ipython.register_magic_function(needs_magic, "cell", "needs")


def forget_loaded(*_result) -> None:
    """After each cell, leave IPython's list of loaded extensions, so re-running ``%load_ext distlab.needs``
    loads it again (harmless) instead of printing IPython's "already loaded" note."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is not None:
        shell.extension_manager.loaded.discard("distlab.needs")
