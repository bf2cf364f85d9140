"""The first code a warm rank (:class:`distlab.Ranks`) forked from distlab's forkserver runs.

A module of its own, importing nothing heavy: the kernel names :func:`run_warm_rank` as the
target of the fork request without importing torch (the server has; ``distlab.forkserver.rank`` does
the work there).
"""
def run_warm_rank(cfg: dict, conn, log: str, env: dict, node=None) -> None:
    """One of :class:`distlab.Ranks`' ranks, forked from the server: what
    ``python -c "from distlab.warm.loop import main; main()"`` with ``env`` would have been.

    ``conn`` is the rank's end of its pipe to the kernel (its fd arrived with the fork request).
    The rank gets its own session (Kernel > Interrupt reaches the kernel only, which decides),
    writes fd 1/2 to ``log``, and lives and dies with the server, which dies with the kernel.
    ``node`` (:class:`distlab.forkserver.enter.Entry`): the node it runs on, entered before anything
    else (``setns`` needs this process still single-threaded).
    """
    import atexit
    import importlib
    import json
    import multiprocessing
    import os

    from distlab.forkserver import child, enter

    if node is not None:
        enter.enter(node)
        env = {**env, **node.env}
    child.close_alive_pipe()
    os.setsid()
    child.replace_environment(env)
    os.umask(cfg["umask"])  # the kernel's when the group started, not the server's at its start
    child.write_both_to(log)
    child.set_thread_count(env)
    importlib.invalidate_caches()
    child.reseed_once()  # unless a spare did while it waited
    atexit._clear()
    multiprocessing.current_process()._config["daemon"] = False  # user code may start processes of its own
    cfg = {**cfg, "conn_fd": os.dup(conn.fileno()), "parent_pid": os.getppid()}
    os.environ["DISTLAB_RANK"] = json.dumps(cfg)
    from distlab.warm.loop import main

    main()


