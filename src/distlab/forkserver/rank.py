"""The first code a rank forked from distlab's forkserver runs (torchelastic's function entrypoint).

It turns the forked process into what ``python -u -m distlab.launch.rank RUN_JSON TARGET ARGS`` would
have been, then hands over to the same :func:`distlab.worker.bootstrap`, which runs the worker
script as ``__main__``: the script stays the single truth in both start modes.

The server imported this module, torch and ``torch.distributed`` once; nothing the user wrote
was imported there, so the script's imports of the user's modules are fresh in every rank.
"""
import atexit
import os

import psutil  # noqa: F401  (preloaded for worker.loopback_interface)

from distlab import worker
from distlab.forkserver import child, enter, spare
from distlab.forkserver.mode import LOG_VARS, rank_environment
from distlab.rendezvous import retired_groups


def run_rank(run_json: str, target: str, target_args: list, kernel: dict) -> None:
    """Run one rank. ``kernel``: the launching kernel's environment, umask and the server's pid.

    The kernel's working directory and ``sys.path`` at launch were applied before this call
    (``distlab.forkserver.client.preparation_data``). ``kernel["node"]``: a rank an agent on a node
    asked for enters that node first (:mod:`distlab.forkserver.enter`), and dies with that agent.
    """
    node = kernel.get("node")
    if node is not None:
        enter.enter(node)  # first: setns needs this process single-threaded
        enter.die_with_requester()
    child.close_alive_pipe()
    spare.tell_exit_early()  # the launch waits for this process to be gone (engine.cleanup)
    stdout, stderr = (os.environ.get(name, "") for name in LOG_VARS)
    env = rank_environment(kernel["env"], dict(os.environ))
    child.replace_environment(env)
    os.umask(kernel["umask"])  # the kernel's at launch, not the server's at its start
    child.write_output_to(stdout, stderr)
    child.set_thread_count(env)
    child.reseed_once()  # unless a spare did while it waited (distlab.forkserver.spare)
    atexit._clear()  # the server's exit handlers are not this rank's
    retired_groups.ends_with_os_exit()  # multiprocessing ends a forked child with os._exit
    try:
        worker.bootstrap([run_json, target, *target_args], parent_pid=kernel["server_pid"])
    except SystemExit as e:  # `sys.exit(0)` in a script is a success, as under `python`
        if e.code not in (None, 0):
            raise
    atexit._run_exitfuncs()  # what the script registered, as the interpreter runs them at exit


