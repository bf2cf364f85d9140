"""A Slurm cluster on nodes the caller made, after those nodes close (issue #45, item 2).

``with Nodes(2) as n: c = local_cluster(nodes=n)`` with ``c`` used after the block: the cluster stops with
its nodes and takes its login shims off PATH, and a shim kept from before sends nothing anywhere (it used to
enter whatever namespace held node0's old pid). Its own module: a second cluster must not meet the
module-wide one of ``test_slurm_nodes.py``.
"""
import os
import shutil
import subprocess

import pytest
from procs import running

import distlab
from distlab import slurm

pytestmark = pytest.mark.slow


def test_a_cluster_stops_with_its_nodes_and_its_shims_then_refuse(module_runs_root, tmp_path):
    path = os.environ["PATH"]
    with distlab.Nodes(2) as nodes:
        cluster = slurm.local_cluster(nodes=nodes, use_existing=False)
        assert "SLURM_CONF" not in repr(cluster) and "10.77.0." not in repr(cluster)
        kept = tmp_path / "squeue"
        kept.write_text((cluster.folder / "bin" / "squeue").read_text())
        kept.chmod(0o700)
        assert subprocess.run([str(kept), "-h"], capture_output=True, text=True).returncode == 0  # it works now
        daemons = list(cluster.daemons)
    assert not cluster.running() and not [d.name for d in daemons if running(d.pid)]
    assert os.environ["PATH"] == path and not cluster.folder.exists()
    after = subprocess.run([str(kept), "-h"], capture_output=True, text=True, timeout=30)
    assert after.returncode == 1 and after.stdout == ""
    assert after.stderr.startswith("distlab: this Slurm cluster's nodes are gone"), after.stderr


def test_close_keeps_what_the_jobs_wrote_and_says_where(module_runs_root, capsys):
    """Issue #48: close() deleted cluster.workdir() with the job's output and a trained snapshot.pt."""
    cluster = slurm.local_cluster(nodes=2, use_existing=False)
    kept = None
    try:
        work = cluster.workdir()
        done = subprocess.run(["sbatch", "--wait", "--output=out-%j.txt", "--wrap", "echo trained > snapshot.pt"],
                              capture_output=True, text=True, cwd=work, timeout=60, **cluster.as_job_user)
        assert done.returncode == 0, done.stderr
        cluster.close()
        said = capsys.readouterr().out
        assert f"stay in {module_runs_root}" in said and work.name in said, said
        kept = next(module_runs_root.glob("slurm-work-*"))
        assert (kept / work.name / "snapshot.pt").read_text() == "trained\n"
        assert len(list((kept / work.name).glob("out-*.txt"))) == 1
        owners = {p.lstat().st_uid for p in [kept, *kept.rglob("*")]}
        assert owners == {os.getuid()}, "the kept work must be the notebook user's (the job user may go)"
        assert kept.stat().st_mode & 0o077 == 0 and not cluster.door.exists() and not cluster.folder.exists()
    finally:
        cluster.close()
        if kept is not None:
            shutil.rmtree(kept)
