#!/usr/bin/env bash
# Creates .venv at the repository root and installs requirements.txt into it, once per change of
# requirements.txt/pyproject.toml. Sourced by book/build.sh and tests/run.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
stamp=".venv/.requirements-$(cat requirements.txt pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  python3 -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
  bash tests/install-torch-cpu.sh .venv/bin/python   # torch's CPU build first: PyPI's is the CUDA one
  .venv/bin/python -m pip install --quiet -r requirements.txt
  .venv/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
  rm -f .venv/.requirements-*
  touch "$stamp"
fi
export PATH="$root/.venv/bin:$PATH"
