"""Notebook code -> a worker script a person can read and run. Pure: reads objects and text, starts nothing.

``torch.multiprocessing.spawn`` pickles a function by reference (``__main__.work``), and a fresh
interpreter has no notebook ``__main__`` to find it in. distlab writes the code itself into a
script instead: the function, the functions and classes it uses, the imports and constants of the
notebook. The script is the single truth of what the ranks run, whichever way they start.

Modules, each with the process it runs in:

* ``collect``: walks a function's globals and collects what it needs (kernel).
* ``source``: the source text of notebook functions and classes, checked against the live objects (kernel).
* ``script``: renders what was collected as the worker script (kernel).
* ``origins``: where each function of a script came from in the notebook, so a rank's traceback
  and its warnings name the cell (written in the kernel, read in each rank).

May import: ``errors``, ``folders``. Imported by the worker runtime and everything above it.
"""
