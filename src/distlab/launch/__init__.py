"""One launch: ``spawn``, ``launch`` and ``run_script`` on torchelastic, watched from the kernel.

``elastic_launch`` (torchrun's engine) starts the ranks, writes per-rank logs and error files,
stops survivors when a rank fails and restarts on request. distlab adds a rendezvous no other
local user can open, the fast start of ``forkserver``, live per-rank output, a timeout with each
rank's stack, and errors that name the rank that failed first.

Modules, each with the process it runs in:

* ``engine``: plans and runs one launch, and reads what it left (kernel).
* ``watch``: the watcher thread: streams rank output, enforces the timeout, stops workers (kernel).
* ``compat``: the torch features the launcher relies on, checked once (kernel).
* ``agent``: ``python -m distlab.launch.agent RUN_DIR``: torchelastic's agent of a multi-node run,
  out of the kernel (its own process).
* ``standby``: an agent started ahead on each of :class:`distlab.Nodes`, waiting for the next
  launch there (kernel; the standbys are ``agent`` processes).
* ``rank``: ``python -m distlab.launch.rank RUN_JSON TARGET ARGS``: the first code of a rank started
  as a fresh interpreter (every such rank).

May import: ``forkserver`` and everything below it; never ``warm``.
"""
