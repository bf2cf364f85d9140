"""Nodes: several machines on one, so that multi-node runs are real and can be watched.

Each node is a network namespace with its own host name, ``/etc/hosts``, address on a private
network and link, whose rate ``tc`` limits; the links meet at a bridge in a "switch" namespace.
Only the user's own namespaces are on that network: the host and other users cannot reach it.
As root they are plain namespaces; as an ordinary user, inside one user namespace of the user's.

* ``plan`` (any process): names, addresses, rates and what ``tc`` and ``ip`` are told; no processes.
* ``held`` (the kernel): a node's identity, its namespace files held open from the moment it is ready;
  every command enters through them, never through a pid.
* ``namespaces`` (the kernel): the holder processes that keep the namespaces, and the commands
  run inside them; nothing outlives the holders.
* ``cluster`` (the kernel): :class:`distlab.Nodes`, the face a chapter uses.

May import: ``errors``, ``folders``.
"""
