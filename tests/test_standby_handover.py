"""A standby agent killed at each moment of its hand-over (issue #60): the launch runs anyway, on a
fresh agent, unless the standby had already taken the run; then its death is the run's error, naming
the node and the exit status. Deterministic: the kernel's side is killed from the hand-over's hook
(:func:`distlab.launch.standby.at`), the standby's side kills itself at the named step; no sleeps.

The nodes are stand-ins whose ``command`` runs a small script in place of ``python -m
distlab.launch.agent`` (the standby's protocol, a fresh agent's report), so each case takes
milliseconds instead of an interpreter importing torch.
"""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from distlab.folders.runfolder import RunFolder
from distlab.launch import engine, standby, watch

pytestmark = pytest.mark.slow  # it starts (small) processes

AGENT = textwrap.dedent("""
    import json, os, signal, sys

    role, die_at, report = sys.argv[1:4]

    def step(moment):
        if moment == die_at:
            os.kill(os.getpid(), signal.SIGKILL)

    if role == "standby":  # distlab.launch.agent.standby's side of the hand-over
        step("start")
        print("ready", flush=True)
        step("ready")
        request = sys.stdin.readline().split()
        if len(request) != 3:
            sys.exit(0)
        run_dir, node, log = request
        step("request")
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        step("log")
        print("taken", flush=True)
        os.dup2(fd, 1)
        step("taken")
        if die_at == "hold":  # the run's agent, busy until the kernel's side kills it
            signal.pause()
    else:  # a fresh agent: python -m distlab.launch.agent RUN_DIR NODE
        run_dir, node = sys.argv[4:6]
    print(f"{role} ran node {node}", flush=True)
    with open(os.path.join(run_dir, report), "w") as f:
        json.dump({"status": "ok", "ran_by": role}, f)
""")


class StandInNodes:
    """One node whose commands run the script above (standbys die at ``die_at``)."""

    def __init__(self, script: Path, die_at: str, report: str):
        self.n, self.closed = 1, False
        self.script, self.die_at, self.report = script, die_at, report

    def command(self, node: int, argv: list[str]) -> list[str]:
        if argv[-1] == "--standby":
            return [sys.executable, str(self.script), "standby", self.die_at, self.report]
        return [sys.executable, str(self.script), "fresh", "-", self.report, *argv[-2:]]

    def close(self) -> None:
        self.closed = True
        with standby._LOCK:
            left = list(standby._WAITING.pop(self, {}).values())
        for proc in left:
            standby._discard(proc)


def launch(tmp_path: Path, die_at: str, kill_at: str | None, monkeypatch) -> tuple[engine.Outcome, RunFolder]:
    """A launch on the stand-in node after one launch left a standby there, killed at ``kill_at``
    by the kernel (``waiting``: before the launch) or dying itself at ``die_at``."""
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    run = tmp_path / "run"
    run.mkdir()
    folder = RunFolder(run)
    nodes = StandInNodes(script, die_at, folder.node_file(folder.agent_json, 0).name)
    try:
        standby.refill(nodes)
        waiting = standby._WAITING[nodes][0]
        if kill_at == "waiting":
            waiting.kill()
            waiting.wait()

        def at(moment, proc):
            if moment == kill_at:
                proc.kill()
                proc.wait()

        monkeypatch.setattr(standby, "at", at, raising=False)
        plan = engine.Plan(run_dir=run, target=run / "target.py", nproc=1, nnodes=2, start="spawn")
        outcome = engine.Outcome()
        engine.run_agent_process(plan, watch.Watcher(folder, "handover", 1, None, None), outcome, nodes=nodes)
        return outcome, folder
    finally:
        nodes.close()


BEFORE_TAKEN = [("start", None), ("ready", None), ("request", None), ("log", None),
                ("never", "waiting"), ("never", "picked"), ("never", "handed")]


@pytest.mark.parametrize(("die_at", "kill_at"), BEFORE_TAKEN)
def test_a_standby_killed_before_it_took_the_run_leaves_it_to_a_fresh_agent(tmp_path, monkeypatch, die_at, kill_at):
    outcome, folder = launch(tmp_path, die_at, kill_at, monkeypatch)
    assert (outcome.error, outcome.failures, outcome.interrupted) == (None, None, False)
    assert json.loads(folder.node_file(folder.agent_json, 0).read_text())["ran_by"] == "fresh"
    assert folder.node_file(folder.agent_log, 0).read_text() == "fresh ran node 0\n"


@pytest.mark.parametrize(("die_at", "kill_at"), [("taken", None), ("hold", "confirmed")])
def test_a_standby_killed_after_it_took_the_run_is_that_runs_agent_dying(tmp_path, monkeypatch, die_at, kill_at):
    outcome, folder = launch(tmp_path, die_at, kill_at, monkeypatch)
    assert outcome.failures is None
    assert outcome.error == ("the agent on node 0 exited with code -9 (killed by SIGKILL) "
                             "before it wrote anything to its log (agent-node0.log)")
    assert not folder.node_file(folder.agent_json, 0).exists()


def test_a_standby_that_takes_the_run_runs_it(tmp_path, monkeypatch):
    outcome, folder = launch(tmp_path, "never", None, monkeypatch)
    assert (outcome.error, outcome.failures) == (None, None)
    assert json.loads(folder.node_file(folder.agent_json, 0).read_text())["ran_by"] == "standby"
    assert folder.node_file(folder.agent_log, 0).read_text() == "standby ran node 0\n"


def test_a_launch_interrupted_while_the_standby_takes_its_run_stops_that_standby(tmp_path, monkeypatch):
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    nodes = StandInNodes(script, "never", "agent-node0.json")
    try:
        standby.refill(nodes)
        proc = standby.take(nodes, 0)

        def interrupted(moment, proc):
            if moment == "handed":
                raise KeyboardInterrupt

        monkeypatch.setattr(standby, "at", interrupted)
        with pytest.raises(KeyboardInterrupt):
            standby.hand(proc, tmp_path, 0, tmp_path / "agent-node0.log")
        assert proc.poll() is not None  # stopped, not left to run the run nobody watches
    finally:
        nodes.close()


def test_an_agent_with_a_log_reports_its_end(tmp_path):
    folder = RunFolder(tmp_path)
    folder.node_file(folder.agent_log, 1).write_text("Traceback: boom\n")
    assert engine.agent_exit(folder, 1, 3) == "the agent on node 1 exited with code 3:\nTraceback: boom\n"
    assert engine.agent_exit(folder, None, -15) == (
        "the agent exited with code -15 (killed by SIGTERM) before it wrote anything to its log (agent.log)")
