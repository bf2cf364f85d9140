"""Issue #52 item 2: Kernel > Interrupt in a run on nodes (chapter 7's and 9's torchrun commands) ends
every process of the run on every node within seconds, and says so in one line.

The kernel is a real one (jupyter_client), interrupted as JupyterLab does it: SIGINT to the kernel's
process group. The commands stand in for torchrun: they ignore SIGTERM (torchrun's agents were seen
ignoring it for more than 8 s), and each starts a child in a session of its own (as torchrun starts its
ranks), out of reach of the command's process group.
"""
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# sh ignores SIGTERM, and so does sleep (an ignored signal stays ignored across exec)
STUBBORN = "trap '' TERM; setsid sh -c \"trap '' TERM; sleep 300\" & echo started; sleep 300"
SOON_S = 8.0  # TERM_S (3 s) for the commands, then SIGKILL; the rest is a busy machine's slack


def marked(mark: str) -> list[int]:
    """Pids of this user's processes started with TEST_MARK=mark in their environment."""
    found, want = [], f"TEST_MARK={mark}".encode()
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and want in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                found.append(int(entry))
        except OSError:
            continue
    return found


def net_namespaces() -> set[str]:
    out = subprocess.run(["lsns", "-t", "net", "-n", "-o", "NS"], capture_output=True, text=True).stdout
    return set(out.split())


def iopub_until(kc, msg_id: str, stop, timeout: float = 120) -> list[dict]:
    """The cell's iopub messages until ``stop(msg)`` is true or the kernel is idle."""
    msgs = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        msgs.append(msg)
        if stop(msg) or msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return msgs


def text_of(msgs: list[dict]) -> str:
    return "".join(m["content"].get("text", "") for m in msgs if m["msg_type"] == "stream")


@pytest.mark.skipif(not shutil.which("lsns"), reason="needs lsns (util-linux)")
def test_an_interrupt_ends_every_process_of_a_node_run_and_says_so_in_one_line():
    from jupyter_client.manager import start_new_kernel

    mark, before = uuid.uuid4().hex, net_namespaces()
    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=180)
    try:
        setup = ("import distlab\nfrom distlab.teach import training\nnodes = distlab.Nodes(2)\n"
                 f"run = training.OnNodes(nodes, [{STUBBORN!r}] * 2, env={{'TEST_MARK': {mark!r}}}, echo=False)\n"
                 "run.wait_for('started', node=0), run.wait_for('started', node=1)\n")
        reply = iopub_until(kc, kc.execute(setup), lambda m: False, timeout=180)
        assert not [m for m in reply if m["msg_type"] == "error"], reply
        started = time.monotonic()
        while len(marked(mark)) < 8 and time.monotonic() - started < 10:
            time.sleep(0.1)  # per node: the command's sh, its sleep, the setsid sh and its sleep
        assert len(marked(mark)) == 8
        msg_id = kc.execute("print('waiting', flush=True)\nrun.wait(timeout=300)")
        iopub_until(kc, msg_id, lambda m: "waiting" in m["content"].get("text", ""))
        time.sleep(0.5)
        km.interrupt_kernel()  # os.killpg(kernel's group, SIGINT), as JupyterLab does
        sent = time.monotonic()
        error = next(m for m in iopub_until(kc, msg_id, lambda m: m["msg_type"] == "error", timeout=60)
                     if m["msg_type"] == "error")
        took = time.monotonic() - sent
        iopub_until(kc, msg_id, lambda m: False)  # idle: a cell sent before would be aborted after the error
        traceback = error["content"]["traceback"]
        assert len(traceback) == 1, "\n".join(traceback)
        assert "distlab: interrupted; every process of these commands on node0 and node1 was stopped" in traceback[0]
        assert "SIGKILL" in traceback[0]  # they ignored SIGTERM
        assert took < SOON_S, took
        assert marked(mark) == []  # nothing of the run is left, on any node, in any session
        after = iopub_until(kc, kc.execute("print(nodes.run(1, 'hostname').stdout)\nnodes.close()"), lambda m: False)
        assert "node1" in text_of(after), [m["content"] for m in after if m["msg_type"] == "error"]  # still up
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        for pid in marked(mark):
            os.kill(pid, signal.SIGKILL)
    assert net_namespaces() <= before  # no namespace left (lsns: `ip link` never sees inside namespaces)


def test_an_interrupted_node_run_reads_as_one_line():
    from distlab.errors import NodeRunInterrupted, notebook_message

    e = NodeRunInterrupted(["node0", "node1"], killed=3)
    assert isinstance(e, KeyboardInterrupt)
    assert str(e) == ("distlab: interrupted; every process of these commands on node0 and node1 was stopped "
                      "(3 of them with SIGKILL). The nodes are still up: run the cell again.")
    assert e._render_traceback_() == notebook_message("", str(e))
    assert "SIGKILL" not in str(NodeRunInterrupted(["node0"], killed=0))


def test_killing_one_runs_processes_on_a_node_leaves_the_others():
    import distlab

    with distlab.Nodes(1) as nodes:
        env = {**os.environ, "TEST_MARK": "this-run"}
        ours = nodes.popen(0, ["sh", "-c", "setsid sleep 60 & sleep 60"], env=env, start_new_session=True)
        other = nodes.popen(0, ["sleep", "60"], start_new_session=True)
        try:
            time.sleep(0.5)
            killed = nodes.kill_processes(0, mark="TEST_MARK=this-run")
            assert len(killed) >= 3 and other.pid not in killed  # sh, its sleep and the one in its own session
            assert ours.wait(timeout=5) == -signal.SIGKILL and other.poll() is None
            assert marked("this-run") == []
        finally:
            for proc in (ours, other):
                proc.kill()
                proc.wait()
