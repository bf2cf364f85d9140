#!/usr/bin/env bash
# Builds the book with every chapter executed: HTML under _build/html. Sets up .venv first.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../tests/setup-venv.sh"
jupyter-book build . -W --keep-going "$@"
