"""Chapter 13's exercise self-checks and its plot (no cluster needed; check_master_addr runs bash and
`scontrol show hostnames`, which needs only Slurm's client)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from distlab.plots import slurm as plots  # noqa: E402
from distlab.teach import slurm as checks  # noqa: E402


def test_rank_mapping_check(capsys):
    assert checks.check_rank_mapping(None) is False and "No answer yet" in capsys.readouterr().out
    assert checks.check_rank_mapping((5, 1, 1)) is True
    assert checks.check_rank_mapping([6, 2, 1], procid=6, tasks_per_node=4) is True
    for wrong in ((5, 5, 1), (5, 1, 0), (1, 1, 1)):
        with pytest.raises(AssertionError, match="is not it"):
            checks.check_rank_mapping(wrong)


def test_resume_step_check():
    assert checks.check_resume_step(38, saved_step=37) is True
    for wrong in (37, 39, 0):
        with pytest.raises(AssertionError, match="is not it"):
            checks.check_resume_step(wrong, saved_step=37)


def test_first_host_of_a_node_list():
    assert checks.first_host("gpu[07-09],cpu3") == "gpu07"
    assert checks.first_host("node[3,5-6]") == "node3" and checks.first_host("vm") == "vm"
    assert checks.first_host("cpu3,gpu[1-2]") == "cpu3"


def test_master_addr_check_runs_the_line(tmp_path, monkeypatch):
    conf = tmp_path / "slurm.conf"  # scontrol reads a configuration even to expand host names
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\nNodeName=localhost\nPartitionName=p Nodes=localhost\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    good = 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'
    assert checks.check_master_addr(good) is True
    with pytest.raises(AssertionError, match="not 'gpu07'"):
        checks.check_master_addr('export MASTER_ADDR="$SLURM_JOB_NODELIST"')  # the compressed list itself
    with pytest.raises(AssertionError, match="not 'gpu07'"):
        checks.check_master_addr('export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tail -n 1)')


def test_a_node_list_expands_as_scontrol_show_hostnames_does():
    assert checks.expand_hostlist("gpu[07-09],cpu3") == ["gpu07", "gpu08", "gpu09", "cpu3"]
    assert checks.expand_hostlist("node[3,5-6]") == ["node3", "node5", "node6"]
    assert checks.expand_hostlist("vm") == ["vm"]


def test_master_addr_check_without_slurm_says_what_stands_in(monkeypatch, capsys):
    """A machine without Slurm's packages (a container): the exercise still checks the learner's line."""
    import shutil

    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "scontrol" else which(name, *a, **k))
    good = 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'
    assert checks.check_master_addr(good) is True
    assert "scontrol is not installed here: for this check, a bash function answers" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="not 'gpu07'"):
        checks.check_master_addr('export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tail -n 1)')
    with pytest.raises(AssertionError, match="scontrol is not installed here"):
        checks.check_master_addr("export MASTER_ADDR=$(scontrol show config | head -n 1)")


def test_master_addr_check_where_scontrol_finds_no_configuration(tmp_path, monkeypatch, capsys):
    """Slurm's packages installed but no cluster configured (an ordinary user on the book's machine):
    scontrol cannot expand the list, so the stand-in answers, and the check says why."""
    import shutil

    fake = tmp_path / "scontrol"  # a real scontrol without a slurm.conf fails the same way, after a DNS lookup
    fake.write_text("#!/bin/sh\necho 'scontrol: fatal: Could not establish a configuration source' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert shutil.which("scontrol") == str(fake)
    good = 'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'
    assert checks.check_master_addr(good) is True
    assert "scontrol finds no slurm.conf here" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="not 'gpu07'"):
        checks.check_master_addr('export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tail -n 1)')


def test_attempts_plot_has_one_series_per_attempt_and_the_requeue():
    rows = [{"step": s, "attempt": 0, "time": 100 + s} for s in range(1, 6)] + \
           [{"step": s, "attempt": 1, "time": 120 + s} for s in range(6, 11)]
    fig = plots.plot_attempts(rows, t0=100, requeued_at=106)
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.lines] == ["attempt 0", "attempt 1", "scontrol requeue"]
    assert list(ax.lines[1].get_xdata()) == [26, 27, 28, 29, 30] and list(ax.lines[1].get_ydata()) == [6, 7, 8, 9, 10]
    assert list(ax.lines[2].get_xdata()) == [6, 6]


def _chapter_file(name: str) -> str:
    """The text chapter 13's ``%%writefile NAME`` cell writes (after its ``%%needs`` line)."""
    import json

    cells = json.loads((Path(__file__).resolve().parents[1] / "book" / "13_slurm_cluster.ipynb").read_text())["cells"]
    found = ["".join(c["source"]).split(f"%%writefile {name}\n", 1)[1] for c in cells
             if c["cell_type"] == "code" and f"%%writefile {name}\n" in "".join(c["source"])]
    assert len(found) == 1, name
    return found[0]


def test_the_templates_cpu_form_changes_only_what_a_cpu_cluster_must():
    gpu = _chapter_file("ddp_gpu.sbatch")
    cpu = checks.cpu_form(gpu, ["export PATH=/job-python/bin:\"$PATH\""], ranks_per_node=1, step_time=0.2)
    changed = [line for line in cpu.splitlines() if line not in gpu.splitlines()]
    assert len(changed) == 7, changed        # every replacement found its line in the chapter's template
    assert "--nproc-per-node 1 " in cpu and "export OMP_NUM_THREADS=1 " in cpu and "#SBATCH --cpus-per-task=1" in cpu
    assert "srun --kill-on-bad-exit=1 python -m torch.distributed.run" in cpu and "source " not in cpu
    assert "ddp_resumable.py --epochs 2 --size 512 --log-every 1 --step-time 0.2 --num-workers 2 " in cpu
    assert not [line for line in cpu.splitlines() if line.startswith("#SBATCH --gpus")]
    for lesson in ("#SBATCH --open-mode=append", "port=$((20000 + SLURM_JOB_ID % 12000))", "trap '", "--requeue",
                   "--signal=B:USR1@300", '--rdzv-endpoint "$head_addr:$port"',
                   "--signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", "--shutdown-timeout 240",
                   'scancel --signal=USR1 "$SLURM_JOB_ID"'):
        assert lesson in gpu and lesson in cpu, lesson
    assert "SLURM_GPUS_ON_NODE" not in gpu    # expanded once, on the first node: torchrun's own `gpu` instead



def _stopped_by_sigterm(folder: Path, resumable: str) -> tuple[subprocess.CompletedProcess, Path]:
    """Run ``resumable`` as rank 0 of 1 with 2 DataLoader workers, in a session of its own, and send
    SIGTERM to every process of that session mid-batch, as Slurm does to every process of a step."""
    from ports import reserved_port

    from distlab.teach import training

    training.write_ddp_train(folder)
    (folder / "ddp_resumable.py").write_text(resumable)
    checkpoint = folder / "ckpt.pt"
    with reserved_port() as port:
        env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               # the DataLoader's workers share tensors through a multiprocessing folder (pymp-*), left
               # behind by the SIGTERM: in the test's own folder, as a Slurm job's private TMPDIR holds it
               "TMPDIR": str(folder)}
        proc = subprocess.Popen(
            [sys.executable, "ddp_resumable.py", "--epochs", "2", "--size", "512", "--log-every", "1",
             "--step-time", "0.5", "--num-workers", "2", "--checkpoint", str(checkpoint)],
            cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        try:
            lines = []
            for line in proc.stdout:
                lines.append(line)
                if "Batch 1," in line:
                    time.sleep(0.2)      # inside the next batch's 0.5 s: the stop check is still ahead
                    os.killpg(proc.pid, signal.SIGTERM)
                    break
            lines.append(proc.stdout.read())
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return subprocess.CompletedProcess(proc.args, code, "".join(lines)), checkpoint


def test_ddp_resumable_checkpoints_on_sigterm_with_dataloader_workers(tmp_path):
    """Chapter 13's ddp_resumable.py with 2 DataLoader workers saves on the SIGTERM that reaches its
    workers too; without its worker_init_fn, torch's worker handler dies of it and no checkpoint comes."""
    import torch

    resumable = _chapter_file("ddp_resumable.py")
    done, checkpoint = _stopped_by_sigterm(tmp_path, resumable)
    assert done.returncode == 0 and "Rank 0, signalled: checkpoint at epoch 0 batch" in done.stdout, done.stdout
    assert torch.load(checkpoint, weights_only=True)["batch"] >= 2
    line = "        worker_init_fn=ignore_stop_signals,\n"
    assert resumable.count(line) == 1
    (tmp_path / "without").mkdir()
    failed, checkpoint = _stopped_by_sigterm(tmp_path / "without", resumable.replace(line, ""))
    assert failed.returncode != 0 and not checkpoint.exists(), failed.stdout
    assert "is killed by signal: Terminated" in failed.stdout, failed.stdout


def test_the_templates_warning_reaches_the_steps_and_requeues_after_srun(tmp_path):
    """The batch script's trap forwards the warning to the steps (``scancel --signal=USR1``, not the
    batch shell) and requeues only once ``srun`` has returned: a requeue in the trap would SIGTERM the
    steps at once and leave them ``KillWait`` to save. Slurm's commands are stubs that log their calls."""
    log = tmp_path / "calls.log"
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, body in (("scontrol", 'case "$1" in show) echo "NodeName=n0 NodeAddr=10.0.0.1";; *) ;; esac'),
                       ("scancel", ""), ("srun", f'sleep 1.5; echo "srun returned" >> "{log}"; exit 1')):
        (stubs / name).write_text(f'#!/bin/bash\necho "{name} $*" >> "{log}"\n{body}\n')
        (stubs / name).chmod(0o755)
    gpu = _chapter_file("ddp_gpu.sbatch")
    script = tmp_path / "job.sbatch"
    script.write_text(checks.cpu_form(gpu, [f'export PATH="{stubs}:$PATH"']))
    env = {**os.environ, "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n0", "SLURM_NNODES": "1",
           "SLURM_CPUS_PER_TASK": "1", "PATH": f"{stubs}:{os.environ['PATH']}"}
    job = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    deadline = time.monotonic() + 10
    while "srun " not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.05)
    job.send_signal(signal.SIGUSR1)          # what --signal=B:USR1@300 does
    out, _ = job.communicate(timeout=30)
    calls = [line.split(" ", 2)[:2] for line in log.read_text().splitlines()]
    assert ["scancel", "--signal=USR1"] in calls, (calls, out)
    srun = calls.index(next(c for c in calls if c[0] == "srun"))
    requeue = calls.index(["scontrol", "requeue"])
    returned = calls.index(["srun", "returned"])
    assert srun < calls.index(["scancel", "--signal=USR1"]) < returned < requeue == len(calls) - 1, (calls, out)
    assert "time limit near" in out and "requeueing job 42" in out, out


def _tasks_block() -> str:
    """The bash block of chapter 13 that starts one task per rank with ``srun``."""
    import json

    cells = json.loads((Path(__file__).resolve().parents[1] / "book" / "13_slurm_cluster.ipynb").read_text())["cells"]
    blocks = [block.split("\n", 1)[1] for c in cells if c["cell_type"] == "markdown"
              for block in "".join(c["source"]).split("```")[1::2] if block.startswith("bash\n")]
    found = [b for b in blocks if "srun --kill-on-bad-exit=1 bash -c 'RANK=$SLURM_PROCID" in b]
    assert len(found) == 1, blocks
    return found[0]


def _fake_slurm(folder: Path, tasks: int, started: int | None = None) -> dict:
    """Stubs for ``scontrol`` and ``srun`` (which starts ``started`` of the job's ``tasks`` tasks here, with
    each task's variables) and the job's environment: enough for a batch script's lines to run here."""
    stubs = folder / "bin"
    stubs.mkdir()
    (stubs / "scontrol").write_text('#!/bin/bash\ncase "$2" in hostnames) echo n0;; '
                                    '*) echo "NodeName=n0 NodeAddr=127.0.0.1 State=IDLE";; esac\n')
    (stubs / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == -* ]]; do shift; done\n'
                                f'for ((i = 0; i < {started or tasks}; i++)); do\n'
                                '  SLURM_PROCID=$i SLURM_LOCALID=$i "$@" & pids+=($!)\ndone\n'
                                'status=0\nfor pid in "${pids[@]}"; do wait "$pid" || status=$?; done\n'
                                'exit "$status"\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return {**env, "PATH": f"{stubs}:{Path(sys.executable).parent}:{env['PATH']}", "SLURM_NTASKS": str(tasks),
            "SLURM_NTASKS_PER_NODE": str(tasks), "SLURM_JOB_NODELIST": "n0", "SLURM_PROCID": "0"}


def test_one_task_per_rank_srun_line_trains_one_job(tmp_path):
    """Chapter 13's srun line maps Slurm's variables to torch's: two tasks train one 2-rank job."""
    from distlab.teach import training

    training.write_ddp_train(tmp_path)
    env = _fake_slurm(tmp_path, tasks=2)
    # the port the block derives from the job id: one free right now
    job_id = next(j for j in range(4000, 12000) if _free(20000 + j))
    block = _tasks_block().replace("python ddp_train.py", "python ddp_train.py --epochs 1 --size 256")
    done = subprocess.run(["bash", "-c", block], cwd=tmp_path, env={**env, "SLURM_JOB_ID": str(job_id)},
                          capture_output=True, text=True, timeout=120)
    sums = training.checksums_in(done.stdout)
    assert done.returncode == 0 and sorted(sums) == [0, 1] and sums[0] == sums[1], done.stdout + done.stderr
    assert done.stdout.count("parameter checksum") == 2, done.stdout      # one job, not one per task


def _free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_ddp_train_stops_with_the_hint_when_srun_starts_it_per_task(tmp_path):
    """``srun --ntasks-per-node=2 python ddp_train.py``: RANK unset, SLURM_NTASKS=2. Each task would
    spawn a job of its own; chapter 7's script stops instead and says how to map the variables."""
    from distlab.teach import training

    script = training.write_ddp_train(tmp_path)
    env = _fake_slurm(tmp_path, tasks=2, started=1)    # task 0 of 2 is enough to see it stop
    done = subprocess.run(["srun", "--ntasks-per-node=2", sys.executable, str(script), "--epochs", "1",
                           "--size", "64"], cwd=tmp_path, env={**env, "SLURM_JOB_ID": "7"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "parameter checksum" not in done.stdout, done.stdout
    assert "task 0: Slurm runs 2 tasks but RANK is not set" in done.stderr, done.stderr
    assert "srun bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS" in done.stderr
