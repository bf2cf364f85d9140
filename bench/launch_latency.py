"""Launch latency: a trivial 2-rank gloo job started from a process that has already imported torch, by
distlab and by the other launchers, medians against two bare Popen workers.

The benchmark is :mod:`distlab.teach.launch_latency` (in the package, because chapter 10 runs it where
no bench/ folder lies beside the chapter); its docstring says what each row times.
Usage: python bench/launch_latency.py [--repeats 7] [--no-scripts] [--quick]
Last line: `ratio: X` = distlab / bare.
"""
from distlab.teach.launch_latency import main

if __name__ == "__main__":
    main()
