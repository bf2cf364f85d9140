"""Chapter 13's exercise self-checks and its plot (no cluster needed; check_master_addr runs bash and
`scontrol show hostnames`, which needs only Slurm's client)."""
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
