"""How ranks meet without a port another local user could open, and part quickly.

A ``TCPStore`` has no authentication, and loopback is not privacy. A single-node run meets in a
``FileStore`` in its private run folder instead, with torch's own rendezvous pointed at a port
nothing listens on; a store that torch does open on a port is served on 127.0.0.1 and checked
for its owner.

Modules, each with the process it runs in:

* ``loopback``: the single-node rendezvous: the placeholder port, the loopback store, who holds a
  port (kernel, torchelastic's agent, every rank).
* ``prompt_store``: a ``FileStore`` that notices a key within a fraction of a millisecond (every rank).
* ``retired_groups``: a destroyed gloo group closes when its rank exits, not inside
  ``destroy_process_group`` (every rank).

May import: ``errors``.
"""
