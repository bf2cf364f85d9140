"""Teaching helpers used by the book's chapters: the article's models and data, reference
implementations that check what the chapters show, and exercise self-checks.

Only :mod:`distlab.plots` imports matplotlib.
"""
