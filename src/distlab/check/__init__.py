"""``distlab.check(script)``: run a learner's DDP script on N ranks, unedited, and name the silent
mistakes at their line (no sampler, no ``set_epoch``, every rank saving, ``module.`` keys,
accumulation without ``no_sync``, unsynchronized gradients, hangs and mismatched collectives).

Modules, by the process they run in:

- :mod:`~distlab.check.run` (the notebook): validates, runs the script through
  :func:`distlab.run_script` with :mod:`~distlab.check.boot` as each rank's entry, reads the events.
- :mod:`~distlab.check.boot`, :mod:`~distlab.check.rank`, :mod:`~distlab.check.hooks` (every rank,
  and every process a script starts with ``mp.spawn``): hooks on public torch names record events
  with the learner's line; they import nothing from distlab's front end.
- :mod:`~distlab.check.detect` and :mod:`~distlab.check.report` (anywhere): pure, findings from events.
- ``python -m distlab.check script.py [args]`` (:mod:`~distlab.check.__main__`): the command line.

A layer above :mod:`distlab.api` (beside ``teach`` and ``slurm``). ``distlab.check`` is this
package, and calling it calls :func:`~distlab.check.run.check`.
"""
import sys
import types

from distlab.check.detect import KINDS
from distlab.check.report import Finding, Report
from distlab.check.run import check

__all__ = ["check", "Report", "Finding", "KINDS"]


class _CallableModule(types.ModuleType):
    """``distlab.check(script)`` calls :func:`check`; ``distlab.check.Report`` is still this package's."""

    def __call__(self, *args, **kwargs) -> Report:
        return check(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
