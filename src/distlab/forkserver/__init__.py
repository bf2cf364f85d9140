"""The fast start: a server process that imported torch once forks every rank, in milliseconds.

A kernel that has used CUDA cannot fork safely, and a fresh interpreter per rank costs about
1.5 s (mostly ``import torch``). distlab starts its own forkserver (a fresh ``exec`` of Python that
never touches CUDA), keeps spare ranks forked ahead of the requests, and makes each forked child
into what ``python -m distlab.launch.rank`` would have been. The generated script stays the single
truth either way.

Modules, each with the process it runs in:

* ``mode``: how ranks start, forked or fresh, and the environment a forked rank gets. Pure rules (kernel).
* ``client``: starts the server, asks it for forks, waits for forked ranks to be gone (kernel).
* ``tracker``: ``multiprocessing``'s resource tracker, started where a kernel's shutdown does not
  wait for it (kernel).
* ``stdlib``: the private names of ``multiprocessing`` the server and the tracker use, and the Python
  versions they were read in; elsewhere both fall back to the standard behaviour, with a warning (kernel).
* ``prestart``: starts the server in the background when a notebook imports distlab (kernel).
* ``peercred``: who is at the other end of a Unix socket; the server's check on every connection
  (kernel and server).
* ``elastic``: torchelastic with forked ranks, the engine's ``start="forkserver"`` path (kernel).
* ``agent_wait``: torchelastic's agent woken by its ranks, not by a clock (kernel).
* ``server``: the server's loop, ``python -c "from distlab.forkserver.server import main; ..."`` (server).
* ``preload``: what the server imports before it forks anything (server).
* ``spare``: a forked child on its way to becoming a rank: a spare waiting for its run (forked child).
* ``child``: a forked child made into a rank's process: environment, output, threads, random
  state (forked child: a rank of a launch or a warm rank).
* ``rank``: the first code of a forked rank of a launch (forked rank).
* ``enter``: a forked child that runs on one of :class:`distlab.Nodes` enters the node's namespaces
  first, through the descriptors the kernel holds (forked child; the kernel and a node's agent
  send them).

May import: ``worker`` and everything below it. Imported by ``launch``, ``warm``, ``api`` and the face.
"""
