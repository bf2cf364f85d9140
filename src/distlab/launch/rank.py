"""``python -m distlab.launch.rank RUN_JSON TARGET [ARGS...]``: how distlab starts every rank.

A separate module so that ``distlab.worker`` is imported once, under its own name, and the
state it installs is the state the generated script sees.
"""
import sys

from distlab.worker import bootstrap

if __name__ == "__main__":
    bootstrap(sys.argv[1:])
