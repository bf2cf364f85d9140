"""What the launcher runs in each rank of a check: record, then run the learner's script.

A file of its own (not ``python -m``): distlab's launcher runs a script path, and this one must not
be ``distlab.check.rank`` run a second time as ``__main__`` (its ``Traced`` must pickle by that name).
"""
import sys

from distlab.check.rank import main

if __name__ == "__main__":
    main(sys.argv[1:])
