#!/usr/bin/env bash
# Builds the book with every chapter executed: HTML under _build/html, with distlab's wheel in
# _build/html/_static/ (every chapter's first cell installs it from the published book). Sets up .venv first.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../tests/setup-venv.sh"
jupyter-book build . -W --keep-going "$@"
python book/wheel.py _build/html/_static
