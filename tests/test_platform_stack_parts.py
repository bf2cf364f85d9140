"""The platform stack's parts that need no platform: the pins, the cached venv's name, a chapter's copy of it,
and the report of where a chapter stopped (tests/platform_stack.py, tests/platform_venv.py)."""
from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).parent))
import platform_stack  # noqa: E402
import platform_venv  # noqa: E402


def test_the_pins_are_colabs_and_name_the_cached_venv(monkeypatch, tmp_path):
    pins = platform_venv.pins()
    assert pins["torch"] == "2.11.0" and pins["ipykernel"] == "6.17.1" and pins["jupyter-client"] == "7.4.9"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = platform_venv.folder()
    assert first.parent == tmp_path / "distlab" and first.name.startswith("platform-")
    monkeypatch.setattr(platform_venv, "PINS", tmp_path / "other.txt")
    (tmp_path / "other.txt").write_text("torch==2.13.0\n")
    assert platform_venv.folder() != first            # other pins, another venv


def test_a_chapters_copy_installs_into_itself_and_starts_its_own_python(tmp_path):
    base = tmp_path / "base"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base)], check=True)
    (base / platform_venv.DONE).write_text("")
    script = base / "bin" / "tool"
    script.write_text(f"#!{base}/bin/python\nprint('tool')\n")
    script.chmod(0o755)
    python = platform_venv.layer(base, tmp_path / "copy")
    assert python == tmp_path / "copy" / "bin" / "python"
    assert (tmp_path / "copy" / "bin" / "tool").read_text().startswith(f"#!{tmp_path / 'copy'}/bin/python\n")
    assert script.read_text().startswith(f"#!{base}/bin/python\n")       # the cached venv's stays
    prefix = subprocess.run([str(python), "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True)
    assert prefix.stdout.strip() == str(tmp_path / "copy")               # pip installs there
    assert not (tmp_path / "copy" / platform_venv.DONE).exists()


def test_where_a_chapter_stopped_names_the_cell_and_the_ranks_own_error():
    nb = nbformat.v4.new_notebook()
    ok = nbformat.v4.new_code_cell("x = 1")
    bad = nbformat.v4.new_code_cell("model = DDP(\n    net, forward_sync_buffers=False)")
    bad.outputs = [nbformat.v4.new_output("error", ename="WorkerFailedError", evalue=(
        "distlab: rank 1 failed first (exit code 1)\nTraceback (most recent call last):\n  File ...\n"
        "TypeError: DistributedDataParallel.__init__() got an unexpected keyword argument 'forward_sync_buffers'\n"
        "Run folder (script and every rank's log): /tmp/run"),
        traceback=[])]
    on_purpose = nbformat.v4.new_code_cell("1 / 0")
    on_purpose.metadata["tags"] = ["raises-exception"]
    on_purpose.outputs = [nbformat.v4.new_output("error", ename="ZeroDivisionError", evalue="division", traceback=[])]
    nb.cells = [nbformat.v4.new_markdown_cell("# t"), on_purpose, ok, bad, nbformat.v4.new_code_cell("y = 2")]
    said = platform_stack.stopped_at(nb)
    assert said.startswith("code cell 3 of 4 (model = DDP(): WorkerFailedError: distlab: rank 1 failed first")
    assert said.endswith("unexpected keyword argument 'forward_sync_buffers'")


def test_the_summary_says_which_chapters_reached_the_end():
    runs = {"01_a": {"seconds": 10.0, "error": None, "stopped": None, "replaced": {}, "install_seconds": 4.0},
            "03_b": {"seconds": 20.0, "error": "CellExecutionError", "stopped": "code cell 13 of 22 (...)",
                     "replaced": {"psutil": ("5.9.5", "7.2.2")}, "install_seconds": 5.0}}
    lines = platform_stack.summary(runs)
    assert "01_a  reached the end" in lines[0]
    assert "03_b  STOPPED at code cell 13 of 22" in lines[1] and "psutil" in lines[1]
    assert lines[2].strip() == "30.0 s  1 of 2 reached the end"


def test_the_book_is_served_on_loopback(tmp_path):
    (tmp_path / "_static").mkdir()
    (tmp_path / "_static" / "w.whl").write_bytes(b"wheel")
    with platform_stack.serve(tmp_path) as url:
        assert url.startswith("http://127.0.0.1:")
        assert urllib.request.urlopen(f"{url}/_static/w.whl", timeout=10).read() == b"wheel"
