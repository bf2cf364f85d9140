"""The README's install gives torch's CPU build: tests/install-torch-cpu.sh, which tests/setup-venv.sh runs
before requirements.txt.

A laptop without this machine's wheel is played by pip with no configuration and no find-links, and two
package indexes on 127.0.0.1: "PyPI", whose torch of the pinned release is the CUDA build (it requires an
NVIDIA package), and "PyTorch's CPU index" with <release>+cpu. pip runs with ``--dry-run --report``: what it
would install, from where. The wheels are made here (a METADATA file is all pip reads).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

sys.path.insert(0, str(Path(__file__).parent))
from platform_stack import serve  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "install-torch-cpu.sh"
PIN = re.search(r"^torch==(\S+)", (ROOT / "requirements.txt").read_text(), re.M).group(1)


def make_wheel(folder: Path, version: str, requires: tuple[str, ...] = ()) -> Path:
    path = folder / f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("torch/__init__.py", "")
        wheel.writestr(f"{info}/METADATA", metadata)
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path


def make_index(folder: Path, wheel: Path) -> None:
    """A PEP 503 simple index at ``folder`` whose only project is torch, with ``wheel``."""
    (folder / "torch").mkdir(parents=True)
    (folder / "torch" / "index.html").write_text(f'<a href="../{wheel.name.replace("+", "%2B")}">{wheel.name}</a>\n')
    wheel.rename(folder / wheel.name)


@pytest.fixture
def laptop(tmp_path):
    """(environment of a pip with no configuration and two indexes on 127.0.0.1, the CPU index's address)."""
    make_index(tmp_path / "site" / "pypi", make_wheel(tmp_path, PIN, requires=("nvidia-cuda-runtime-cu12",)))
    make_index(tmp_path / "site" / "cpu", make_wheel(tmp_path, f"{PIN}+cpu"))
    with serve(tmp_path / "site") as url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=f"{url}/pypi/", DISTLAB_TORCH_INDEX=f"{url}/cpu/")
        yield env, f"{url}/cpu/"


def would_install(env: dict, tmp_path: Path) -> list[tuple[str, str, str]]:
    report = tmp_path / "report.json"
    done = subprocess.run(["bash", str(SCRIPT), sys.executable, "--dry-run", "--ignore-installed",
                           "--report", str(report)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return [(i["metadata"]["name"], i["metadata"]["version"], i["download_info"]["url"])
            for i in json.loads(report.read_text())["install"]]


def test_a_laptop_gets_the_cpu_build_from_pytorchs_cpu_index(laptop, tmp_path):
    env, cpu_index = laptop
    (name, version, url), = would_install(env, tmp_path)
    assert (name, version) == ("torch", f"{PIN}+cpu") and url.startswith(cpu_index), url
    assert SpecifierSet(f"=={PIN}").contains(version)      # requirements.txt's pin keeps it


def test_a_wheel_on_this_disk_is_taken_without_asking_any_index(laptop, tmp_path):
    env, _ = laptop
    disk = tmp_path / "disk"
    disk.mkdir()
    make_wheel(disk, f"{PIN}+cpu")
    env = {**env, "PIP_FIND_LINKS": str(disk), "DISTLAB_TORCH_INDEX": "http://127.0.0.1:9/unreachable/"}
    (name, version, url), = would_install(env, tmp_path)
    assert version == f"{PIN}+cpu" and url.startswith("file://") and str(disk) in url, url


def test_setup_venv_installs_it_before_the_requirements():
    text = (ROOT / "tests" / "setup-venv.sh").read_text()
    torch_step, requirements = text.find("install-torch-cpu.sh"), text.find("-r requirements.txt")
    assert 0 < torch_step < requirements
