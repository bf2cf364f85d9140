"""Chapter 2 while another program holds the article's port 12355 (issue 33): another notebook
running the official tutorials, or a second user. The chapter teaches that collision (pitfall 1);
its own cells must not suffer it. Before: cell 5 waited 60 s for the port, then failed.
"""
import os
import textwrap
from pathlib import Path

import pytest
from nbrun import execute
from second_user import OTHER, other_python, start_as_other, stop_other, write_readable
from test_notebooks import unexpected_tracebacks

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "book" / "02_setup_cleanup.ipynb"
ARTICLE_PORT = 12355

HOLDER = """
import socket, sys, time
s = socket.socket(socket.AF_INET6)  # `::`, every interface, as torch's own TCPStore listens
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a connection of a run just over may linger in TIME_WAIT
s.bind(("::", int(sys.argv[1])))
s.listen()
print("READY", flush=True)
time.sleep(float(sys.argv[2]))
"""


@pytest.mark.slow
def test_chapter_2_runs_while_another_user_holds_port_12355(other_user, readable_src, monkeypatch):
    # the chapter's kernel imports this checkout's distlab, whatever folder it runs in
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "src"), *filter(None, [os.getenv("PYTHONPATH")])]))
    program = write_readable(readable_src, "hold_port.py", textwrap.dedent(HOLDER))
    holder = start_as_other(f"{other_python()} {program} {ARTICLE_PORT} 600")
    try:
        line = holder.stdout.readline()
        assert line.startswith("READY"), f"could not hold {ARTICLE_PORT} for the test: {line}"
        ex = execute(CHAPTER)
    finally:
        stop_other(holder)
    assert ex.error is None, ex.error
    assert not unexpected_tracebacks(ex.notebook)
    said = "".join(o.get("text", "") for c in ex.notebook.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert f"Port {ARTICLE_PORT} is in use on this machine right now (held by another user, {OTHER} " \
           f"(uid {other_user.pw_uid}))." in said
    assert "distlab.errors.PortInUseError" in said  # pitfall 1 still shows the collision, with its holder
