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
