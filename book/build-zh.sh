#!/usr/bin/env bash
# Builds the Chinese edition into _build/zh/html from the notebooks book/build.sh executed (one
# execution serves both editions); runs book/build.sh first when there is no up-to-date English build.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/tests/setup-venv.sh"
cd "$root"
if ! python -c 'import sys; sys.path.insert(0, "book"); import i18n; i18n.assemble_executed_copy(
        i18n.ROOT / "_build/zh/src", i18n.ROOT / "_build/jupyter_execute/book")' 2>/dev/null; then
  bash book/build.sh
fi
python book/i18n.py build-zh
