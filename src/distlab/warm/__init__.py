"""Warm ranks: N processes with the process group initialised, kept alive between cells.

``distlab.Ranks(2)`` starts them once; ``%%ranks`` cells, ``ranks.run``, ``push`` and ``pull`` then
run code and move values on them, so a tensor made in one cell can be all-reduced in the next.
The kernel and each rank talk over one pipe per rank; the group's store is a ``FileStore`` in the
group's private folder.

Modules, each with the process it runs in:

* ``ranks``: :class:`~distlab.warm.ranks.Ranks`, the learner's handle (kernel).
* ``magic``: the ``%%ranks`` cell magic (kernel).
* ``replaced``: after each notebook cell, close the Ranks a re-run replaced, although IPython's
  ``Out`` still holds them (kernel).
* ``group``: the processes behind a ``Ranks``: start them, talk to them, stop them (kernel).
* ``status``: the status line of a running ``%%ranks`` cell (kernel).
* ``data``: values between the kernel and the ranks: what ``push``/``scatter``/``pull``/``gather``
  send. Pure (kernel and ranks).
* ``proto``: the messages both sides agree on. Pure (kernel and ranks).
* ``errors``: errors of warm ranks, with their message templates (kernel).
* ``loop``: inside one warm rank: join the group once, then run what the kernel sends (each rank).
* ``watch``: inside one warm rank: tell the kernel at once when an interrupt finds it in a
  collective (each rank).
* ``forked``: the first code of a warm rank forked from distlab's forkserver (each forked rank).

May import: ``forkserver`` and everything below it; never ``launch``. ``loop``, ``watch``, ``proto``,
``data`` and ``forked`` run inside ranks and import nothing of the front end (``ranks``, ``magic``,
``group``, ``status``, ``view``, ``api``).
"""
