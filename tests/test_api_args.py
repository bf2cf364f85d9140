"""The front ends check every argument before any process starts; device()/backend() choose by GPU count.

No processes: ``engine.execute`` is replaced by a recorder, so a test sees the plan that would run.
"""
import functools
import warnings

import pytest
import torch
from fake_kernel import run_cells

import distlab
from distlab import LaunchArgumentError, config
from distlab.launch import engine


@pytest.fixture
def no_launch(tmp_path, monkeypatch):
    """Record what would be launched instead of launching it; runs go under tmp_path."""
    monkeypatch.setenv("DISTLAB_RUNS", str(tmp_path / "runs"))
    plans = []
    monkeypatch.setattr(engine, "execute", lambda plan, view, **kw: plans.append((plan, view)) or "launched")
    return plans


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(n)`` makes distlab see n CUDA devices."""
    return lambda n: monkeypatch.setattr(config, "cuda_device_count", lambda: n)


def _work():
    return run_cells("def work(rank, world=1):\n    return rank\n")["work"]


def _script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return path


@pytest.mark.parametrize("kwargs,problem", [
    ({"view": "txt"}, "view='txt': unknown view"),
    ({"max_restarts": -5}, "max_restarts=-5: must be a non-negative integer"),
    ({"nprocs": 0}, "nprocs=0: must be a positive integer"),
    ({"timeout": 0}, "timeout=0: must be a positive number"),
    ({"args": [2]}, r"args=\[2\]: must be a tuple"),
])
def test_spawn_refuses_bad_arguments_before_anything_starts(no_launch, tmp_path, kwargs, problem):
    with pytest.raises(LaunchArgumentError, match=problem):
        distlab.spawn(_work(), **{"nprocs": 2, **kwargs})
    assert no_launch == [] and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("kwargs,problem", [
    ({"view": "txt"}, "view='txt': unknown view"),
    ({"max_restarts": 1.5}, "max_restarts=1.5: must be a non-negative integer"),
    ({"backend": "mpi"}, "unknown backend"),
])
def test_launch_refuses_bad_arguments_before_anything_starts(no_launch, tmp_path, kwargs, problem):
    with pytest.raises(LaunchArgumentError, match=problem):
        distlab.launch(_work(), **{"world_size": 2, **kwargs})
    assert no_launch == [] and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("kwargs,problem", [
    ({"mode": "bash"}, r"mode='bash': must be \"torchrun\" or \"python\""),
    ({"mode": "python", "nproc_per_node": 2}, r"nproc_per_node=2: must be 1 with mode=\"python\""),
    ({"nproc_per_node": 0}, "nproc_per_node=0: must be a positive integer"),
    ({"nnodes": 0}, "nnodes=0: must be a positive integer"),
    ({"nnodes": 2}, "rdzv_endpoint='': is needed when nnodes > 1"),
    ({"nnodes": 2, "rdzv_endpoint": "host:99999"}, "with a port from 1 to 65535"),
    ({"nnodes": 2, "node_rank": 2, "rdzv_endpoint": "h:29400"}, "node_rank=2: must be below nnodes=2"),
    ({"node_rank": -1}, "node_rank=-1: must be a non-negative integer"),
    ({"max_restarts": -5}, "max_restarts=-5"),
    ({"view": "txt"}, "view='txt'"),
    ({"args": "--epochs 2"}, "args='--epochs 2': must be a list of command-line arguments, not str"),
    ({"timeout": -1}, "timeout=-1"),
])
def test_run_script_refuses_bad_arguments_before_anything_starts(no_launch, tmp_path, kwargs, problem):
    with pytest.raises(LaunchArgumentError, match=problem):
        distlab.run_script(_script(tmp_path), **kwargs)
    assert no_launch == [] and not (tmp_path / "runs").exists()


def test_run_script_refuses_a_missing_file(no_launch, tmp_path):
    with pytest.raises(LaunchArgumentError, match=r"train2.py'?: no such file. Write the script first"):
        distlab.run_script(tmp_path / "train2.py")
    assert no_launch == []


def test_run_script_hands_checked_arguments_to_the_engine(no_launch, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same call on every machine, as chapter 7 teaches: nothing to warn of
        assert distlab.run_script(_script(tmp_path), nproc_per_node=2, args=["--epochs", 2], view=None,
                                  max_restarts=1, nnodes=2, rdzv_endpoint="10.0.0.1:29400") == "launched"
    plan = no_launch[0][0]
    assert (plan.nproc, plan.target_args, plan.max_restarts) == (2, ["--epochs", "2"], 1)
    assert (plan.nnodes, plan.node_rank, plan.rdzv_endpoint) == (2, 0, "10.0.0.1:29400")


def test_run_script_warns_that_c10d_ignores_a_node_rank(no_launch, tmp_path):
    """torchrun passes --node-rank to every rendezvous and only the static one reads it; c10d numbers the
    machines by sorting them. run_script passes it on the same way, and says so where it is given."""
    with pytest.warns(UserWarning, match=r"node_rank=1: the c10d rendezvous ignores it, .* by sorting them") as seen:
        distlab.run_script(_script(tmp_path), nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29400", view=None)
    assert seen[0].filename == __file__  # it points at the learner's call, not at distlab
    assert no_launch[0][0].node_rank == 1


def test_nccl_is_accepted_when_every_rank_has_a_gpu(no_launch, gpus):
    gpus(2)
    assert distlab.launch(_work(), world_size=2, backend="nccl", view=None) == "launched"
    script = no_launch[0][0].script.read_text()
    assert "backend='nccl'" in script


def test_nccl_is_refused_with_too_few_gpus(no_launch, gpus):
    gpus(1)
    with pytest.raises(LaunchArgumentError, match="NCCL needs one GPU per rank but 2 ranks and 1 GPU"):
        distlab.launch(_work(), world_size=2, backend="nccl", view=None)
    assert no_launch == []


def test_a_partial_is_launched_under_its_function_name(no_launch):
    distlab.spawn(functools.partial(_work(), world=2), nprocs=2, view=None)
    plan = no_launch[0][0]
    assert plan.script.name == "work.py" and "-work-" in plan.run_dir.name


def test_a_view_object_reaches_the_engine(no_launch):
    class Recorder:
        def line(self, rank, text): ...
        def metric(self, rank, row): ...
        def close(self): ...

    view = Recorder()
    distlab.spawn(_work(), nprocs=1, view=view)
    assert no_launch[0][1] is view


# --- device() and backend() --------------------------------------------------------------------

@pytest.mark.parametrize("n_gpus,env,rank,expected", [
    (0, {}, None, "cpu"),
    (2, {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, None, "cuda:1"),
    (1, {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}, None, "cpu"),  # not one GPU per rank
    (2, {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4"}, None, "cuda:1"),  # 2 nodes x 2 GPUs
    (1, {}, None, "cuda:0"),
    (2, {}, 1, "cuda:1"),
    (2, {}, 2, "cpu"),  # rank 2 would need a third GPU
    (4, {"WORLD_SIZE": "2", "LOCAL_RANK": "0"}, 1, "cuda:1"),  # an explicit rank wins over LOCAL_RANK
    (2, {"WORLD_SIZE": "3", "LOCAL_RANK": "0"}, None, "cpu"),  # no LOCAL_WORLD_SIZE: WORLD_SIZE counts
])
def test_device(monkeypatch, gpus, n_gpus, env, rank, expected):
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    gpus(n_gpus)
    assert config.device(rank) == torch.device(expected)


@pytest.mark.parametrize("n_gpus,env,world,expected", [
    (0, {}, None, "gloo"),
    (1, {}, None, "nccl"),  # world size 1 outside a launch
    (2, {"WORLD_SIZE": "2"}, None, "nccl"),
    (1, {"WORLD_SIZE": "2"}, None, "gloo"),
    (2, {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, None, "nccl"),  # 2 nodes x 2 GPUs
    (2, {"WORLD_SIZE": "2"}, 3, "gloo"),  # an explicit world size wins
])
def test_backend(monkeypatch, gpus, n_gpus, env, world, expected):
    for name in ("LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    gpus(n_gpus)
    assert distlab.backend(world) == expected


def test_cuda_mode_without_a_gpu_is_refused_before_any_process(no_launch, gpus, monkeypatch):
    monkeypatch.setenv("DISTLAB_DEVICE", "cuda")
    gpus(0)
    with pytest.raises(LaunchArgumentError, match="DISTLAB_DEVICE='cuda': asks for CUDA but no CUDA device"):
        distlab.spawn(_work(), nprocs=2)
    assert no_launch == []
    gpus(1)
    distlab.spawn(_work(), nprocs=2)
    assert len(no_launch) == 1
