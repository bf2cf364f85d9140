"""distlab.slurm on two nodes: ``local_cluster(nodes=2)`` runs slurmctld on node0 and one slurmd per node
(each node a network namespace of distlab.Nodes), so ``--nodes 2`` jobs really span two hosts.

Checked: every Slurm command typed on the host reaches the controller (the login shims), ``sbatch`` by
hand as the job user, a torchrun job and a tasks job across the two nodes (each rank where Slurm says,
RANK vs LOCAL_RANK vs SLURM_NODEID, a c10d rendezvous across them, chapter 7's training to the
reference), a requeue with resume, the daemons only on the nodes' network, and that nothing of the
cluster or its nodes is left after ``stop()``.
"""
import json
import os
import pwd
import subprocess
import time
from pathlib import Path

import pytest
import slurm_jobs
from procs import running

from distlab import slurm
from distlab.teach import training

pytestmark = pytest.mark.slow

WHERE = '''import os, socket
import torch, torch.distributed as dist
import distlab
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
print("where", socket.gethostname(), os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["SLURM_NODEID"],
      int(total.item()), flush=True)
dist.destroy_process_group()
'''


@pytest.fixture(scope="module")
def cluster(module_runs_root):
    path = os.environ["PATH"]
    c = slurm.local_cluster(nodes=2)
    yield c
    daemons, holders = list(c.daemons), c.nodes.holder_pids()
    c.stop()
    assert not [d.name for d in daemons if running(d.pid)], "a daemon outlived LocalCluster.stop()"
    assert c.nodes.closed and not [p for p in holders if running(p)], "the cluster's nodes outlived it"
    assert not c.folder.exists() and not c.door.exists() and not c.db.exists()
    assert os.environ["PATH"] == path, "stop() left the login shims on PATH"


def _ranks(res) -> dict[int, tuple[str, str, str, int]]:
    """rank -> (host, LOCAL_RANK, SLURM_NODEID, all-reduced sum) from each rank's 'where' line."""
    found = {}
    for r, log in res.logs.items():
        line = next(x for x in log.splitlines() if x.startswith("where "))
        _, host, rank, local, node, total = line.split()
        assert int(rank) == r
        found[r] = (host, local, node, int(total))
    return found


def test_the_cluster_has_two_nodes_that_slurm_commands_on_the_host_reach(cluster):
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, check=True)
    assert nodes.stdout.split("\n")[:2] == ["node0 idle", "node1 idle"]
    assert repr(cluster).startswith("LocalCluster(running, nodes=node0,node1")
    # the daemons listen on the nodes' private addresses, never on the host
    host = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout
    assert ":6817 " not in host and ":6818 " not in host and "10.77.0." not in host
    on_node0 = cluster.nodes.run(0, "ss -ltnH").stdout
    assert "10.77.0.1:6817" in on_node0 and "10.77.0.1:6818" in on_node0
    assert "10.77.0.2:6818" in cluster.nodes.run(1, "ss -ltnH").stdout


def test_each_node_s_spool_is_entered_not_listed_once_its_slurmd_runs(cluster):
    """Before: slurmd made its spool (where each job's folder of the job's user goes) 0755 when it started."""
    for host in cluster.nodes.hosts:
        assert (cluster.door / "spool" / host).stat().st_mode & 0o777 == 0o711, host


def test_sbatch_by_hand_as_the_job_user_runs_a_task_on_each_node(cluster):
    work = cluster.workdir()
    (work / "hello.sbatch").write_text("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
                                       "#SBATCH --output=hello-%j.out\n"
                                       "srun bash -c 'echo task $SLURM_PROCID node $SLURM_NODEID on $(hostname) "
                                       "as $(id -un)'\necho \"cache ${TORCHINDUCTOR_CACHE_DIR:-unset}\"\n")
    done = subprocess.run(["sbatch", "--parsable", "hello.sbatch"], capture_output=True, text=True, cwd=work,
                          **cluster.as_job_user)
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout)
    deadline = time.monotonic() + 60
    while subprocess.run(["squeue", "-h", "-j", str(job_id)], capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    lines = sorted((work / f"hello-{job_id}.out").read_text().split("\n"))[1:]
    # root's compile cache (set by `import distlab` in this process) is not passed on: the job's import failed
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") and lines[0] == "cache unset"
    assert lines[1:] == [f"task 0 node 0 on node0 as {cluster.user}", f"task 1 node 1 on node1 as {cluster.user}"]


def test_sacct_on_the_login_node_has_a_two_node_job(cluster):
    """slurmdbd runs on node0; sacct typed in the notebook (the login shim) reads a job that ran on both nodes."""
    job_id = subprocess.run(["sbatch", "--parsable", "--nodes=2", "--output=/dev/null", f"--chdir={cluster.jobs}",
                             "--wrap", "srun true; exit 2"], capture_output=True, text=True, check=True,
                            **cluster.as_job_user).stdout.strip()
    assert cluster.accounted(job_id) == "FAILED"
    rows = subprocess.run(["sacct", "-n", "-P", "-j", job_id, "-o", "JobID,State,ExitCode,NodeList"],
                          capture_output=True, text=True, check=True).stdout.splitlines()
    record = {row.split("|")[0]: row.split("|")[1:] for row in rows}
    assert record[job_id][:2] == ["FAILED", "2:0"], record
    assert record[f"{job_id}.0"] == ["COMPLETED", "0:0", "node[0-1]"], record  # its srun ran on both nodes


def test_a_request_no_node_can_satisfy_is_refused_at_submit(cluster):
    """Issue #48: --cpus-per-task beyond a node's CPUs pended forever in PD (PartitionConfig)."""
    work = cluster.workdir()
    (work / "big.sbatch").write_text("#!/bin/bash\nsrun hostname\n")
    cpus = int(subprocess.run(["sinfo", "-h", "-N", "-o", "%c"], capture_output=True, text=True).stdout.split()[0])
    for extra in (["--nodes=2", "--ntasks-per-node=1", f"--cpus-per-task={cpus * 2}"], ["--nodes=3"]):
        done = subprocess.run(["sbatch", "--parsable", *extra, "big.sbatch"], capture_output=True, text=True,
                              cwd=work, **cluster.as_job_user)
        assert done.returncode != 0 and "Batch job submission failed" in done.stderr, (extra, done.stdout)


HAND_WRITTEN = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output=hand-%j.out
nodes=( $( scontrol show hostnames $SLURM_JOB_NODELIST ) )
head_node_ip=$(srun --nodes=1 --ntasks=1 -w "${nodes[0]}" hostname --ip-address)
echo "tmp $TMPDIR"
srun python -c 'import torch, distlab, os, tempfile; print("python", tempfile.gettempdir() == os.environ["TMPDIR"])'
srun torchrun --nnodes 2 --nproc_per_node 1 --rdzv_id 48 --rdzv_backend c10d \\
    --rdzv_endpoint $head_node_ip:29500 where.py
"""


def test_a_hand_written_batch_script_finds_python_torchrun_and_a_private_tmpdir(cluster):
    """Issue #48: a script with no distlab lines got `execve(): torchrun: No such file or directory`, the
    head node's two addresses as its endpoint, and left torchelastic_* folders in the shared /tmp."""
    work = cluster.workdir()
    (work / "where.py").write_text(WHERE)
    (work / "hand.sbatch").write_text(HAND_WRITTEN)
    done = subprocess.run(["sbatch", "--parsable", "--wait", "hand.sbatch"], capture_output=True, text=True,
                          cwd=work, timeout=120, **cluster.as_job_user)
    out = (work / f"hand-{int(done.stdout)}.out").read_text() if done.stdout.strip() else ""
    assert done.returncode == 0, done.stderr + out
    tmp = next(line.split()[1] for line in out.splitlines() if line.startswith("tmp "))
    assert tmp.startswith(str(cluster.door)), out  # private, and gone with the cluster
    assert os.stat(tmp).st_uid == pwd.getpwnam(cluster.user).pw_uid and os.stat(tmp).st_mode & 0o077 == 0
    assert out.count("python True") == 2, out
    wheres = sorted(line.split()[1:3] for line in out.splitlines() if line.startswith("where "))
    assert wheres == [["node0", "0"], ["node1", "1"]], out


@pytest.mark.parametrize("mode", ["torchrun", "tasks"])
def test_a_job_on_two_nodes_has_its_ranks_where_slurm_says_and_they_meet(cluster, mode):
    work = cluster.workdir()
    (work / "where.py").write_text(WHERE)
    res = slurm.submit(work / "where.py", nodes=2, ranks_per_node=2, mode=mode, view=None, workdir=work)
    assert res.state == "COMPLETED" and res.exit_codes == {0: 0, 1: 0, 2: 0, 3: 0}
    where = _ranks(res)
    assert where == {0: ("node0", "0", "0", 6), 1: ("node0", "1", "0", 6),
                     2: ("node1", "0", "1", 6), 3: ("node1", "1", "1", 6)}, where


def test_chapter_7s_script_on_two_nodes_trains_to_the_reference(cluster):
    work = cluster.workdir()
    script = training.write_ddp_train(work)
    res = slurm.submit(script, ["--epochs", "1", "--size", "256", "--log-every", "8"], nodes=2, ranks_per_node=1,
                       view=None, workdir=work)
    assert res.state == "COMPLETED" and res.exit_codes == {0: 0, 1: 0}
    sums = {r: training.checksums_in(res.logs[r])[r] for r in (0, 1)}
    reference = training.reference_train(size=256, batch_size=32, world_size=2, epochs=1)["model"]
    expected = sum(v.double().sum().item() for v in reference.values())
    assert sums[0] == sums[1] and abs(sums[0] - expected) < 1e-4


def test_a_requeued_two_node_job_resumes(cluster):
    work = cluster.workdir()
    script = work / "resumable.py"
    script.write_text(slurm_jobs.RESUMABLE)
    ckpt, steps = work / "ckpt.json", 30
    job = slurm.submit(script, [str(steps), str(ckpt)], nodes=2, mode="tasks", requeue=True, join=False,
                       workdir=work)
    job.watch(until=lambda: (job.latest("step") or 0) >= 8, view=None)
    requeued_at = time.time()
    subprocess.run(["scontrol", "requeue", str(job.id)], check=True)
    deadline = time.monotonic() + 30
    while job.state.reason != "BeginTime":
        assert time.monotonic() < deadline, f"not requeued: {job.state}"
        time.sleep(0.1)
    res = job.join(view=None, timeout=60)  # Slurm starts it again by itself: cred_expire (5) + 1 s, not 2 min
    assert res.attempts == 2 and res.state == "COMPLETED"
    waited = next(r["time"] for r in res.metrics[0] if r["attempt"] == 1) - requeued_at
    assert 6 <= waited < 40, waited  # cred_expire=2 was refused by Slurm 22.05 (120 s applied)
    saved = json.loads(Path(ckpt).read_text())
    second = [r["step"] for r in res.metrics[1] if r["attempt"] == 1]  # rank 1, on node1, resumed too
    assert second[0] == saved["step"] + 1 and second[-1] == steps
    assert f"resumed at step {saved['step']}" in res.logs[1]


def test_a_killed_kernel_leaves_neither_daemon_nor_node(cluster, tmp_path):
    """The process that started a two-node cluster is killed (-9): the nodes' holders see their pipe
    close and take every process on the nodes with them (slurmctld, the slurmds), the watchdog stops
    munged and removes the folders."""
    import sys

    # (this process's cluster runs: the subprocess inherits its PATH with the login shims first)
    code = ("import json, sys; from distlab import slurm; c = slurm.local_cluster(nodes=2); "
            "print(json.dumps([str(c.folder), sorted(c.nodes.holder_pids())]), flush=True); sys.stdin.read()")
    owner = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "DISTLAB_RUNS": str(tmp_path / "runs")})
    try:
        line = owner.stdout.readline()
        assert line, "the cluster did not start (its error is in the captured stderr)"
        folder, holders = json.loads(line)
        folder = Path(folder)
        door, db = Path((folder / "door").read_text()), Path((folder / "db-folder").read_text())
        daemons = json.loads((folder / "daemons.json").read_text())
        assert sorted(d["name"] for d in daemons) == ["mariadbd", "munged", "slurmctld", "slurmd-node0",
                                                      "slurmd-node1", "slurmdbd"]
    finally:
        owner.kill()  # also when it failed: no process of this test may outlive it
        owner.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (any(running(p) for p in [d["pid"] for d in daemons] + holders)
                                           or folder.exists() or door.exists() or db.exists()):
        time.sleep(0.2)
    assert not [d["name"] for d in daemons if running(d["pid"])], "daemons outlived their kernel"
    assert not [p for p in holders if running(p)] and not folder.exists() and not door.exists()
    assert not db.exists(), "the database folder outlived the kernel"


@pytest.mark.parametrize("how", ["torchrun, --signal=USR1@50", "tasks, --signal=B:USR1@50"])
def test_the_time_limit_warning_checkpoints_requeues_and_resumes_on_two_nodes(cluster, how):
    """The warning before the time limit, for real. torchrun mode: ``--signal=USR1@50`` with ``--time=1``,
    which Slurm's controller sends to every process of the step at its first time-limit check of the attempt
    (one every 30 s; it sends when the warning is less than 30 s away, which here is at once): at any moment
    from 0 to about 30 s, also before torchrun has started the ranks. Before the fixes torchrun's agent died of
    SIGUSR1 and the job FAILED (and distlab's one-node agent passed it on a second time); later a warning that
    came before the ranks existed stayed pending in the agent and the job COMPLETED in one attempt (now the
    agent passes it on: distlab.slurm.early_warning). tasks mode: ``B:USR1``, sent to the batch script only, which
    had no trap and died; here the test sends it (``scancel --batch --signal=USR1``, what Slurm does at that time)
    so as not to wait for the controller twice. Either way the ranks checkpoint, rank 0 requeues the job,
    and each new attempt resumes where its rank stopped."""
    mode, signal = how.split(", --signal=")
    work = cluster.workdir()
    (work / "warned.py").write_text(slurm_jobs.WARNED)
    steps = 450 if mode == "torchrun" else 250  # 45 s of work: past the controller's first look
    job = slurm.submit(work / "warned.py", [str(steps), str(work)], nodes=2, mode=mode, requeue=True,
                       signal=signal, time_limit=1, workdir=work, join=False)
    if signal.startswith("B:"):
        job.watch(until=lambda: (job.latest("step") or 0) >= 20, view=None)
        subprocess.run(["scancel", "--batch", "--signal=USR1", str(job.id)], check=True)
    res = job.join(view=None, timeout=240)
    assert res.state == "COMPLETED" and res.attempts >= 2, (res.state, res.attempts)
    for rank in (0, 1):
        by_attempt = {}
        for row in res.metrics[rank]:
            by_attempt.setdefault(row["attempt"], []).append(row["step"])
        # An attempt whose warning came before its first step (a loaded machine: Slurm's warning is due 10 s into
        # each attempt, and starting may take longer) checkpoints at once and logs no step; it is held, not lost
        # (distlab.worker.release_on_handler); so does one that found its rank finished (a late warning requeued the
        # job after that rank's last step). Every attempt that logged steps takes up where the last stopped.
        attempts = sorted(by_attempt)
        assert by_attempt[attempts[0]][0] == 1 and max(attempts) < res.attempts  # from the start; no attempt twice
        for a, b in zip(attempts, attempts[1:], strict=False):  # each attempt takes up where the last stopped
            assert by_attempt[b][0] == by_attempt[a][-1] + 1, (rank, by_attempt)
        assert by_attempt[attempts[-1]][-1] == steps
    assert "warning: checkpoint at step" in res.logs[0] and "requeued the job" in res.logs[0]
    if signal.startswith("B:"):
        assert "SIGUSR1 for the batch script, passed on to the ranks" in job.batch_log.read_text()
    final = json.loads(res.logs[0].split("final ")[-1].splitlines()[0])
    assert final == slurm_jobs.reference_weights(steps)


@pytest.mark.parametrize("mode", ["tasks", "torchrun"])
def test_a_rank_that_dies_on_one_node_ends_the_other_node_at_once(cluster, mode):
    """Rank 1 (node1) fails, rank 0 (node0) sleeps 60 s: srun --kill-on-bad-exit ends it (tasks: the rank's
    task; torchrun: node1's agent exits with the failure, and srun ends node0's agent)."""
    t0 = time.monotonic()
    with pytest.raises(slurm.SlurmJobFailedError) as info:
        slurm.submit(slurm_jobs.fail_on_rank1, nodes=2, mode=mode, view=None)
    e = info.value
    assert e.rank == 1 and "ValueError: rank 1 gives up" in str(e)
    assert e.result.exit_codes[1] == 1 and e.result.exit_codes[0] not in (0, None)
    assert time.monotonic() - t0 < 45, "the rank on node0 (sleeping 60 s) was not stopped"
