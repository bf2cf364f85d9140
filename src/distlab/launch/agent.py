"""``python -m distlab.launch.agent RUN_DIR [NODE]``: torchelastic's agent for a multi-node run, out of the kernel.

``--standby``: import everything an agent needs, say ``ready``, then wait on standard input for
``RUN_DIR NODE LOG`` (one line), open LOG, say ``taken`` and run that: a standby on each of
:class:`distlab.Nodes` takes the agent's own start-up (an interpreter and torch, ~2 s) off the next launch (see
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
import time
import traceback

from distlab import worker
from distlab.folders.private import write_private
from distlab.folders.runfolder import RunFolder
from distlab.forkserver import mode as launchmode
from distlab.launch import engine


def main(run_dir: str, node: int | None = None, parent_pid: int | None = None) -> int:
    """Run the agent of ``run_dir``'s plan; ``node``: this agent's node of a run across
    :class:`distlab.Nodes` (its files are ``agent-plan-node<k>.json`` and so on: the folder is shared).
    ``parent_pid``: the process it dies with (default: the kernel; a forked agent's is the server)."""
    folder = RunFolder(run_dir)
    spec = json.loads(folder.node_file(folder.agent_plan, node).read_text())
    worker.die_with_parent(spec["kernel_pid"] if parent_pid is None else parent_pid)
    run = json.loads(folder.run_json.read_text())
    run_json = folder.node_file(folder.run_json, node)
    write_private(run_json, json.dumps({**run, "parent_pid": os.getpid()}))  # the workers' parent
    plan = engine.Plan.from_json(spec["plan"])
    if node is not None:
        prompt_rendezvous()
        if node > 0:
            wait_for_endpoint(plan.rdzv_endpoint)
    outcome = run_agent(plan, run_json)
    launchmode.wait_forked_ranks_gone(plan.elastic_run_id)  # forked ranks: gone before the agent says so
    write_private(folder.node_file(folder.agent_json, node), json.dumps(outcome))
    return 0 if outcome["status"] == "ok" else 1


RENDEZVOUS_POLL_S = 0.01


def prompt_rendezvous() -> None:
    """torch's c10d rendezvous, polling its store every 10 ms instead of every second.

    Each agent adds itself to the rendezvous state in the store at node 0 and, until every node
    has, reads it again after a fixed 1 s sleep (and first sleeps 0-0.3 s to spread the nodes'
    first writes). Those pauses spare a store that hundreds of nodes poll; on the few nodes of one
    machine they were most of a launch's wait (the first agent always waits a whole second). The
    protocol, its store at node 0 and its heartbeats stay torch's; only the pauses shrink."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    original = dynamic_rendezvous._delay
    if getattr(original, "_distlab_prompt", False):
        return

    def _delay(seconds) -> None:
        if not isinstance(seconds, tuple):  # (a tuple: the first round's random spread, skipped)
            time.sleep(min(seconds, RENDEZVOUS_POLL_S))

    _delay._distlab_prompt = True
    _delay.__wrapped__ = original
    dynamic_rendezvous._delay = _delay
    holder = dynamic_rendezvous._BackendRendezvousStateHolder
    holder_init = holder.__init__

    def __init__(self, backend, settings, cache_duration=1) -> None:
        # (it read the store's state at most once a second, even while polling every 10 ms)
        holder_init(self, backend, settings, cache_duration=min(cache_duration, RENDEZVOUS_POLL_S))

    holder.__init__ = __init__
    _events_ask_first(dynamic_rendezvous)


def _events_ask_first(dynamic_rendezvous) -> None:
    """Each step of the rendezvous records an event, built first and then handed to a logger whose
    only handler drops it: the building calls ``inspect.stack()`` three times (every frame's source
    lines read) and ``socket.getfqdn()``, 5-20 ms a step on these cores. The replacement builds an
    event only when its logger would write it somewhere, and then exactly as torch does; the
    method name is read from the frame itself (what ``inspect.stack()[depth].function`` is)."""
    import logging

    from torch.distributed.elastic import events

    def get_method_name(depth=2):
        frame = sys._getframe(depth)
        return frame.f_code.co_name if frame is not None else "no_method_name"

    def written(logger: logging.Logger) -> bool:
        if not logger.isEnabledFor(logging.INFO):
            return False
        return logger.propagate or any(not isinstance(h, logging.NullHandler) for h in logger.handlers)

    original = events.construct_and_record_rdzv_event

    def construct_and_record_rdzv_event(*args, **kwargs) -> None:
        if written(events._get_or_create_logger("dynamic_rendezvous")):
            original(*args, **kwargs)

    dynamic_rendezvous.get_method_name = get_method_name
    dynamic_rendezvous.construct_and_record_rdzv_event = construct_and_record_rdzv_event


def wait_for_endpoint(endpoint: str, timeout: float = 60.0) -> bool:
    """Wait until node 0's rendezvous store accepts connections (False after ``timeout``: torch then
    tries as it would have). torch's store client, refused, tries again only after a back-off of
    about half a second; an agent forked in milliseconds would nearly always pay it, as node 0's
    agent is still opening its store."""
    import socket

    host, port = endpoint.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
            return True
        except OSError:
            time.sleep(0.005)
    return False


def run_forked(run_dir: str, node: int, entry, kernel: dict) -> None:
    """A node's agent forked from distlab's forkserver (``start="forkserver"``): it enters its node
    (``entry``, :mod:`distlab.forkserver.enter`), becomes what ``python -m distlab.launch.agent`` would
    have been there (the kernel's environment and umask, output to its log), and asks the same
    server for its ranks, which enter the node too. Milliseconds, where an interpreter importing
    torch took seconds. It dies with the server, which dies with the kernel."""
    import atexit
    import multiprocessing

    from distlab.forkserver import child, enter
    from distlab.forkserver import client as forkserver

    enter.enter(entry, keep=True)  # first: setns needs this process single-threaded
    child.replace_environment({**kernel["env"], **entry.env})
    os.umask(kernel["umask"])
    folder = RunFolder(run_dir)
    child.write_both_to(str(folder.node_file(folder.agent_log, node)))
    atexit._clear()  # the server's exit handlers are not this agent's
    multiprocessing.current_process()._config["daemon"] = False  # it starts ranks of its own
    forkserver.adopt()
    sys.exit(main(run_dir, node, parent_pid=os.getppid()))  # its exit code, as a fresh agent's


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
    print("taken", flush=True)  # from here on, this is the run's agent (the kernel waits for this word)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return main(run_dir, int(node))


if __name__ == "__main__":
    if sys.argv[1:] == ["--standby"]:
        sys.exit(standby())
    sys.exit(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None))
