"""Every error template word for word, in the cases the other tests do not reach. No processes."""
import pytest

from distlab import CaptureError, LaunchArgumentError, WorkerFailedError, WorkerTimeoutError


def test_a_failed_rank_that_printed_nothing_says_so_and_keeps_its_result():
    result = object()
    e = WorkerFailedError(0, -9, "", "  \n", "/runs/z", result=result)
    assert str(e) == (
        "distlab: rank 0 failed first (exit code -9); the other ranks were stopped.\n\n"
        "--- last lines rank 0 printed ---\n(nothing)\n"
        "Run folder (script and every rank's log): /runs/z"
    )
    assert e.result is result and e.exitcode == -9 and e.rank == 0


def test_timeout_message_word_for_word_keeps_each_stacks_indentation():
    stacks = {1: '  File "x.py", line 9 in hang\n', 0: 'Current thread:\n  File "x.py", line 3 in work'}
    e = WorkerTimeoutError(5.0, stacks, "/runs/y", result="partial")
    assert str(e) == (
        "distlab: the run did not finish within timeout=5.0s; all ranks were stopped.\n"
        "Where each rank was when the time ran out:\n"
        '--- rank 0 ---\nCurrent thread:\n  File "x.py", line 3 in work\n'
        '--- rank 1 ---\n  File "x.py", line 9 in hang\n'
        "A rank waiting in a collective usually means another rank never called it. Run folder: /runs/y"
    )
    assert (e.timeout, e.stacks, e.result) == (5.0, stacks, "partial")


def test_timeout_before_any_rank_started():
    assert "Where each rank was when the time ran out:\n(no rank had started)\n" in str(
        WorkerTimeoutError(3, {}, "/runs/w"))


def test_capture_error_word_for_word():
    e = CaptureError("function 'f'", "it is a closure over k", "Define it at the top level.")
    assert str(e) == "distlab: cannot ship function 'f' to the worker processes: it is a closure over k. " \
                     "Define it at the top level."
    assert e.what == "function 'f'" and isinstance(e, TypeError)


def test_argument_error_without_a_hint_ends_at_the_problem():
    e = LaunchArgumentError("mode", "bash", 'must be "torchrun" or "python"')
    assert str(e) == 'distlab: invalid argument mode=\'bash\': must be "torchrun" or "python".'
    assert e.name == "mode" and isinstance(e, ValueError)


@pytest.mark.parametrize("error", [CaptureError("a", "b", "c"), LaunchArgumentError("n", 1, "p"),
                                   WorkerFailedError(0, 1, "", "", "d"), WorkerTimeoutError(1, {}, "d")])
def test_every_error_is_a_distlab_error(error):
    import distlab

    assert isinstance(error, distlab.DistlabError)


def test_a_fixed_port_in_use_names_the_port_who_holds_it_and_what_to_do():
    from distlab.errors import PORT_IN_USE, PortInUseError
    from distlab.rendezvous.loopback import describe_holder

    holders = [describe_holder(1000, 4242, "python -m ipykernel_launcher -f k.json", 1000, "me (uid 1000)"),
               describe_holder(1000, None, None, 1000, "me (uid 1000)"),
               describe_holder(1001, None, None, 1000, "bob (uid 1001)"),
               describe_holder(None, None, None, 1000, "")]
    assert holders == [
        "held by a process of yours: pid 4242 (python -m ipykernel_launcher -f k.json); if it is an earlier run "
        "that is over, stop it",
        "held by a process of yours that distlab could not find",
        "held by another user, bob (uid 1001)",
        "held by a program distlab cannot name",
    ]
    e = PortInUseError(PORT_IN_USE.format(rank=0, port=12355, holder=holders[2]))
    assert str(e) == (
        "distlab: rank 0 cannot host the store on 127.0.0.1:12355, the MASTER_PORT your code set: the port is "
        "already in use (EADDRINUSE), held by another user, bob (uid 1001). Any program on this machine may have "
        "chosen the same fixed port (12355 is also the official tutorials' port). Leave MASTER_PORT to the launcher "
        "(distlab and torchrun set it for every rank; delete the line that sets it), or give every rank a port "
        "nobody holds."
    )
    import errno

    assert isinstance(e, OSError) and e.errno == errno.EADDRINUSE  # code that caught the bind's OSError still does


def test_a_failed_rank_on_a_node_names_the_node_and_its_local_rank():
    e = WorkerFailedError(3, 1, "ValueError: boom", "step 3", "/runs/n", node=1, local_rank=0)
    assert str(e).splitlines()[0] == \
        "distlab: rank 3 (node1, local rank 0) failed first (exit code 1); the other ranks were stopped."
    assert e.node == 1


def test_an_empty_message_shows_one_red_line_with_the_name_alone():
    from distlab.errors import notebook_message

    assert notebook_message("WorkerFailedError", "") == ["\x1b[0;31mWorkerFailedError: \x1b[0m"]
    assert notebook_message("", "") == ["\x1b[0;31m\x1b[0m"]


def test_an_interrupted_run_shows_what_happened_then_the_run_folder():
    from distlab.errors import RunInterrupted

    e = RunInterrupted(2, "/runs/a Run folder: b", result="partial")
    assert isinstance(e, KeyboardInterrupt) and (e.n, e.result) == (2, "partial")
    assert e._render_traceback_() == [  # the run folder's own name may hold the words that separate them
        "\x1b[0;31mdistlab: interrupted; all 2 worker processes were stopped.\x1b[0m",
        "Run folder (script and every rank's log): /runs/a Run folder: b",
    ]
    assert RunInterrupted(1, "")._render_traceback_() == [  # no folder: no line naming one
        "\x1b[0;31mdistlab: interrupted; all 1 worker processes were stopped.\x1b[0m"]


@pytest.mark.parametrize("killed,how", [(0, ""), (3, " (3 of them with SIGKILL)")])
def test_an_interrupt_on_nodes_names_every_host_and_the_processes_killed(killed, how):
    from distlab.errors import NodeRunInterrupted

    e = NodeRunInterrupted(["node0", "node1"], killed)
    message = (f"distlab: interrupted; every process of these commands on node0 and node1 was stopped{how}. "
               "The nodes are still up: run the cell again.")
    assert isinstance(e, KeyboardInterrupt) and (e.hosts, e.killed) == (["node0", "node1"], killed)
    assert str(e) == message
    assert e._render_traceback_() == [f"\x1b[0;31m{message}\x1b[0m"]
