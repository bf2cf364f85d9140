#!/usr/bin/env bash
# The whole test suite on a fresh machine: sets up .venv, then lint, unit, launcher, notebook,
# book-build and browser tests, and the platform stack: each chapter alone, in a default container, on
# the platforms' own software (tests/constraints-platform.txt: Colab's torch, IPython, ipykernel), installing
# distlab from the built book (tests/test_platform_stack.py; its venv is cached under ~/.cache/distlab/,
# built on a new machine: about 5 GB, 3 minutes). Extra arguments go to pytest: `-m platform_stack` runs
# only that stack, `-m "not platform_stack"` all but it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-venv.sh"
ruff check src tests bench book/i18n.py book/glossary.py book/kernel_metadata.py book/record.py book/fit_code.py \
  book/install_cell.py book/wheel.py
python -m pytest "$@"
