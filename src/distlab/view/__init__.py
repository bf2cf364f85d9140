"""What the learner sees of a run: live per-rank lines, the record a cell keeps, readable stacks.

Modules, each with the process it runs in (all in the kernel):

* ``display``: where live rank output goes: a text stream (every frontend, CI, the built book) or
  one display output redrawn in place (JupyterLab, Notebook, Colab, VS Code), which the static record
  replaces when a run ends; ``shown_in`` draws a run's displays into an existing output (a knob's run).
* ``record``: each rank's state and output during a run, the live view and the record as HTML and
  text. Pure.
* ``streams``: a rank's output cut into ordinary lines and progress bars redrawing a line in place
  (``\\r``). Pure.
* ``bars``: progress bars in a text front end: one line per bar that updates in place (a kernel
  output updated by display id, or a terminal's bottom line), never on stderr.
* ``stacks``: a rank's stack dump cut down to the learner's frames (a launch's timeout, a warm
  rank's). Pure.

May import: ``errors``. Code that runs inside a rank never imports this folder.
"""
