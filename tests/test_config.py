"""Argument checks and backend choice: pure, and word for word where a learner reads them."""
from types import SimpleNamespace

import pytest

from distlab import LaunchArgumentError
from distlab.config import (
    check_args,
    check_backend,
    check_function,
    check_max_restarts,
    check_node_rank,
    check_positive_int,
    check_rdzv_endpoint,
    check_script_args,
    check_timeout,
    check_view,
    choose_backend,
)


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

    with pytest.raises(LaunchArgumentError, match=r"^distlab: invalid argument fn=<bound method .*>: is a bound "
                                                  r"method\. Pass a top-level function instead\.$"):
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
    assert check_timeout(None) is None and check_timeout(2) == 2.0 and check_timeout(0.5) == 0.5


@pytest.mark.parametrize("world,gpus", [(1, 1), (2, 2), (2, 8)])
def test_nccl_is_accepted_with_a_gpu_per_rank(world, gpus):
    check_backend("nccl", world, gpus)  # the README's 2xT4 path: must not raise
    assert choose_backend("nccl", world, gpus) == "nccl"


@pytest.mark.parametrize("requested", ["gloo", "nccl"])
def test_an_explicit_backend_is_kept(requested):
    assert choose_backend(requested, 1, 4) == requested


def test_gloo_is_accepted_without_gpus():
    assert choose_backend("gloo", 4, 0) == "gloo"


def test_fn_may_be_decorated_or_a_partial():
    import functools

    import torch

    def work(rank, scale=1):
        return rank * scale

    check_function(functools.partial(work, scale=2))
    check_function(functools.partial(functools.partial(work), 3))
    check_function(torch.no_grad()(work))
    check_function(functools.lru_cache(work))


def test_partial_of_a_builtin_or_a_bound_method_is_refused():
    import functools

    class A:
        def f(self, rank):
            pass

    with pytest.raises(LaunchArgumentError, match="must be a Python function, not builtin_function_or_method"):
        check_function(functools.partial(print, "x"))
    with pytest.raises(LaunchArgumentError, match="is a bound method"):
        check_function(functools.partial(A().f))


@pytest.mark.parametrize("good", [0, 1, 7])
def test_max_restarts_accepts_non_negative_ints(good):
    assert check_max_restarts(good) == good


@pytest.mark.parametrize("bad", [-5, -1, 1.5, "1", True, None])
def test_max_restarts_must_be_a_non_negative_int(bad):
    with pytest.raises(LaunchArgumentError) as e:
        check_max_restarts(bad)
    assert str(e.value) == (f"distlab: invalid argument max_restarts={bad!r}: must be a non-negative integer. "
                            "For example max_restarts=1.")


@pytest.mark.parametrize("view", ["auto", "text", "live", "widgets", "none", None])
def test_view_names(view):
    assert check_view(view) == view


def test_view_object_with_the_three_methods():
    class Recorder:
        def line(self, rank, text): ...
        def metric(self, rank, row): ...
        def close(self): ...

    recorder = Recorder()
    assert check_view(recorder) is recorder


@pytest.mark.parametrize("bad,problem", [
    ("txt", r"unknown view; choose one of \('auto', 'text', 'live', 'widgets', 'none', None\). Or pass an object with "
            r"line\(rank, text\), metric\(rank, row\) and close\(\)\."),
    (True, r"has no line\(\), metric\(\), close\(\) method. A view object needs"),
    (type("HalfView", (), {"line": lambda self, r, t: None, "close": 3})(), r"has no metric\(\), close\(\) method"),
])
def test_unknown_view_is_refused(bad, problem):
    with pytest.raises(LaunchArgumentError, match=problem):
        check_view(bad)


@pytest.mark.parametrize("node_rank,nnodes", [(0, 1), (1, 2), (3, 4)])
def test_node_rank_in_range(node_rank, nnodes):
    assert check_node_rank(node_rank, nnodes) == node_rank


@pytest.mark.parametrize("node_rank,nnodes,problem", [
    (2, 2, r"node_rank=2: must be below nnodes=2. Number the machines 0 to nnodes - 1"),
    (1, 1, r"node_rank=1: must be below nnodes=1"),
    (-1, 2, r"node_rank=-1: must be a non-negative integer. For example node_rank=0 on the first machine."),
    ("0", 2, r"node_rank='0': must be a non-negative integer"),
])
def test_node_rank_out_of_range(node_rank, nnodes, problem):
    with pytest.raises(LaunchArgumentError, match=problem):
        check_node_rank(node_rank, nnodes)


@pytest.mark.parametrize("endpoint,nnodes", [("", 1), ("10.0.0.1:29400", 2), ("node-1.cluster", 2),
                                             ("[::1]:29400", 2), ("localhost:1", 1), ("h:65535", 2)])
def test_rdzv_endpoint_shapes(endpoint, nnodes):
    assert check_rdzv_endpoint(endpoint, nnodes) == endpoint


def test_bad_rdzv_endpoint_word_for_word():
    with pytest.raises(LaunchArgumentError) as e:
        check_rdzv_endpoint("host:0", 2)
    assert str(e.value) == ("distlab: invalid argument rdzv_endpoint='host:0': must be HOST or HOST:PORT with a port "
                            "from 1 to 65535. For example \"10.0.0.1:29400\" (node 0's address).")
    assert e.value.name == "rdzv_endpoint"
    with pytest.raises(LaunchArgumentError) as e:
        check_rdzv_endpoint(29400, 2)
    assert str(e.value) == ("distlab: invalid argument rdzv_endpoint=29400: must be a string, not int. "
                            "For example \"10.0.0.1:29400\".")


@pytest.mark.parametrize("endpoint,problem", [
    ("", r"rdzv_endpoint='': is needed when nnodes > 1. For example \"127.0.0.1:29400\"."),
    ("host:0", "must be HOST or HOST:PORT with a port from 1 to 65535"),
    ("host:65536", "must be HOST or HOST:PORT"),
    ("host:port", "must be HOST or HOST:PORT"),
    ("http://host:29400", "must be HOST or HOST:PORT"),
    ("a b:1", "must be HOST or HOST:PORT"),
    (29400, "rdzv_endpoint=29400: must be a string, not int"),
])
def test_bad_rdzv_endpoint(endpoint, problem):
    with pytest.raises(LaunchArgumentError, match=problem):
        check_rdzv_endpoint(endpoint, 2)


def test_script_args_become_command_line_words():
    from pathlib import Path

    class Dataset:  # a path-like object whose str() is not its path
        def __fspath__(self):
            return "data/train"

        def __str__(self):
            return "<Dataset>"

    assert check_script_args(["--epochs", 2, 0.5, Path("data"), Dataset()]) == [
        "--epochs", "2", "0.5", "data", "data/train"]
    assert check_script_args(()) == []


def test_bad_script_args_word_for_word():
    with pytest.raises(LaunchArgumentError) as e:
        check_script_args("--epochs 2")
    assert str(e.value) == ("distlab: invalid argument args='--epochs 2': must be a list of command-line arguments, "
                            "not str. For example args=[\"--epochs\", 2].")
    with pytest.raises(LaunchArgumentError) as e:
        check_script_args(["--fast", None])
    assert str(e.value) == ("distlab: invalid argument args=['--fast', None]: None is not a string, number or path. "
                            "Each item becomes one command-line word.")


@pytest.mark.parametrize("bad,problem", [
    ("--epochs 2", "must be a list of command-line arguments, not str"),
    (None, "must be a list of command-line arguments, not NoneType"),
    (["--fast", True], "True is not a string, number or path"),
    (["--cfg", {"a": 1}], r"\{'a': 1\} is not a string, number or path. Each item becomes one command-line word."),
])
def test_bad_script_args(bad, problem):
    with pytest.raises(LaunchArgumentError, match=problem):
        check_script_args(bad)


def test_cuda_device_count_is_zero_without_cuda_and_never_asks_for_devices(monkeypatch):
    import torch

    from distlab.config import cuda_device_count

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: pytest.fail("asked for devices without CUDA"))
    assert cuda_device_count() == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert cuda_device_count() == 3


@pytest.mark.parametrize("call,message", [
    (lambda: check_view("txt"),
     "view='txt': unknown view; choose one of ('auto', 'text', 'live', 'widgets', 'none', None). Or pass an object "
     "with line(rank, text), metric(rank, row) and close()."),
    (lambda: check_view(3),
     "view=3: has no line(), metric(), close() method. A view object needs line(rank, text), metric(rank, row) "
     "and close()."),
    (lambda: check_node_rank(2, 2), "node_rank=2: must be below nnodes=2. Number the machines 0 to nnodes - 1, "
                                    "one number each."),
    (lambda: check_node_rank(-1, 2), "node_rank=-1: must be a non-negative integer. For example node_rank=0 on the "
                                     "first machine."),
    (lambda: check_timeout(-2), "timeout=-2: must be a positive number of seconds or None."),
    (lambda: check_backend("mpi", 2, 0), "backend='mpi': unknown backend; choose one of ('auto', 'gloo', 'nccl')."),
    (lambda: check_function("demo"), "fn='demo': must be a Python function, not str. Define it with `def` in a cell "
                                     "or a module."),
])
def test_argument_errors_word_for_word(call, message):
    with pytest.raises(LaunchArgumentError) as e:
        call()
    assert str(e.value) == "distlab: invalid argument " + message


# --- DISTLAB_DEVICE: the book's GPU path on one GPU (pure rules, GPU counts faked) -------------------
from distlab.config import check_device_mode, choose_device, device_mode  # noqa: E402


@pytest.mark.parametrize("value,mode", [(None, "auto"), ("", "auto"), ("auto", "auto"), ("cpu", "cpu"),
                                        ("cuda", "cuda"), (" CUDA ", "cuda")])
def test_device_mode_reads_the_variable(value, mode):
    env = {} if value is None else {"DISTLAB_DEVICE": value}
    assert device_mode(env) == mode


def test_unknown_device_mode_is_refused_with_the_choices():
    with pytest.raises(LaunchArgumentError) as e:
        device_mode({"DISTLAB_DEVICE": "gpu"})
    assert str(e.value) == ("distlab: invalid argument DISTLAB_DEVICE='gpu': unknown device mode; choose one of "
                            "('auto', 'cpu', 'cuda'). Unset DISTLAB_DEVICE, or set it to cpu or cuda.")


@pytest.mark.parametrize("mode,local,world,gpus,expected", [
    ("auto", 0, 2, 0, "cpu"), ("auto", 1, 2, 1, "cpu"), ("auto", 1, 2, 2, "cuda:1"), ("auto", 0, 1, 1, "cuda:0"),
    ("auto", 3, 2, 2, "cpu"),                       # a local rank beyond the GPUs never gets one
    ("cpu", 0, 1, 8, "cpu"), ("cpu", 1, 2, 2, "cpu"),
    ("cuda", 0, 2, 1, "cuda:0"), ("cuda", 1, 2, 1, "cuda:0"), ("cuda", 3, 4, 2, "cuda:1"), ("cuda", 1, 2, 4, "cuda:1"),
])
def test_choose_device(mode, local, world, gpus, expected):
    assert choose_device(local, world, gpus, mode) == expected


@pytest.mark.parametrize("mode,world,gpus,expected", [
    ("auto", 2, 2, "nccl"), ("auto", 2, 1, "gloo"), ("cpu", 2, 2, "gloo"), ("cpu", 1, 1, "gloo"),
    ("cuda", 2, 1, "gloo"), ("cuda", 2, 2, "gloo"), ("cuda", 1, 1, "gloo"),
])
def test_auto_backend_follows_the_device_mode(mode, world, gpus, expected):
    assert choose_backend("auto", world, gpus, mode) == expected


def test_an_explicit_nccl_still_wins_under_cuda_mode():
    assert choose_backend("nccl", 2, 2, "cuda") == "nccl"


@pytest.mark.parametrize("call", [lambda: choose_device(0, 2, 0, "cuda"), lambda: choose_backend("auto", 2, 0, "cuda")])
def test_cuda_mode_without_a_gpu_fails_loudly(call):
    with pytest.raises(LaunchArgumentError, match=r"DISTLAB_DEVICE='cuda': asks for CUDA but no CUDA device is "
                                                  r"visible here\. Unset DISTLAB_DEVICE to run on the CPU"):
        call()


def test_the_mode_is_read_from_the_environment_when_not_given(monkeypatch):
    monkeypatch.setenv("DISTLAB_DEVICE", "cuda")
    assert choose_device(1, 2, 1) == "cuda:0" and choose_backend("auto", 2, 1) == "gloo"
    monkeypatch.setenv("DISTLAB_DEVICE", "cpu")
    assert choose_device(0, 1, 1) == "cpu"
    monkeypatch.delenv("DISTLAB_DEVICE")
    assert choose_device(0, 1, 1) == "cuda:0" and choose_backend("auto", 1, 1) == "nccl"


def test_check_device_mode_counts_gpus_only_for_cuda(monkeypatch):
    counted = []

    def count():
        counted.append(1)
        return 0

    monkeypatch.setenv("DISTLAB_DEVICE", "cpu")
    assert check_device_mode(count) == "cpu" and counted == []
    monkeypatch.setenv("DISTLAB_DEVICE", "cuda")
    with pytest.raises(LaunchArgumentError, match="no CUDA device is visible"):
        check_device_mode(count)
    assert counted == [1]


def test_kernel_device_takes_the_world_size(monkeypatch):
    """The kernel is no rank: on a one-GPU host distlab.device(0) alone says cuda:0, for 2 ranks it is cpu."""
    import distlab
    from distlab import config

    monkeypatch.delenv("DISTLAB_DEVICE", raising=False)
    for var in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(config, "cuda_device_count", lambda: 1)
    assert str(distlab.device(0)) == "cuda:0" and str(distlab.device(0, 2)) == "cpu"
    monkeypatch.setenv("DISTLAB_DEVICE", "cuda")
    assert str(distlab.device(1, 2)) == "cuda:0" and distlab.backend(2) == "gloo"


def test_a_slurm_task_that_sees_fewer_gpus_than_its_nodes_ranks_is_an_error_not_the_cpu():
    from distlab.config import gpu_binding_problem

    slurm = {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "3"}
    what, hint = gpu_binding_problem(2, 4, 1, slurm)
    assert "local rank 2 of the 4 ranks on this node sees 1 GPU(s) (CUDA_VISIBLE_DEVICES=3)" in what
    assert "--gpus-per-node=4" in hint and "DISTLAB_DEVICE=cuda" in hint
    assert gpu_binding_problem(2, 4, 4, slurm) is None                      # one GPU per rank: fine
    assert gpu_binding_problem(2, 4, 0, slurm) is None                      # no GPU: the CPU, as everywhere
    assert gpu_binding_problem(1, 2, 1, {"CUDA_VISIBLE_DEVICES": "0"}) is None  # a 1-GPU laptop: the CPU
    assert gpu_binding_problem(2, 4, 1, {**slurm, "DISTLAB_DEVICE": "cuda"}) is None  # asked for cuda:0


def test_nodes_may_be_left_out_or_be_open_nodes():
    from distlab.config import check_nodes

    nodes = SimpleNamespace(n=2, command=None, closed=False)
    assert check_nodes(None) is None and check_nodes(nodes) is nodes


@pytest.mark.parametrize("nodes,kind", [
    (2, "int"),
    (SimpleNamespace(command=None, closed=False), "SimpleNamespace"),  # each of the three
    (SimpleNamespace(n=2, closed=False), "SimpleNamespace"),           # is needed
    (SimpleNamespace(n=2, command=None), "SimpleNamespace"),
])
def test_nodes_that_are_no_nodes_are_refused_word_for_word(nodes, kind):
    from distlab.config import check_nodes

    with pytest.raises(LaunchArgumentError) as e:
        check_nodes(nodes)
    assert e.value.name == "nodes"
    assert str(e.value) == (f"distlab: invalid argument nodes={nodes!r}: must be a distlab.Nodes, not {kind}. "
                            "Make them with nodes = distlab.Nodes(2), then pass nodes=nodes.")


def test_closed_nodes_are_refused_word_for_word():
    from distlab.config import check_nodes

    with pytest.raises(LaunchArgumentError) as e:
        check_nodes(SimpleNamespace(n=2, command=None, closed=True))
    assert e.value.name == "nodes"
    assert str(e.value) == ("distlab: invalid argument nodes=namespace(n=2, command=None, closed=True): "
                            "these nodes are closed. Make new ones with distlab.Nodes(...).")


BOUND_HINT = ("Ask Slurm for --gpus-per-node=4 with no per-task GPU binding (torchrun then gives each rank "
              "cuda:<local rank>), or, bound one GPU per task, use cuda:0 in every rank (DISTLAB_DEVICE=cuda).")


def test_the_gpu_binding_problem_word_for_word_even_without_cuda_visible_devices():
    from distlab.config import gpu_binding_problem

    assert gpu_binding_problem(2, 4, 1, {"SLURM_JOB_ID": "7"}) == (
        "local rank 2 of the 4 ranks on this node sees 1 GPU(s) (CUDA_VISIBLE_DEVICES=?): it would train on the CPU",
        BOUND_HINT)


def test_device_in_a_slurm_task_bound_to_one_gpu_raises_the_binding_problem(monkeypatch):
    from distlab import config

    monkeypatch.delenv("DISTLAB_DEVICE", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for name, value in {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "3", "LOCAL_RANK": "2",
                        "LOCAL_WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(config, "cuda_device_count", lambda: 1)
    with pytest.raises(LaunchArgumentError) as e:
        config.device()
    assert e.value.name == "device"
    assert str(e.value) == (
        "distlab: invalid argument device='1 GPU(s)': local rank 2 of the 4 ranks on this node sees 1 GPU(s) "
        f"(CUDA_VISIBLE_DEVICES=3): it would train on the CPU. {BOUND_HINT}")
