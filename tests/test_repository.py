"""What the repository holds: only its own files, nothing of the machine it was made on."""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tracked() -> list[tuple[str, str]]:
    """(mode, path) of every file git tracks here."""
    out = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout (a copy of the tree): nothing to check")
    return [(line.split()[0], line.split("\t", 1)[1]) for line in out.stdout.splitlines()]


def test_no_tracked_link_leads_out_of_the_repository():
    """A link to an absolute path (``.venv -> <this machine's checkout>/.venv``) is one machine's
    path, and in every other clone a link to a folder that is not there, or to itself."""
    for mode, path in tracked():
        if mode == "120000":
            target = os.readlink(ROOT / path)
            resolved = (ROOT / path).parent.joinpath(target).resolve()
            assert not os.path.isabs(target) and resolved.is_relative_to(ROOT), f"{path} -> {target}"


@pytest.mark.parametrize("folder", [".venv", "build", "_build", "mutants"])
def test_no_build_output_or_environment_is_tracked(folder):
    assert not [p for _, p in tracked() if p == folder or p.startswith(folder + "/")]
