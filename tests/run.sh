#!/usr/bin/env bash
# The whole test suite on a fresh machine: sets up .venv, then lint, unit, launcher, notebook,
# book-build and browser tests. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup-venv.sh"
ruff check src tests bench book/i18n.py book/glossary.py book/kernel_metadata.py book/record.py book/fit_code.py
python -m pytest "$@"
