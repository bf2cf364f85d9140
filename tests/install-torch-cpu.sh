#!/usr/bin/env bash
# Installs requirements.txt's torch, as PyTorch's CPU build, into the environment of PYTHON; tests/setup-venv.sh
# runs it before `pip install -r requirements.txt`.
#
# On Linux, PyPI's torch is the CUDA build (torch 2.13.0: a 527 MB wheel and several GB of CUDA packages),
# pinned or not. PyTorch's CPU wheel index has each release as <version>+cpu (about 190 MB), which
# requirements.txt's torch==<version> accepts, so the install that follows keeps it. A CPU wheel that pip
# finds without any index (its find-links: a wheel on this machine's disk, as CI has) is taken first, with no
# network; else the CPU index ($DISTLAB_TORCH_INDEX replaces it). Where neither answers, it says so and leaves
# torch to requirements.txt. Not on Linux, nothing is done (PyPI's torch for macOS is a CPU build).
#
#     bash tests/install-torch-cpu.sh .venv/bin/python [pip options, e.g. --dry-run --report r.json]
set -euo pipefail
python="$1"
shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pin="$(sed -n 's/^\(torch==[^ #]*\).*/\1/p' "$root/requirements.txt")"
index="${DISTLAB_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
if [ "$(uname -s)" != Linux ]; then exit 0; fi
"$python" -m pip install --quiet --no-deps --no-index "$@" "$pin+cpu" 2>/dev/null \
  || "$python" -m pip install --quiet --no-deps --index-url "$index" "$@" "$pin+cpu" \
  || { echo "install-torch-cpu.sh: could not get $pin+cpu from $index (above); requirements.txt's torch will" \
         "come from PyPI, the CUDA build on Linux (several GB)" >&2; exit 0; }
