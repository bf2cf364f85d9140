"""The GPU check fails loudly, never skips, where it cannot verify the GPU path (this machine has no GPU)."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def _gpu_chapters():
    spec = importlib.util.spec_from_file_location("gpu_chapters", ROOT / "bench" / "gpu_chapters.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_fails_without_a_gpu():
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}   # no GPU, even on a GPU machine
    out = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAIL gpu_check: no CUDA device here" in out.stdout and "SKIP" not in out.stdout


def test_gpu_chapters_refuses_without_gpu_jupyter_or_cuda_mode(monkeypatch, capsys):
    chapters = _gpu_chapters()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert chapters.main([]) == 2
    assert "FAIL gpu_chapters: no CUDA device visible" in capsys.readouterr().out
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("DISTLAB_DEVICE", raising=False)
    assert chapters.main([]) == 2
    assert "DISTLAB_DEVICE is not cuda" in capsys.readouterr().out


def test_gpu_chapters_runs_every_chapter_and_the_intro():
    names = [p.name for p in _gpu_chapters().chapters([])]
    assert names[0].startswith("01_") and "intro.ipynb" in names and "12_beyond_data_parallel.ipynb" in names
    assert len(names) == len(list((ROOT / "book").glob("*.ipynb")))
