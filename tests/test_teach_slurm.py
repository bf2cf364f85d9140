"""Chapter 13's exercise self-checks and its plot (no cluster needed; check_master_addr runs bash and
`scontrol show hostnames`, which needs only Slurm's client)."""
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
    with pytest.raises(AssertionError, match="Slurm is not installed here"):
        checks.check_master_addr("export MASTER_ADDR=$(scontrol show config | head -n 1)")


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
    assert "ddp_resumable.py --epochs 2 --size 512 --log-every 1 --step-time 0.2 --checkpoint" in cpu
    assert not [line for line in cpu.splitlines() if line.startswith("#SBATCH --gpus")]
    for lesson in ("#SBATCH --open-mode=append", "port=$((20000 + SLURM_JOB_ID % 12000))", "trap '", "--requeue",
                   "--signal=B:USR1@300", '--rdzv-endpoint "$head_addr:$port"'):
        assert lesson in gpu and lesson in cpu, lesson
    assert "SLURM_GPUS_ON_NODE" not in gpu    # expanded once, on the first node: torchrun's own `gpu` instead

