"""Give chapters the notebook metadata a kernel reports, so JupyterLab opens them unmodified.

When JupyterLab connects a kernel it writes the kernel's ``kernelspec`` and ``language_info`` into
the notebook's metadata; a chapter stored with less (``{"name": "python"}``) is then marked modified
the moment it opens. This writes what this environment's ``python3`` kernel (ipykernel) reports.

    .venv/bin/python book/kernel_metadata.py book/*.ipynb       # rewrite
    .venv/bin/python book/kernel_metadata.py --check book/*.ipynb
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def kernel_metadata() -> dict:
    """``kernelspec`` and ``language_info`` as JupyterLab stores them for the ``python3`` kernel."""
    from ipykernel.ipkernel import IPythonKernel
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    return {"kernelspec": {"display_name": spec.display_name, "language": spec.language, "name": "python3"},
            "language_info": dict(sorted(IPythonKernel.language_info.items()))}


def fix(path: Path, wanted: dict) -> bool:
    """Write ``wanted`` into the notebook's metadata, keeping the file's format; True if it changed."""
    nb = json.loads(path.read_text())
    if all(nb["metadata"].get(key) == value for key, value in wanted.items()):
        return False
    nb["metadata"].update(wanted)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return True


def main(args: list[str]) -> int:
    check = "--check" in args
    wanted = kernel_metadata()
    stale = []
    for name in (a for a in args if a != "--check"):
        path = Path(name)
        if check:
            nb = json.loads(path.read_text())
            if any(nb["metadata"].get(key) != value for key, value in wanted.items()):
                stale.append(name)
        elif fix(path, wanted):
            print("updated", name)
    for name in stale:
        print(f"{name}: metadata differs from what the kernel reports (run book/kernel_metadata.py {name})")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
