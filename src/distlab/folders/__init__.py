"""Private folders: where distlab keeps what it runs and reads back, where only you can reach it.

distlab unpickles what its folders hold and runs the scripts in them, so every folder is a real
directory of yours that nobody else can enter, checked before it is trusted; temporary files that
torch writes and reads back go to a private folder too, never to the shared ``/tmp``.

Modules, each with the process it runs in:

* ``userns``: what a file's owner means inside a user namespace (the nodes' of an ordinary
  user), read from ``/proc`` (every process).
* ``owner``: which process made a private temporary folder, and whether that very process still
  runs (a stamp in the folder, read from ``/proc``; every process).
* ``private``: the runs root and what "private" means for a folder or file (the checks), and the
  names of the process folders in the root (every process).
* ``runfolder``: one launch's folder and its layout; pruning old runs (kernel; ranks read and write
  their files).
* ``privtmp``: this process's private temporary folder, and ``tempfile`` pointed at it while
  processes start (kernel, forkserver, a hand-run script).
* ``compile_cache``: ``torch.compile``'s cache in the private root (kernel, every rank).

May import: ``errors`` (and the standard library only). Order inside: ``userns``, ``owner`` <- ``private``
<- ``runfolder`` <- ``privtmp``; ``compile_cache`` on ``private``.
"""
