"""Argument checks and backend choice: pure, and word for word where a learner reads them."""
import pytest

from distlab import LaunchArgumentError
from distlab.config import check_args, check_backend, check_function, check_positive_int, check_timeout, choose_backend


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True, None])
def test_nprocs_must_be_a_positive_int(bad):
    with pytest.raises(LaunchArgumentError) as e:
        check_positive_int("nprocs", bad)
    expected = f"distlab: invalid argument nprocs={bad!r}: must be a positive integer. For example nprocs=2."
    assert str(e.value) == expected


def test_args_must_be_a_tuple():
    with pytest.raises(LaunchArgumentError, match=r"args=\[2\]: must be a tuple, not list. Write args=\(2,\)"):
        check_args([2])


@pytest.mark.parametrize("fn,problem", [(print, "must be a Python function, not builtin_function_or_method"),
                                        ("demo", "must be a Python function, not str"),
                                        (object().__str__, "must be a Python function, not method-wrapper")])
def test_fn_must_be_a_function(fn, problem):
    with pytest.raises(LaunchArgumentError, match=problem):
        check_function(fn)


def test_bound_method_is_refused():
    class A:
        def f(self, rank):
            pass

    with pytest.raises(LaunchArgumentError, match="is a bound method. Pass a top-level function instead."):
        check_function(A().f)


def test_unknown_backend():
    with pytest.raises(LaunchArgumentError, match=r"unknown backend; choose one of \('auto', 'gloo', 'nccl'\)"):
        check_backend("mpi", 2, 0)


def test_nccl_without_enough_gpus():
    with pytest.raises(LaunchArgumentError) as e:
        check_backend("nccl", 2, 1)
    assert str(e.value) == (
        "distlab: invalid argument backend='nccl': NCCL needs one GPU per rank but 2 ranks and 1 GPU(s) are "
        'available. Use backend="gloo" (or "auto"), or fewer ranks.'
    )


@pytest.mark.parametrize("world,gpus,expected", [(2, 0, "gloo"), (2, 1, "gloo"), (2, 2, "nccl"), (1, 8, "nccl")])
def test_auto_backend(world, gpus, expected):
    assert choose_backend("auto", world, gpus) == expected


@pytest.mark.parametrize("bad", [0, -3, "5", True])
def test_timeout(bad):
    with pytest.raises(LaunchArgumentError, match="must be a positive number of seconds or None"):
        check_timeout(bad)
    assert check_timeout(None) is None and check_timeout(2) == 2.0
