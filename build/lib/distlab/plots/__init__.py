"""Plots for the book's chapters; the only place distlab imports matplotlib.

One module per chapter topic (e.g. ``distlab.plots.collectives``); each function returns the
matplotlib Figure it drew so a chapter cell can show it and a test can inspect it.
"""
