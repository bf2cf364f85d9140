"""Drive a kernel of the platforms' Jupyter (Colab's IPython 7.34, ipykernel 6.17, ipywidgets 7.7,
jupyter_client 7.4) as JupyterLab does, and check what a learner uses there: the magics, the live
view's in-place updates, warm ranks, and a knob moved by a real widget message, then interrupted.

Run by tests/test_platform_jupyter.py with that platform venv's Python (``PYTHONPATH`` holds the
repository's ``src``): ``python tests/platform_jupyter.py``. It needs only jupyter_client and what
that venv has; it prints one ``ok: ...`` line per check and exits non-zero on the first failure.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil
from jupyter_client.manager import start_new_kernel

LAB = """
import os, time
import distlab
from distlab.teach.knobs import knobs
MARK = {mark!r}

def hold(rank, pause):
    print('holding', flush=True)
    with open(MARK, 'a') as f:
        f.write(f'{{os.getpid()}}\\n')
    time.sleep(pause)
    return os.getpid()

def lab(world=2, pause=0):
    got = distlab.spawn(hold, args=(pause,), nprocs=world, timeout=120)
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    ax.bar(range(world), sorted(got.returns.values()))
    return fig

box = knobs(lab, world=(2, 3), pause=(0, 300))
"""


class Client:
    """One kernel of this Python, started as a Jupyter server starts JupyterLab's (JPY_SESSION_NAME)."""

    def __init__(self, spec_dir: Path):
        kernel = spec_dir / "kernels" / "platform"
        kernel.mkdir(parents=True)
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        (kernel / "kernel.json").write_text(json.dumps({"argv": argv, "language": "python",
                                                        "display_name": "platform"}))
        os.environ["JUPYTER_PATH"] = str(spec_dir)  # before every other kernelspec folder
        env = {**os.environ, "JPY_SESSION_NAME": "platform-check.ipynb"}
        self.km, self.kc = start_new_kernel(kernel_name="platform", startup_timeout=180, env=env)

    def collect(self, msg_id: str | None, timeout: float = 180, until=None) -> dict:
        """A cell's messages until the kernel is idle (or ``until(cell)``); ``msg_id`` None: any parent."""
        cell = {"stdout": "", "result": None, "error": None, "displays": [], "comms": []}
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.1, end - time.monotonic()))
            except Exception:  # queue.Empty: the loop's deadline decides
                continue
            if msg_id is not None and msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream" and content["name"] == "stdout":
                cell["stdout"] += content["text"]
            elif kind == "execute_result":
                cell["result"] = content["data"].get("text/plain")
            elif kind == "error":
                cell["error"] = (content["ename"], content["evalue"], "\n".join(content["traceback"]))
            elif kind in ("display_data", "update_display_data"):
                cell["displays"].append((kind, content.get("transient", {}).get("display_id"),
                                         sorted(content["data"]), content["data"].get("text/plain", "")))
            elif kind == "comm_msg":
                cell["comms"].append(content)
            elif kind == "status" and content["execution_state"] == "idle" and msg_id is not None:
                return cell
            if until is not None and until(cell):
                return cell
        raise AssertionError(f"no end of cell {msg_id} within {timeout} s: {cell}")

    def run(self, code: str, timeout: float = 180) -> dict:
        cell = self.collect(self.kc.execute(code), timeout)
        assert cell["error"] is None, f"{code!r} failed:\n{cell['error'][2]}"
        return cell

    def value(self, expression: str):
        return json.loads(self.run(f"import json as _j; print(_j.dumps({expression}))")["stdout"])

    def move(self, model_id: str, value) -> None:
        """What JupyterLab sends when a slider is let go (widget protocol 2, ipywidgets 7 and 8)."""
        data = {"method": "update", "state": {"value": value}, "buffer_paths": []}
        self.kc.shell_channel.send(self.kc.session.msg("comm_msg", {"comm_id": model_id, "data": data}))

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def ok(what: str) -> None:
    print(f"ok: {what}", flush=True)


def check_versions() -> None:
    import ipykernel
    import IPython
    import ipywidgets
    import jupyter_client

    print("versions:", f"IPython {IPython.__version__}, ipykernel {ipykernel.__version__}, ipywidgets "
          f"{ipywidgets.__version__}, jupyter_client {jupyter_client.__version__}, psutil {psutil.__version__}")


def check_magics(k: Client) -> None:
    k.run("%load_ext distlab\nimport distlab\nranks = distlab.Ranks(2)")
    cell = k.run("%%ranks\nprint('hello from', rank)\nt = torch.ones(1) * (rank + 1)\ndist.all_reduce(t)\nt.item()")
    assert sorted(cell["stdout"].splitlines()) == ["[rank0] hello from 0", "[rank1] hello from 1"], cell
    assert cell["result"] == "[rank0] 3.0\n[rank1] 3.0", cell["result"]
    ok("%load_ext distlab, warm ranks and a %%ranks cell")
    cell = k.run("%load_ext distlab.needs\n")
    cell = k.run("%%needs nodes\nneeds_ran = 41 + 1\nneeds_ran")
    ran = k.value("'needs_ran' in globals()")
    assert (ran and cell["result"] == "42") or (not ran and "Not run here" in cell["stdout"]), cell
    ok(f"%load_ext distlab.needs and a %%needs cell ({'ran' if ran else 'shown as recorded'})")


def check_live_view(k: Client) -> None:
    cell = k.run("def two(rank):\n    print('line of', rank)\n    return rank\n"
                 "res = distlab.spawn(two, nprocs=2)")
    ids = {d[1] for d in cell["displays"]}
    kinds = [d[0] for d in cell["displays"]]
    assert len(ids) == 1 and kinds[0] == "display_data" and "update_display_data" in kinds, cell["displays"]
    assert "done in" in cell["displays"][-1][3] and "line of 1" in cell["displays"][-1][3], cell["displays"][-1]
    ok("the live view: one display output, redrawn in place by its display id, ending as the record")


def check_psutil() -> None:
    import socket

    from distlab.worker import _serving

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert _serving(s.getsockname()[1])
    ok(f"psutil {psutil.__version__}: this process's listening sockets are found")


def check_knob(k: Client, mark: Path) -> None:
    cell = k.run(LAB.format(mark=str(mark)))
    assert any("VBox" in d[3] for d in cell["displays"]), "no controls were shown"
    assert any("image/png" in d[2] for d in cell["displays"]), "no picture was shown"
    world_id = k.value("box.widgets['world'].model_id")
    runs_id = k.value("box.runs_display_id")
    k.move(world_id, 3)
    moved_view = k.collect(None, 120, until=lambda c: any(d[1] == runs_id and "3 ranks done in" in d[3]
                                                          for d in c["displays"]))  # the run's own record
    assert "3 ranks done" in moved_view["displays"][-1][3], moved_view["displays"]
    end = time.monotonic() + 120
    while (moved := k.value("[box.runs, box.shown, box.threads, box.status.value]"))[1]["world"] != 3 \
            and time.monotonic() < end:
        time.sleep(0.2)
    assert moved[0] == 2 and moved[1] == {"world": 3, "pause": 0}, moved
    assert moved[2] == ["MainThread", "MainThread"], f"a knob's run went on another thread: {moved[2]}"
    ok(f"a slider let go ran the knob again on the kernel's main thread, its record in the cell: {moved[3]}")
    check_knob_interrupt(k, mark)


def check_knob_interrupt(k: Client, mark: Path) -> None:
    mark.write_text("")
    k.move(k.value("box.widgets['pause'].model_id"), 300)
    end = time.monotonic() + 120
    while len(mark.read_text().split()) < 3 and time.monotonic() < end:  # 3 ranks hold
        time.sleep(0.1)
    pids = [int(p) for p in mark.read_text().split()]
    assert len(pids) == 3, f"the ranks of the moved knob never held: {pids}"
    k.km.interrupt_kernel()
    end = time.monotonic() + 30
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids) \
            and time.monotonic() < end:
        time.sleep(0.1)
    left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not left, f"Kernel > Interrupt left the knob's ranks running: {left}"
    status = k.value("box.status.value")
    assert "interrupted" in status, status
    ok(f"Kernel > Interrupt stopped a knob's run and its ranks: {status}")


def main() -> int:
    check_versions()
    check_psutil()
    with tempfile.TemporaryDirectory(prefix="distlab-platform-") as tmp:
        k = Client(Path(tmp))
        try:
            check_magics(k)
            check_live_view(k)
            check_knob(k, Path(tmp) / "holding")
            k.run("ranks.close()")
        finally:
            k.close()
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
