"""``python -m distlab.launch.agent RUN_DIR [NODE]``: torchelastic's agent for a multi-node run, out of the kernel.

``--standby``: import everything an agent needs, say ``ready``, then wait on standard input for
``RUN_DIR NODE LOG`` (one line) and run that: a standby on each of :class:`distlab.Nodes` takes the
agent's own start-up (an interpreter and torch, ~2 s) off the next launch (see
:mod:`distlab.launch.standby`). Its input ending first (the kernel gone) ends it.

torch's c10d rendezvous unpickles state it reads from the rendezvous store, which anyone who
reaches ``rdzv_endpoint`` can write. So the kernel never runs that agent itself: it starts this
module, which reads the plan from the run folder, runs the agent, and writes the outcome as JSON
(``agent.json``, plain data) for the kernel to report. The agent dies with the kernel, and its
workers with it.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

from distlab import worker
from distlab.folders.private import write_private
from distlab.folders.runfolder import RunFolder
from distlab.launch import engine


def main(run_dir: str, node: int | None = None) -> int:
    """Run the agent of ``run_dir``'s plan; ``node``: this agent's node of a run across
    :class:`distlab.Nodes` (its files are ``agent-plan-node<k>.json`` and so on: the folder is shared)."""
    folder = RunFolder(run_dir)
    spec = json.loads(folder.node_file(folder.agent_plan, node).read_text())
    worker.die_with_parent(spec["kernel_pid"])
    run = json.loads(folder.run_json.read_text())
    run_json = folder.node_file(folder.run_json, node)
    write_private(run_json, json.dumps({**run, "parent_pid": os.getpid()}))  # the workers' parent
    plan = engine.Plan.from_json(spec["plan"])
    outcome = run_agent(plan, run_json)
    write_private(folder.node_file(folder.agent_json, node), json.dumps(outcome))
    return 0 if outcome["status"] == "ok" else 1


def run_agent(plan: engine.Plan, run_json) -> dict:
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        with engine.quiet_torchelastic():
            engine.launch_agent(plan, run_json)
        return {"status": "ok"}
    except ChildFailedError as e:
        return {"status": "failed", "failures": {str(r): engine.failure_record(f) for r, f in e.failures.items()}}
    except SignalException as e:
        return {"status": "interrupted", "signal": int(e.sigval)}
    except KeyboardInterrupt:
        return {"status": "interrupted", "signal": 2}
    except Exception:
        return {"status": "error", "error": traceback.format_exc()}


def standby() -> int:
    """Wait, with torchelastic imported, for the run this agent is to be; then be it."""
    import torch.distributed.elastic.multiprocessing  # noqa: F401  (what run_agent imports)
    import torch.distributed.elastic.multiprocessing.errors  # noqa: F401
    import torch.distributed.launcher.api  # noqa: F401

    print("ready", flush=True)
    request = sys.stdin.readline().split()
    if len(request) != 3:
        return 0  # the kernel went, or no longer needs this standby
    run_dir, node, log = request
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return main(run_dir, int(node))


if __name__ == "__main__":
    if sys.argv[1:] == ["--standby"]:
        sys.exit(standby())
    sys.exit(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None))
