"""The %%ranks magic in a real Jupyter kernel (jupyter_client), as a notebook frontend drives it."""
import os
import re
import signal
import time
from pathlib import Path

import nbformat
import pytest
from nbrun import execute
from procs import running

from distlab.warm import errors as err

pytestmark = pytest.mark.slow
NOTEBOOK = Path(__file__).with_name("ranks_magic.ipynb")

# A cell cut short (a limit, an interrupt) shows its error within this, plus the ranks' restart when
# one is needed: collecting the stacks takes ~0.05 s on an idle machine. Before distlab learnt that a
# rank stuck in a collective reports it (distlab.warm.watch), each stuck rank was waited for 2 s.
SOON_S = 1.0


class Kernel:
    """A kernel and a client; ``run`` sends a cell and gathers what a notebook would show.

    ``live``: the kernel believes a Jupyter server started it, as JupyterLab's kernels do
    (JPY_SESSION_NAME), so %%ranks cells draw their status line.
    """

    def __init__(self, live: bool = False):
        from jupyter_client.manager import start_new_kernel

        env = {**os.environ, **({"JPY_SESSION_NAME": "ranks-test.ipynb"} if live else {})}
        self.km, self.kc = start_new_kernel(kernel_name="python3", startup_timeout=180, env=env)

    def send(self, code: str) -> str:
        return self.kc.execute(code)

    def collect(self, msg_id: str, timeout: float = 300, until=None) -> dict:
        """Messages of one cell until the kernel is idle (or ``until(cell)`` is true), with the
        time each arrived: ``started`` (the cell began), ``displays`` (each draw of a display:
        time, display id, text) and ``error_at``."""
        cell = {"streams": [], "result": None, "error": None, "count": None, "displays": [], "started": None,
                "error_at": None}
        while True:
            msg = self.kc.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                cell["streams"].append((time.monotonic(), content["name"], content["text"]))
            elif kind == "execute_result":
                cell["result"], cell["count"] = content["data"]["text/plain"], content["execution_count"]
            elif kind == "error":
                cell["error"], cell["error_at"] = (content["ename"], content["evalue"]), time.monotonic()
                cell["traceback"] = "\n".join(content["traceback"])
            elif kind == "execute_input":
                cell["count"], cell["started"] = content["execution_count"], time.monotonic()
            elif kind in ("display_data", "update_display_data"):
                cell["displays"].append((time.monotonic(), content["transient"].get("display_id"),
                                         content["data"].get("text/plain", "")))
            elif kind == "status" and content["execution_state"] == "idle":
                return cell
            if until is not None and until(cell):
                return cell

    def run(self, code: str, timeout: float = 300) -> dict:
        return self.collect(self.send(code), timeout)

    def wait_for_text(self, msg_id: str, text: str, times: int, timeout: float = 120) -> dict:
        return self.collect(msg_id, timeout, until=lambda c: stdout(c).count(text) >= times)

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def stdout(cell: dict) -> str:
    return "".join(text for _, name, text in cell["streams"] if name == "stdout")


def ok(cell: dict) -> dict:
    assert cell["error"] is None, cell["error"]
    return cell


@pytest.fixture(scope="module")
def kernel():
    k = Kernel(live=True)  # as in JupyterLab
    ok(k.run("%load_ext distlab\nimport distlab\nranks = distlab.Ranks(2)"))
    yield k
    k.run("ranks.close()")
    k.close()


def test_a_ranks_cell_streams_each_rank_live_and_shows_each_last_expression(kernel):
    cell = ok(kernel.run("%%ranks\nimport time\nprint('start', rank)\ntime.sleep(2)\nprint('end', rank)\n"
                         "t = torch.ones(1) * (rank + 1)\ndist.all_reduce(t)\nt.item()"))
    assert sorted(stdout(cell).splitlines()) == ["[rank0] end 0", "[rank0] start 0", "[rank1] end 1",
                                                 "[rank1] start 1"]
    first_start = min(t for t, _, text in cell["streams"] if "start" in text)
    last_end = max(t for t, _, text in cell["streams"] if "end" in text)
    assert last_end - first_start >= 1.5, "the lines before the sleep arrived only at the end: not live"
    assert cell["result"] == "[rank0] 3.0\n[rank1] 3.0"


def test_only_ranks_cells_go_to_the_ranks_and_a_subset_runs_alone(kernel):
    ok(kernel.run("kernel_only = 41"))
    cell = ok(kernel.run("%%ranks\n'kernel_only' in globals()"))
    assert cell["result"] == "[rank0] False\n[rank1] False"
    cell = ok(kernel.run("%%ranks 1\nprint('just me')\nrank"))
    assert stdout(cell) == "[rank1] just me\n" and cell["result"] == "[rank1] 1"
    assert ok(kernel.run("kernel_only + 1"))["result"] == "42"
    cell = ok(kernel.run("%%ranks\nno_value_here = rank"))
    assert cell["result"] is None and cell["streams"] == []


def test_push_brings_the_notebooks_variables_into_the_cells_ranks_only(kernel):
    ok(kernel.run("import torch\nw = torch.tensor([1.0, 2.0])\nscale = 3"))
    cell = ok(kernel.run("%%ranks 1 --push w,scale\n(w * scale).tolist()"))
    assert cell["result"] == "[rank1] [3.0, 6.0]"
    cell = ok(kernel.run("%%ranks\n'scale' in globals()"))
    assert cell["result"] == "[rank0] False\n[rank1] True"
    cell = kernel.run("%%ranks --push nowhere\nran = True")
    shown = "".join(text for _, name, text in cell["streams"] if name == "stderr")
    assert shown.startswith("UsageError: %%ranks --push: the notebook has no variable 'nowhere'")
    assert ok(kernel.run("%%ranks\n'ran' in globals()"))["result"] == "[rank0] False\n[rank1] False"


def test_output_of_different_cells_never_mixes(kernel):
    first = ok(kernel.run("%%ranks\nimport threading, time\n"
                          "th = threading.Thread(target=lambda: (time.sleep(0.5), print('late', rank)))\n"
                          "th.start()\nprint('first cell')"))
    second = ok(kernel.run("%%ranks\nth.join()  # the late line is printed while this cell runs\nprint('second cell')"))
    assert sorted(stdout(first).splitlines()) == ["[rank0] first cell", "[rank1] first cell"]
    assert sorted(stdout(second).splitlines()) == ["[rank0] second cell", "[rank1] second cell"]
    late = ok(kernel.run("dict(sorted(ranks.late_output.items()))"))["result"]  # in rank order, not arrival
    assert late == "{0: 'late 0\\n', 1: 'late 1\\n'}"


def test_a_failing_rank_raises_with_the_cells_own_line_numbers(kernel):
    cell = kernel.run("%%ranks\na = 1\nb = 2\nif rank == 1:\n    raise ValueError('only rank 1')")
    name, value = cell["error"]
    assert name == "RankError" and value.startswith(f"distlab: rank 1 raised ValueError in Cell In[{cell['count']}].")
    assert f'File "Cell In[{cell["count"]}]", line 5, in <module>\n    raise ValueError' in value
    assert value.endswith("The ranks are still usable: the process group passed a health check "
                          "and every variable is kept.")
    assert ok(kernel.run("%%ranks\na + b"))["result"] == "[rank0] 3\n[rank1] 3"


def test_ranks_run_names_the_cell_that_defined_the_function(kernel):
    defined = ok(kernel.run("def share(x):\n    return 1 / x"))
    name, value = kernel.run("ranks.run(share, 0)")["error"]
    assert name == "RankError" and "distlab: rank 0 raised ZeroDivisionError in ranks.run(share)" in value
    assert f'File "Cell In[{defined["count"]}]", line 2, in share\n    return 1 / x' in value
    assert ok(kernel.run("ranks.run(share, 4)"))["result"] == "[rank0] 0.25\n[rank1] 0.25"


def test_kernel_interrupt_stops_a_sleeping_cell_and_keeps_the_ranks(kernel):
    msg_id = kernel.send("%%ranks\nkeep = rank\nimport time\nprint('sleeping')\ntime.sleep(120)")
    started = kernel.wait_for_text(msg_id, "sleeping", 2)
    kernel.km.interrupt_kernel()
    cell = kernel.collect(msg_id)
    name, value = cell["error"]
    assert name == "RanksInterrupted" and "was interrupted on ranks 0, 1." in value
    assert value.count(f'File "Cell In[{started["count"]}]", line 5 in <module>') == 2
    shown = cell["traceback"]  # what the notebook shows: the message, no distlab frames above it
    assert "was interrupted on ranks 0, 1." in shown
    assert not any(frame in shown for frame in ("run_cell_magic", "magic.py", "ranks.py")), shown
    assert ok(kernel.run("%%ranks\nkeep"))["result"] == "[rank0] 0\n[rank1] 1"


def test_kernel_interrupt_in_a_blocked_collective_restarts_the_ranks(kernel):
    msg_id = kernel.send("%%ranks\nprint('in')\nif rank == 0:\n    dist.all_reduce(torch.ones(1))")
    started = kernel.wait_for_text(msg_id, "in", 2)
    interrupted = time.monotonic()
    kernel.km.interrupt_kernel()
    cell = kernel.collect(msg_id)
    name, value = cell["error"]
    assert cell["error_at"] - interrupted <= SOON_S + restart_s(kernel), "a stuck rank was waited for"
    assert name == "RanksInterrupted" and "in all_reduce" in value
    assert f'File "Cell In[{started["count"]}]", line 4 in <module>' in value
    assert "so the ranks were restarted: every variable on them is lost" in value
    cell = ok(kernel.run("%%ranks\n'keep' in globals(), world_size"))
    assert cell["result"] == "[rank0] (False, 2)\n[rank1] (False, 2)"


def restart_s(kernel) -> float:
    """How long the last (re)start of the kernel's ranks took, by their own clock."""
    return float(ok(kernel.run("ranks.start_s"))["result"])


def status_lines(cell: dict, before: float | None = None) -> list[str]:
    return [text for t, _, text in cell["displays"] if before is None or t < before]


def test_a_timed_out_cell_shows_its_ranks_and_limit_at_once_and_its_error_soon_after_the_limit(kernel):
    cell = kernel.run("%%ranks --timeout 2\nif rank == 0:\n    dist.all_reduce(torch.ones(1))  # rank 1 never calls it")
    assert cell["error"][0] == "RanksTimeoutError" and "in all_reduce" in cell["error"][1]
    assert "(rank 0 stayed blocked in all_reduce after an interrupt, waiting for a rank that had left the call)" \
        in cell["error"][1]
    assert "_forkwarm" not in cell["error"][1] and "rank_watch" not in cell["error"][1]  # how it started: noise
    first_at, display_id, first = cell["displays"][0]
    assert first_at - cell["started"] < 1.0, "the cell stayed blank"
    assert first.startswith("distlab: ranks 0, 1 · limit 2 s · "), first
    assert {d for _, d, _ in cell["displays"]} == {display_id}, "one line, redrawn in place"
    live = status_lines(cell, before=cell["error_at"])
    assert any("rank 0 running · rank 1 done in" in text for text in live), live  # silent, yet visibly running
    assert any("limit reached: collecting where each rank is" in text for text in live), live
    assert "timed out at" in live[-1] and "rank 0 blocked in all_reduce" in live[-1], live[-1]
    took = cell["error_at"] - cell["started"]
    print(f"\n%%ranks --timeout 2, rank 0 stuck in all_reduce: error {took:.2f} s after the cell started")  # pytest -s
    assert took <= 2 + SOON_S + restart_s(kernel), f"limit 2 s, error after {took:.2f} s"
    assert ok(kernel.run("%%ranks\nworld_size"))["result"] == "[rank0] 2\n[rank1] 2"  # restarted


def test_a_subset_stuck_in_a_collective_is_cut_at_its_limit(kernel):
    cell = kernel.run("%%ranks 0 --timeout 1\ndist.all_reduce(torch.ones(1))  # rank 1 is not in this cell")
    assert cell["error"][0] == "RanksTimeoutError" and "on rank 0." in cell["error"][1]
    assert status_lines(cell)[0].startswith("distlab: rank 0 · limit 1 s · ")
    assert cell["error_at"] - cell["started"] <= 1 + SOON_S + restart_s(kernel)


def test_the_status_line_ticks_while_ranks_are_silent_and_empties_when_the_cell_succeeds(kernel):
    cell = ok(kernel.run("%%ranks\nimport time\ntime.sleep(1.2)\nrank"))
    lines = status_lines(cell)
    assert lines[0].startswith("distlab: ranks 0, 1 · limit none · 0.0 s · rank 0 running · rank 1 running"), lines
    ticking = re.compile(r"limit none · ([\d.]+) s · rank 0 running · rank 1 running")
    clock = [float(m) for m in ticking.findall("\n".join(lines))]
    assert len(set(clock)) >= 3 and clock == sorted(clock) and max(clock) >= 0.7, lines  # the clock moves
    assert lines[-1] == "" and cell["result"] == "[rank0] 0\n[rank1] 1" and cell["streams"] == []


def alive(pids):
    return [p for p in pids if running(p)]


def test_a_killed_kernel_leaves_no_rank_behind():
    k = Kernel()
    try:
        ok(k.run("%load_ext distlab"))
        shown = "".join(text for _, name, text in k.run("%%ranks\nrank")["streams"] if name == "stderr")
        assert shown == "UsageError: " + err.NO_RANKS + "\n"
        cell = ok(k.run("import os, distlab\nranks = distlab.Ranks(2)\nprint(os.getpid(), *ranks.pids)"))
        kernel_pid, *pids = map(int, stdout(cell).split())
        assert len(alive(pids)) == 2
        os.kill(kernel_pid, signal.SIGKILL)
        deadline = time.time() + 5
        while alive(pids) and time.time() < deadline:
            time.sleep(0.05)
        assert alive(pids) == [], "ranks outlived their killed kernel"
    finally:
        k.close()


def test_the_magic_notebook_executes(tmp_path):
    ex = execute(NOTEBOOK)
    assert ex.error is None, ex.error
    outputs = [o for c in ex.notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert any("[rank1] after tensor([3., 3.])\n" in o.get("text", "") for o in outputs)
    stored = nbformat.read(NOTEBOOK, as_version=4)
    assert all(c.outputs == [] for c in stored.cells if c.cell_type == "code"), "store the notebook without outputs"
