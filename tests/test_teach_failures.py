"""Unit tests for chapter 9's helpers (distlab.teach.failures) and its plot; launches only where marked slow."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distlab.plots.failures import KINDS, detection_times
from distlab.teach import failures as lab
from distlab.teach.models import ToyModel

# --- leftovers ---------------------------------------------------------------------------------

def test_no_workers_left_sees_a_child_and_then_not(capsys):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert [p.pid for p in lab.worker_processes()] == [child.pid]
        assert lab.no_workers_left() is False
        assert f"pid {child.pid}" in capsys.readouterr().out
    finally:
        child.kill()
        child.wait()
    assert lab.no_workers_left() is True


def test_worker_processes_of_a_missing_process_is_empty():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert lab.worker_processes(child.pid) == []


def test_check_after_every_cell_records_leftovers_per_cell():
    class Events:
        def register(self, name, fn):
            assert name == "post_run_cell"
            self.hook = fn

    class Shell:
        events = Events()

    class Result:
        execution_count = 7

    found = lab.check_after_every_cell(Shell())
    Shell.events.hook(Result())
    assert found == []
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        Shell.events.hook(Result())
    finally:
        child.kill()
        child.wait()
    assert len(found) == 1 and found[0].startswith(f"cell 7: pid {child.pid}")


# --- reading a failed run ----------------------------------------------------------------------

def test_fault_time_is_the_earliest_mark_of_any_rank():
    logs = {0: "step 0\nFAULT_AT 105.5\n", 1: "FAULT_AT 100.25\nother\nFAULT_AT 103\n", 2: "nothing"}
    assert lab.fault_time(logs) == 100.25


def test_fault_time_ignores_marks_inside_other_lines_and_says_when_there_is_none():
    with pytest.raises(ValueError, match="FAULT_AT"):
        lab.fault_time({0: "print('FAULT_AT 1.0')\n", 1: "x FAULT_AT 2.0\n"})


def test_where_ranks_are_finds_the_innermost_script_line(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text("import time\n\ndef stuck(rank):\n    x = 1\n    time.sleep(600)\n\nstuck(1)\n")
    stacks = {
        0: ('Current thread 0x7f (most recent call first):\n'
            '  File "/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n'
            f'  File "{script}", line 5 in stuck\n'
            f'  File "{script}", line 7 in <module>\n'),
        1: "(not started yet: still importing, or already exited)",
    }
    where = lab.where_ranks_are(stacks, script)
    assert where == {0: "stuck: time.sleep(600)", 1: "(not in the script)"}


# --- the fixes ---------------------------------------------------------------------------------

def test_save_as_from_gpu_needs_map_location_on_a_cpu_machine(tmp_path):
    import torch.serialization as ser

    original = ser.location_tag
    path = tmp_path / "gpu.pt"
    lab.save_as_from_gpu({"w": torch.arange(3.0)}, path)
    assert ser.location_tag is original
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="Attempting to deserialize object on a CUDA device"):
            torch.load(path)
    back = torch.load(path, map_location="cpu")
    assert back["w"].device.type == "cpu" and torch.equal(back["w"], torch.arange(3.0))


def test_batch_is_deterministic_and_differs_by_rank_and_step():
    x, y = lab.batch(3, 1)
    assert x.shape == (8, 10) and y.shape == (8, 5)
    assert torch.equal(x, lab.batch(3, 1)[0])
    assert not torch.equal(x, lab.batch(3, 0)[0]) and not torch.equal(x, lab.batch(4, 1)[0])


def test_reference_weights_average_the_ranks_gradients():
    """One step by hand: the mean of each rank's gradient, as DDP's all-reduce computes it."""
    torch.manual_seed(0)
    model = ToyModel()
    grads = []
    for rank in range(2):
        model.zero_grad()
        x, y = lab.batch(0, rank)
        torch.nn.functional.mse_loss(model(x), y).backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters()})
    want = {k: p.detach() - 0.05 * (grads[0][k] + grads[1][k]) / 2 for k, p in model.named_parameters()}
    got = lab.reference_weights(steps=1, world_size=2, lr=0.05)
    assert all(torch.allclose(got[k], want[k], atol=1e-7) for k in want)
    assert not torch.allclose(got["net1.weight"], lab.reference_weights(steps=1, world_size=1)["net1.weight"])


# --- exercises ---------------------------------------------------------------------------------

RIGHT = {"A": "died hard", "B": "shape mismatch", "C": "missing rank", "D": "uneven batches",
         "E": "shape mismatch", "F": "op mismatch"}


def test_check_diagnosis(capsys):
    assert lab.check_diagnosis(None) is False
    assert "No answer yet" in capsys.readouterr().out
    assert lab.check_diagnosis(RIGHT) is True
    with pytest.raises(AssertionError, match="A: a rank that raises prints a traceback"):
        lab.check_diagnosis({**RIGHT, "A": "raised"})
    with pytest.raises(AssertionError, match="not among the causes"):
        lab.check_diagnosis({**RIGHT, "B": "cosmic rays"})
    with pytest.raises(AssertionError, match=r"\['F'\]"):
        lab.check_diagnosis({k: v for k, v in RIGHT.items() if k != "F"})


def every_rank_saves(state, path, rank):
    torch.save(state, path)


def rank0_in_place(state, path, rank):
    if rank == 0:
        torch.save(state, path)


def rank0_atomic(state, path, rank):
    if rank == 0:
        torch.save(state, f"{path}.part")
        os.replace(f"{path}.part", path)


def rank0_leaves_tmp(state, path, rank):
    if rank == 0:
        torch.save(state, f"{path}.tmp")
        with open(f"{path}.tmp", "rb") as src, open(path, "wb") as dst:
            dst.write(src.read())


def test_check_safe_save(capsys):
    assert lab.check_safe_save(None) is False
    assert "No answer yet" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="rank 1 wrote a file"):
        lab.check_safe_save(every_rank_saves)
    with pytest.raises(AssertionError, match="os.replace"):
        lab.check_safe_save(rank0_in_place)
    with pytest.raises(AssertionError, match="temporary files were left behind"):
        lab.check_safe_save(rank0_leaves_tmp)
    with pytest.raises(AssertionError, match="rank 0 left no file"):
        lab.check_safe_save(lambda state, path, rank: None)
    assert lab.check_safe_save(rank0_atomic) is True
    assert torch.save.__name__ == "save"  # the check put torch.save back


# --- plot --------------------------------------------------------------------------------------

def test_detection_times_draws_one_bar_per_failure_coloured_by_kind():
    from matplotlib.colors import to_rgba

    seconds = {"crash": 0.2, "hang": 7.5, "checked": 0.0004}
    fig = detection_times(seconds, {"hang": "hang", "checked": "check"})
    ax = fig.axes[0]
    bars = ax.patches
    assert len(bars) == 3 and ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_yticklabels()] == list(seconds)
    assert [b.get_facecolor() for b in bars] == [to_rgba(KINDS[k][0]) for k in ("ended", "hang", "check")]
    assert bars[1].get_x() + bars[1].get_width() == pytest.approx(7.5)
    assert bars[2].get_x() + bars[2].get_width() == pytest.approx(0.0004)


def test_detection_times_draws_a_value_below_the_floor_as_an_empty_bar_at_the_floor():
    fig = detection_times({"instant": 1e-6, "slow": 2.0}, {})
    bar = fig.axes[0].patches[0]
    assert bar.get_x() == pytest.approx(1e-4) and bar.get_width() == 0.0   # not negative, not below the axis


def test_multiprocessing_resource_tracker_is_not_a_worker():
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # what the first mp.spawn or process pool in a kernel starts
    assert lab.worker_processes() == []


@pytest.mark.slow
def test_open_warm_ranks_are_kept_on_purpose_and_forgotten_ones_are_workers(monkeypatch):
    import distlab
    from distlab.warm import ranks as ranks_module

    with distlab.Ranks(2, backend="gloo") as ranks:
        assert lab.worker_processes() == []  # warm ranks live from cell to cell by design
        with monkeypatch.context() as m:
            m.setattr(ranks_module, "_current", [])  # as if closed, with their processes left behind
            assert sorted(p.pid for p in lab.worker_processes()) == sorted(ranks.pids)
    assert lab.worker_processes() == []  # close() left nothing


# --- exercise 3, launched (processes) ------------------------------------------------------------

def uneven_under_join():
    import torch.distributed as dist
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(ToyModel())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    steps = 0
    with Join([model]):
        for step in range(3 if rank == 0 else 5):
            x, y = lab.batch(step, rank)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            steps += 1
    return {"steps": steps, "weights": model.module.net1.weight.detach()}


def even_without_ddp():
    import torch.distributed as dist

    rank = dist.get_rank()
    torch.manual_seed(rank)   # no DDP: the replicas drift apart
    return {"steps": 3 if rank == 0 else 5, "weights": ToyModel().net1.weight.detach()}


@pytest.mark.slow
def test_check_uneven_fixed_launches_the_answer(capsys):
    assert lab.check_uneven_fixed(None) is False
    assert lab.check_uneven_fixed(uneven_under_join) is True
    with pytest.raises(AssertionError, match="the replicas differ"):
        lab.check_uneven_fixed(even_without_ddp)


# --- the chapter's claim about torchrun restarts (torch 2.13) --------------------------------------

RESTART_JOB = """
import datetime, os, sys, torch.distributed as dist
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
store, rank, _ = next(dist.rendezvous("env://", timeout=datetime.timedelta(seconds=60)))   # init_process_group's store
if attempt == 0:
    store.set(f"left by attempt 0, rank {rank}", "stale")
    store.wait(["left by attempt 0, rank 0", "left by attempt 0, rank 1"])
    if rank == 1:
        sys.exit(3)   # fail once: torchrun restarts both ranks
    store.wait(["never set"])   # rank 0 waits until torchrun stops it
else:
    print(f"attempt 1, rank {rank}: the failed attempt's key is visible: "
          f"{store.check([f'left by attempt 0, rank {rank}'])}", flush=True)
"""


def torchrun_with_one_restart(tmp_path, **env) -> tuple[int | None, str]:
    """(exit code or None if it had to be stopped, output) of a torchrun job whose rank 1 fails once."""
    import signal

    job = tmp_path / "job.py"
    job.write_text(RESTART_JOB)
    torchrun = Path(sys.executable).with_name("torchrun")
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    proc = subprocess.Popen([str(torchrun), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", str(job)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env, cwd=tmp_path,
                            start_new_session=True)   # its own process group: stopped with its workers on a hang
    try:
        out, _ = proc.communicate(timeout=180)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out


@pytest.mark.slow
def test_torchrun_2_13_keeps_the_failed_attempts_keys_unless_the_store_is_not_shared(tmp_path):
    """Chapter 9, section 6: torch 2.13's torchrun keeps one store across restarts, without a per-attempt prefix,
    so the second attempt sees the keys the failed one left (the cause of the restarts that failed or hung);
    with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 every attempt gets a fresh store. If the first half fails, torch
    changed: update the chapter's text."""
    code, out = torchrun_with_one_restart(tmp_path)
    assert code == 0, out[-3000:]
    for rank in (0, 1):
        assert f"attempt 1, rank {rank}: the failed attempt's key is visible: True" in out
    code, out = torchrun_with_one_restart(tmp_path, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    assert code == 0, out[-3000:]
    for rank in (0, 1):
        assert f"attempt 1, rank {rank}: the failed attempt's key is visible: False" in out


def test_a_process_left_behind_is_reported_after_the_grace_and_one_that_ends_is_not(capsys):
    import subprocess
    import sys
    import threading

    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ending = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
    reaper = threading.Thread(target=ending.wait)  # its parent reaps it, as a launcher does
    reaper.start()
    try:
        workers = lab.settled_workers(grace_s=3.0)
        reaper.join()
        assert [p.pid for p in workers] == [left.pid]  # the one ending within the grace is not a leftover
        assert not lab.no_workers_left() and f"still running: pid {left.pid}" in capsys.readouterr().out
    finally:
        left.kill()
        left.wait()
    assert lab.no_workers_left()


def test_chapter_9s_nccl_section_names_what_torch_2_13_reads():
    """Issue #47 (missing topic 1): what chapter 9 says of NCCL cannot run here (no GPU), so its names and
    defaults are checked against the torch this book pins: the headers shipped with the wheel and torchrun's code."""
    import inspect

    import torch
    from torch.distributed.elastic.agent.server import local_elastic_agent

    c10d = Path(torch.__file__).parent / "include" / "torch" / "csrc" / "distributed" / "c10d"
    nccl = (c10d / "ProcessGroupNCCL.hpp").read_text()
    recorder = (c10d / "FlightRecorder.hpp").read_text()
    for name in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        assert f'"{name}"' in nccl, name
    assert "kProcessGroupNCCLDefaultTimeout =\n    std::chrono::milliseconds(10 * 60 * 1000)" in nccl   # 10 minutes
    assert "NoHandling = 0,\n  TearDown = 1,\n  CleanUpOnly = 2,\n  SkipCleanUp = 3" in nccl
    assert "the default value (3 - SkipCleanUp)" in nccl
    assert '{"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}, 2000)' in recorder   # on, 2000 entries
    lib = next((Path(torch.__file__).parent / "lib").glob("libtorch_cpu.so*")).read_bytes()
    assert b"TORCH_FR_DUMP_TEMP_FILE\x00" in lib and b"TORCH_NCCL_DEBUG_INFO_TEMP_FILE\x00" in lib
    # torchrun's workers get 1 (abort and end the process) unless the variable is set
    agent = " ".join(inspect.getsource(local_elastic_agent).split())
    assert '"TORCH_NCCL_ASYNC_ERROR_HANDLING": os.getenv( "TORCH_NCCL_ASYNC_ERROR_HANDLING", str(1) )' in agent
