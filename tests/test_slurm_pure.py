"""distlab.slurm without a cluster: the sbatch script, the checks before sbatch, Slurm's output read back,
the rank environment, the cluster's configuration, the error messages word for word."""
import os
import socket
import struct
import subprocess
from pathlib import Path

import pytest

from distlab.slurm import (
    account,
    clientconf,
    cluster,
    commands,
    daemons,
    door,
    errors,
    job,
    jobstate,
    jobuser,
    rank,
    slurmconf,
    spec,
    starting,
)
from distlab.slurm.errors import NO_CONFIG, SlurmNotFoundError
from distlab.slurm.jobstate import JobState


def _spec(**kw):
    base = dict(target=Path("/w/ddp_train.py"), run_dir=Path("/runs/r1"), python=Path("/venv/bin/python"),
                import_path=Path("/src"), target_args=("--epochs", "1"), name="ddp_train", ranks_per_node=2)
    return spec.JobSpec(**{**base, **kw})


def _bash_ok(text: str) -> None:
    done = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_torchrun_script_says_what_it_does():
    text = spec.render(_spec(workdir=Path("/w"), extra=["--mem=4G"], nodes=2), Path("/runs/r1/job.sbatch"),
                       Path("/runs/r1/logs/slurm-%j.out"))
    _bash_ok(text)
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash" and "sbatch /runs/r1/job.sbatch" in lines[2]
    options = [line.split()[1] for line in lines if line.startswith("#SBATCH")]
    assert options == ["--job-name=ddp_train", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=2",
                       "--time=00:10:00", "--chdir=/w", "--output=/runs/r1/logs/slurm-%j.out", "--open-mode=append",
                       "--mem=4G"]
    assert "umask 077" in text and "export DISTLAB_RUN_DIR=/runs/r1" in text and "export TMPDIR=/runs/r1/tmp" in text
    assert 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in text
    assert '--rdzv-backend c10d --rdzv-endpoint "$head_addr:$port" --rdzv-id "$SLURM_JOB_ID"' in text
    # the head node's address as Slurm knows it, not a short name that may not resolve on the other nodes
    assert "head_addr=$(scontrol show node -o \"$head_node\" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')" in lines
    assert "--nproc-per-node 2" in text and "network must be trusted" in text
    # its stores bound to the node's address; a failing agent ends the others (not a collective's timeout)
    assert "srun --kill-on-bad-exit=1 python -m distlab.slurm.bound torchrun \\" in lines
    assert 'port=$(python -m distlab.slurm.bound port "$head_addr")' in lines
    # --node-rank "$SLURM_NODEID" on this line would be expanded once, on the first node: 0 for every node
    commands = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    assert "--node-rank" not in commands and "SLURM_NODEID" not in commands
    assert "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK" in lines  # srun no longer inherits it (22.05)
    assert lines[-1] == "    -m distlab.slurm.rank /w/ddp_train.py --epochs 1"


def test_torchrun_script_says_how_c10d_numbers_the_nodes():
    """Issue #47 item 4: the comment says what torch 2.13's c10d rendezvous does. It sorts its participants,
    ``_NodeDesc(addr, pid, local_id)`` (addr: the host's FQDN or ``--local-addr``), and gives rank i to the i-th:
    not the join order, and ``--node-rank`` is ignored (torchrun warns when it is not 0)."""
    import dataclasses
    import inspect

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    text = spec.render(_spec(nodes=2), Path("/j.sbatch"), Path("/l"))
    comments = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("# "))
    assert "as they join" not in comments
    assert "c10d ignores it and numbers the agents by sorting (host FQDN, pid), not in join order" in comments
    # what the comment says, in torch's own code
    assert [f.name for f in dataclasses.fields(dr._NodeDesc)] == ["addr", "pid", "local_id"]
    assert dr._NodeDesc.__dataclass_params__.order
    assert "enumerate(sorted(state.participants))" in inspect.getsource(dr._DistributedRendezvousOpExecutor)
    assert sorted([dr._NodeDesc("node2", 1, 0), dr._NodeDesc("node10", 2, 0)])[0].addr == "node10"  # lexicographic


@pytest.mark.parametrize("mode", ["torchrun", "tasks"])
def test_one_node_scripts_open_no_rendezvous_port(mode):
    """One node, either mode: no torchrun (its c10d store listens on every interface and unpickles what
    it reads), no MASTER_PORT, no port picked: the ranks meet in the run folder's FileStore."""
    text = spec.render(_spec(mode=mode), Path("/j.sbatch"), Path("/l"))
    _bash_ok(text)
    commands = "\n".join(line.split("#")[0] for line in text.splitlines() if not line.startswith("#"))
    for absent in ("torchrun", "--rdzv", "MASTER_PORT", "port=", "head_node"):
        assert absent not in commands, absent
    assert "FileStore in the run folder" in text
    if mode == "torchrun":
        assert "#SBATCH --ntasks-per-node=1" in text and "#SBATCH --cpus-per-task=2" in text
        assert text.rstrip().endswith("srun python -m distlab.slurm.rank --nproc-per-node 2 /w/ddp_train.py --epochs 1")
    else:
        assert "#SBATCH --ntasks-per-node=2" in text
        assert text.rstrip().endswith("srun --kill-on-bad-exit=1 python -m distlab.slurm.rank "
                                      "/w/ddp_train.py --epochs 1")


def test_one_node_ranks_meet_in_a_file_per_attempt():
    assert rank.single_node_environment(3) == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
                                               "TORCHELASTIC_RESTART_COUNT": "3"}
    from distlab.rendezvous.loopback import PLACEHOLDER_PORT

    assert rank.PLACEHOLDER_PORT == str(PLACEHOLDER_PORT)
    assert rank.parse_args(["--nproc-per-node", "2", "t.py", "-x"]) == (2, ["t.py", "-x"])
    assert rank.parse_args(["t.py", "--nproc-per-node", "2"]) == (None, ["t.py", "--nproc-per-node", "2"])
    with pytest.raises(ValueError):
        rank.parse_args(["--nproc-per-node", "0", "t.py"])
    assert rank.agent_environment(1, 2) == {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2",
                                            "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "ROLE_RANK": "1",
                                            "ROLE_WORLD_SIZE": "2"}
    assert rank.exit_status(3) == 3 and rank.exit_status(-15) == 143


def test_a_port_lost_to_a_squatter_is_recognised():
    assert daemons.lost_its_port(["[x] error: Error binding slurm stream socket: Address already in use"])
    assert daemons.lost_its_port(["slurmd: error: Unable to bind listen port (6818): Address already in use"])
    assert not daemons.lost_its_port(["fatal: Unable to determine this slurmd's NodeName"])


def test_the_watchdog_does_not_import_from_the_current_folder(tmp_path):
    """The watchdog runs as root in whatever folder the notebook is in: a planted ``psutil.py`` there must
    not be imported (``-P``)."""
    (tmp_path / "psutil.py").write_text(f"open({str(tmp_path / 'planted-ran')!r}, 'w').close()\n")
    argv = starting.watchdog_argv(2**22 + 1, 0.0, tmp_path / "no-such-cluster")
    assert argv[1] == "-P"
    subprocess.run(argv, cwd=tmp_path, capture_output=True, timeout=60)
    assert not (tmp_path / "planted-ran").exists()


def test_tasks_script_starts_one_task_per_rank():
    text = spec.render(_spec(mode="tasks", nodes=2, gpus_per_node=4, partition="gpu", requeue=True,
                             signal="USR1@90"), Path("/j.sbatch"), Path("/l"))
    _bash_ok(text)
    assert "#SBATCH --ntasks-per-node=2" in text and "#SBATCH --nodes=2" in text
    assert "#SBATCH --gpus-per-node=4" in text and "#SBATCH --partition=gpu" in text
    assert "#SBATCH --requeue" in text and "#SBATCH --signal=USR1@90" in text
    assert 'export MASTER_ADDR="$head_addr" MASTER_PORT="$port"' in text
    assert text.rstrip().endswith("srun --kill-on-bad-exit=1 python -m distlab.slurm.rank /w/ddp_train.py --epochs 1")
    assert "torchrun" not in text.split("srun")[-1]


def test_paths_with_spaces_are_quoted():
    text = spec.render(_spec(target=Path("/my dir/t.py"), run_dir=Path("/runs/a b")), Path("/j"), Path("/l"))
    _bash_ok(text)
    assert "'/my dir/t.py'" in text and "export DISTLAB_RUN_DIR='/runs/a b'" in text


@pytest.mark.parametrize("good", ["10", "1:30", "00:10:00", "2-00", "1-12:00:00", 30])
def test_time_limits_slurm_accepts(good):
    assert spec.check_time(good) == str(good)


@pytest.mark.parametrize("bad", ["ten minutes", "1:2:3:4", "", None, -5, True, "10\n#SBATCH --x"])
def test_time_limits_refused(bad):
    with pytest.raises(errors.SlurmArgumentError, match="is not a Slurm time limit"):
        spec.check_time(bad)


def test_option_checks():
    assert spec.check_extra(["--mem=4G", "#SBATCH --exclusive"]) == ["--mem=4G", "--exclusive"]
    assert spec.check_extra("--qos=low") == ["--qos=low"]
    for bad in (["--mem=4G\nrm -rf ~"], ["mem=4G"], [3]):
        with pytest.raises(errors.SlurmArgumentError, match="is not one sbatch option"):
            spec.check_extra(bad)
    with pytest.raises(errors.SlurmArgumentError, match="must be one of 'torchrun', 'tasks'"):
        spec.check_mode("mpi")
    with pytest.raises(errors.SlurmArgumentError, match="must be an integer >= 1"):
        spec.positive("nodes", 0)
    with pytest.raises(errors.SlurmArgumentError, match="must be 1-64 letters"):
        spec.check_name("my job")
    assert spec.check_signal("B:USR1@60") == "B:USR1@60"
    with pytest.raises(errors.SlurmArgumentError, match=r"is not \[B:\]SIGNAL\[@seconds\]"):
        spec.check_signal("USR1 @ 60")
    assert spec.check_partition(None, []) is None and spec.check_partition("debug", ["debug"]) == "debug"
    with pytest.raises(errors.SlurmArgumentError) as info:
        spec.check_partition("gpu", ["cpu", "debug"])
    assert str(info.value) == ("distlab.slurm: invalid partition='gpu': is not a partition of this cluster. "
                               "Partitions here: cpu, debug (see `sinfo`).")


def test_squeue_and_scontrol_output_read_back():
    assert jobstate.parse_squeue("") is None
    assert jobstate.parse_squeue("PENDING|Resources|\n") == JobState("PENDING", "Resources", "")
    assert jobstate.parse_squeue("RUNNING|None|node[1-2]") == JobState("RUNNING", "None", "node[1-2]")
    assert jobstate.parse_squeue("CANCELLED by 0|None|vm").state == "CANCELLED"
    line = ("JobId=7 JobName=hello UserId=root(0) JobState=COMPLETED Reason=None Requeue=1 Restarts=1 "
            "ExitCode=0:0 NodeList=vm StdOut=/runs/x/logs/slurm-7.out")
    fields = jobstate.parse_scontrol(line)
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0" and fields["Restarts"] == "1"
    assert fields["StdOut"] == "/runs/x/logs/slurm-7.out"


def test_states_described_and_finished():
    assert JobState("PENDING", "Resources").describe() == "PENDING (Resources)"
    assert JobState("PENDING", "None").describe() == "PENDING"
    assert JobState("RUNNING", "None", "vm").describe() == "RUNNING on vm"
    assert JobState("COMPLETED", exit_code="0:0").describe() == "COMPLETED (exit code 0:0)"
    assert not JobState("COMPLETING").finished and not JobState("PENDING").finished
    assert all(JobState(s).finished for s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"))


def test_tasks_per_node_and_rank_environment():
    assert rank.tasks_on_node("2") == 2
    assert [rank.tasks_on_node("4(x2),1", n) for n in range(3)] == [4, 4, 1]
    with pytest.raises(ValueError, match="cannot read tasks per node"):
        rank.tasks_on_node("two")
    env = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_NODEID": "1",
           "SLURM_STEP_TASKS_PER_NODE": "4(x2)"}
    assert rank.rank_environment(env) == {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    assert rank.rank_environment({**env, "RANK": "0"}) == {}


def test_a_multi_node_tasks_script_runs_the_jobs_python():
    """The tasks-mode srun line on several nodes named a bare ``python`` (none on the nodes' PATH)."""
    text = spec.render(_spec(mode="tasks", nodes=2, python=Path("/usr/bin/python3.11")), Path("/j"), Path("/l"))
    _bash_ok(text)
    assert text.rstrip().endswith("srun --kill-on-bad-exit=1 /usr/bin/python3.11 -m distlab.slurm.rank "
                                  "/w/ddp_train.py --epochs 1")


def test_a_rendezvous_port_is_free_and_below_the_ephemeral_range():
    import random
    import socket

    from distlab.slurm import bound

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    rng = random.Random(0)
    first = random.Random(0).sample(bound.PORTS, 1)[0]
    held = socket.socket()
    held.bind(("127.0.0.1", first))  # the first port it tries is taken: it goes on to another
    try:
        port = bound.free_port("127.0.0.1", rng=rng)
    finally:
        held.close()
        taken.close()
    assert port != first and bound.PORTS.start <= port < 32768


def test_a_cluster_on_nodes_has_a_slurmd_per_node_on_its_own_address(tmp_path):
    text = slurmconf.config_text(tmp_path, "vm", 6817, 6818, "root", 2, 900, tmp_path / "munge.sock",
                                 spool=tmp_path / "spool", nodes=[("node0", "10.77.0.1"), ("node1", "10.77.0.2")])
    conf = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")
                and " " not in line.split("=", 1)[0])
    assert conf["SlurmctldHost"] == "node0(10.77.0.1)"
    assert "NodeName=node0 NodeAddr=10.77.0.1 CPUs=2 RealMemory=900" in text
    assert "NodeName=node1 NodeAddr=10.77.0.2 CPUs=2 RealMemory=900" in text
    assert "PartitionName=debug Nodes=node0,node1 Default=YES" in text
    assert conf["SlurmdSpoolDir"] == f"{tmp_path}/spool/%n"  # each slurmd its own spool, pid file and log
    assert conf["SlurmdPidFile"].endswith("slurmd-%n.pid") and conf["SlurmdLogFile"].endswith("slurmd-%n.log")


def test_login_shims_run_slurm_commands_on_the_login_node(tmp_path):
    from distlab.slurm import login

    door = login.Door(kernel_pid=4242, kernel_start=777, fd=12, inode=4026532999)
    bin_dir = login.write_shims(tmp_path, door, "node0", which=lambda name, path: f"/usr/bin/{name}")
    sbatch = (bin_dir / "sbatch").read_text()
    assert 'exec /usr/bin/nsenter --net=/proc/self/fd/9 -- "$real" "$@"' in sbatch and "real=/usr/bin/sbatch" in sbatch
    assert "-t " not in sbatch and "command exec 9</proc/4242/fd/12" in sbatch  # a held file, never a pid
    assert "-f20)\" = 777 ]" in sbatch and '= "net:[4026532999]" ]' in sbatch
    assert '-S "$(/usr/bin/id -u "$user")" -G "$(/usr/bin/id -g "$user")"' in sbatch  # as the job user
    assert oct((bin_dir / "sinfo").stat().st_mode & 0o777) == "0o700"
    done = subprocess.run(["sh", "-n", str(bin_dir / "sbatch")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    path = login.with_bin_first({"PATH": f"/usr/bin:{bin_dir}"}, bin_dir)
    assert path == f"{bin_dir}:/usr/bin" and login.without_bin(path, bin_dir) == "/usr/bin"


def test_a_second_clusters_shims_skip_the_first_clusters_shims_on_path(tmp_path):
    """A subprocess of a notebook whose cluster runs on nodes inherits its PATH, login shims first: a cluster
    it starts must call the real commands (its shims pointed at the first cluster's: its slurmctld 'did not
    answer', its commands reached the other cluster)."""
    from distlab.slurm import login

    real = tmp_path / "usr"
    real.mkdir()
    (real / "sinfo").write_text("#!/bin/sh\n")
    (real / "sinfo").chmod(0o755)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = login.write_shims(tmp_path / "a", login.Door(11, 1, 3, 5), "node0", path=str(real))
    second = login.write_shims(tmp_path / "b", login.Door(22, 1, 3, 5), "node0", path=f"{first}:{real}")
    text = (second / "sinfo").read_text()
    assert f"real={real}/sinfo" in text and "/proc/22/fd/3" in text and str(first) not in text


@pytest.mark.parametrize("nodes", ["two", 0, True, 11])
def test_a_wrong_nodes_argument_is_refused_before_anything_starts(nodes):
    with pytest.raises((errors.ClusterError, ValueError)) as e:
        cluster.check_nodes_argument(nodes)
    assert "node" in str(e.value)


def test_cluster_config_and_missing_packages(tmp_path):
    text = slurmconf.config_text(tmp_path, "vm", 7001, 7002, "root", 2, 1800, tmp_path / "s" / "munge.sock")
    conf = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#")
                and " " not in line.split("=", 1)[0])
    assert conf["SlurmctldHost"] == "vm(127.0.0.1)" and conf["SlurmctldPort"] == "7001" and conf["SlurmdPort"] == "7002"
    assert conf["CommunicationParameters"] == "NoCtldInAddrAny,NoInAddrAny"  # 127.0.0.1, not every interface
    assert conf["AuthInfo"] == f"socket={tmp_path}/s/munge.sock,cred_expire=5"
    assert conf["ProctrackType"] == "proctrack/linuxproc" and conf["TaskPlugin"] == "task/none"
    assert all(str(tmp_path) in conf[k] for k in ("StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile"))
    assert "NodeName=vm NodeAddr=127.0.0.1 CPUs=2 RealMemory=1800" in text
    missing = slurmconf.missing_programs(which=lambda p, path=None: None if p in ("munged", "slurmd") else "/x")
    assert missing == {"munged": "munge", "slurmd": "slurmd"}
    assert slurmconf.install_hint(missing).startswith("Install them: apt-get install munge slurm-wlm ")


def test_not_root_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(cluster, "missing_programs", lambda: {})
    monkeypatch.setattr(cluster.os, "geteuid", lambda: 1000)
    with pytest.raises(errors.ClusterError) as info:
        cluster.check_can_start()
    assert str(info.value) == (
        "distlab.slurm: cannot start a one-machine cluster: it needs root (slurmd starts every job step as the "
        "job's user, which only root may do). Run as root (as CI does, or in a container), or use a real "
        "cluster's login node.")


def _result(tmp_path, state, codes, exit_code="1:0"):
    attempt = tmp_path / "logs" / "attempt0"
    attempt.mkdir(parents=True)
    for r, c in codes.items():
        if c is not None:
            (attempt / f"rank{r}.exit").write_text(str(c))
    return job.SlurmResult(run_dir=tmp_path, script=None, world_size=len(codes),
                           logs={r: f"line of {r}\n" for r in codes}, job_id=9, state=state, exit_code=exit_code,
                           exit_codes=codes)


def test_failure_names_the_rank_that_failed_by_itself(tmp_path):
    e = job.failure(_result(tmp_path, "FAILED", {0: -15, 1: 3}), tmp_path / "none.out")
    assert e.rank == 1 and str(e) == (
        "distlab.slurm: job 9 ended FAILED (Slurm exit code 1:0); rank 1 failed first (exit code 3).\n"
        "--- last lines rank 1 printed ---\nline of 1\n"
        f"Run folder (sbatch script and every rank's log): {tmp_path}")


def test_failure_by_slurm_says_why(tmp_path):
    log = tmp_path / "slurm-9.out"
    log.write_text("*** JOB 9 ON vm CANCELLED AT 2026-12-01T14:40:06 DUE TO TIME LIMIT ***\n")
    e = job.failure(_result(tmp_path, "TIMEOUT", {0: -15, 1: -15}, "0:15"), log)
    assert e.rank is None and str(e) == (
        "distlab.slurm: job 9 ended TIMEOUT (Slurm exit code 0:15) (its time limit, --time).\n"
        "--- last lines of the batch script's output ---\n"
        "*** JOB 9 ON vm CANCELLED AT 2026-12-01T14:40:06 DUE TO TIME LIMIT ***\n"
        f"Run folder (sbatch script and every rank's log): {tmp_path}")


def test_timeout_and_interrupt_messages():
    e = errors.SlurmTimeoutError(4, 10.0, {1: "stack b", 0: "stack a"}, "/runs/x")
    assert str(e) == ("distlab.slurm: job 4 did not finish within timeout=10.0s of running; it was cancelled "
                      "(scancel).\nWhere each rank was when the time ran out:\n--- rank 0 ---\nstack a\n"
                      "--- rank 1 ---\nstack b\nA rank waiting in a collective usually means another rank never "
                      "called it. Run folder: /runs/x")
    i = errors.SlurmInterrupted(4, "/runs/x")
    assert isinstance(i, KeyboardInterrupt) and str(i) == (
        "distlab.slurm: interrupted; job 4 was cancelled (scancel) and has left the queue. Run folder: /runs/x")


def test_who_the_local_clusters_jobs_run_as():
    """Never root: a named user, else whoever used sudo, else the dedicated account (which may be created)."""
    assert cluster.choose_job_user("alice", {"SUDO_USER": "bob"}) == ("alice", False)
    assert cluster.choose_job_user(None, {"SUDO_USER": "bob"}) == ("bob", False)
    assert cluster.choose_job_user(None, {"SUDO_USER": "root"}) == ("distlab-job", True)
    assert cluster.choose_job_user(None, {}) == ("distlab-job", True)
    for root in ("root", "0"):
        with pytest.raises(errors.ClusterError, match="its jobs would run as root"):
            cluster.choose_job_user(root, {})
    with pytest.raises(errors.ClusterError, match="has uid 0"):
        cluster.ensure_account("root", False)
    with pytest.raises(errors.ClusterError, match="does not exist"):
        cluster.ensure_account("no-such-user-distlab", False)
    assert "DisableRootJobs=YES" in slurmconf.config_text(Path("/c"), "vm", 1, 2, "root", 2, 100, Path("/s"))


def test_the_jobs_environment_keeps_none_of_roots_folders(tmp_path):
    import pwd

    account = pwd.struct_passwd(("distlab-job", "x", 995, 995, "", "/nonexistent", "/usr/sbin/nologin"))
    env = {"HOME": "/root", "USER": "root", "XDG_RUNTIME_DIR": "/run/user/0", "DISTLAB_RUNS": "/root/runs",
           "TMPDIR": "/tmp", "PATH": "/usr/bin", "SLURM_CONF": "/tmp/d/slurm.conf",
           "TORCHINDUCTOR_CACHE_DIR": "/root/runs/compile-cache", "TRITON_CACHE_DIR": "/root/.triton"}
    out = jobuser.job_environment(env, account, tmp_path)
    assert out == {"HOME": str(tmp_path), "USER": "distlab-job", "LOGNAME": "distlab-job", "PATH": "/usr/bin",
                   "SLURM_CONF": "/tmp/d/slurm.conf"}
    assert jobuser.as_user(account) == {"user": 995, "group": 995, "extra_groups": []}
    assert jobuser.python_candidates("3.11", "/opt/py")[0] == "/opt/py/bin/python3.11"


def test_a_job_folder_is_trusted_only_while_the_job_user_alone_owns_it(tmp_path):
    from distlab.errors import RunFolderError

    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    me = os.geteuid()
    jobuser.check_job_folder(folder, me)
    with pytest.raises(RunFolderError, match="no longer a private folder of uid 12345"):
        jobuser.check_job_folder(folder, 12345)
    folder.chmod(0o750)
    with pytest.raises(RunFolderError, match="mode 0750"):
        jobuser.check_job_folder(folder, me)
    f = tmp_path / "rank0.pt"
    f.write_bytes(b"x")
    f.chmod(0o600)
    jobuser.check_job_file(f, me)
    f.chmod(0o620)
    with pytest.raises(RunFolderError, match="not a file only uid"):
        jobuser.check_job_file(f, me)


class _Child:
    """A stand-in for a rank's Popen: ends with ``code`` after ``polls`` looks, or when terminated."""

    def __init__(self, code, polls):
        self.code, self.polls, self.signals = code, polls, []

    def poll(self):
        self.polls -= 1
        return self.code if self.polls <= 0 else None

    def terminate(self):
        self.signals.append("TERM")
        self.code, self.polls = -15, 0

    def kill(self):
        self.signals.append("KILL")
        self.code, self.polls = -9, 0


def test_the_one_node_agent_stops_the_others_when_a_rank_fails():
    ended = []
    survivor, failing = _Child(0, 10**6), _Child(1, 2)
    codes = rank.wait_all({0: survivor, 1: failing}, lambda r, c: ended.append((r, c)))
    assert ended == [(1, 1), (0, -15)] and codes == [1, -15] and survivor.signals == ["TERM"]
    done = [_Child(0, 1), _Child(0, 3)]
    assert rank.wait_all(dict(enumerate(done)), lambda r, c: None) == [0, 0]
    assert all(c.signals == [] for c in done)


SLURM_DUMP = """Thread 0x00007f01 (most recent call first):
  File "/src/distlab/worker.py", line 88 in _exit_with_parent
  File "/usr/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007f02 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in recv
  File "{folder}/stuck.py", line 12 in stuck
  File "/src/distlab/worker.py", line 124 in main
  File "{folder}/stuck.py", line 20 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "/src/distlab/worker.py", line 260 in bootstrap
  File "/src/distlab/slurm/bound.py", line 113 in main
  File "/src/distlab/launch/rank.py", line 11 in <module>
"""


def test_a_slurm_timeout_shows_the_learners_frames_mapped_to_the_notebook(tmp_path):
    """Chapter 13's hang printed 53 lines of watchdog, worker, runpy and start frames, and named the
    learner's frame stuck.py instead of its cell."""
    import json

    from distlab.slurm.job import job_stack

    (tmp_path / "stuck.py").write_text("# the job's script\n")
    (tmp_path / "stuck.origins.json").write_text(json.dumps(
        [{"qualname": "stuck", "first": 10, "last": 14, "where": "Cell In[7]", "line": 1}]))
    text = job_stack(SLURM_DUMP.format(folder=tmp_path), tmp_path)
    assert text == (
        "Current thread 0x00007f02 (most recent call first):\n"
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in recv\n'
        f'  File "{tmp_path}/stuck.py", line 12 in stuck\n'
        "    (from the notebook: Cell In[7], line 3, in stuck)\n"
        f'  File "{tmp_path}/stuck.py", line 20 in <module>')


def test_an_interrupted_slurm_job_shows_its_message_not_distlabs_frames():
    e = errors.SlurmInterrupted(4, "/runs/x")
    assert isinstance(e, KeyboardInterrupt)
    assert e._render_traceback_() == [
        "\x1b[0;31mKeyboardInterrupt: distlab.slurm: interrupted; job 4 was cancelled (scancel) and has left the "
        "queue. Run folder: /runs/x\x1b[0m"]


def test_a_requeue_is_told_once_whether_or_not_a_poll_saw_the_job_wait(tmp_path, monkeypatch, capsys):
    """Requeued and started again between two polls, a job never shows PENDING: its new attempt
    folder tells (it was silent, and CI's requeue test failed when the scheduler was that quick)."""
    import time

    seen = iter([JobState("RUNNING", nodes="vm"), JobState("RUNNING", nodes="vm"), JobState("RUNNING", nodes="vm"),
                 JobState("PENDING", "BeginTime"), JobState("RUNNING", nodes="vm")])
    monkeypatch.setattr(commands, "job_state", lambda job_id: next(seen))
    watched = job.SlurmJob(7, tmp_path, {"world_size": 1, "submitted": time.time()})
    (tmp_path / "logs" / "attempt0").mkdir(parents=True)
    watched._poll_state()
    watched._poll_state()
    (tmp_path / "logs" / "attempt1").mkdir()  # requeued and running again before this poll
    watched._poll_state()
    assert [s for _, s in watched.history] == ["RUNNING", "REQUEUED"]
    assert "[slurm] job 7 requeued, RUNNING on vm" in capsys.readouterr().out
    watched._poll_state()  # a second requeue, seen waiting: told once, not again when it starts
    (tmp_path / "logs" / "attempt2").mkdir()
    watched._poll_state()
    assert [s for _, s in watched.history] == ["RUNNING", "REQUEUED", "REQUEUED", "RUNNING"]


def test_a_batch_warning_signal_gets_a_trap_that_passes_it_on_and_the_script_waits_for_srun():
    """``--signal=B:USR1@90`` reaches only the batch shell: without a trap bash dies of it, and the job too."""
    text = spec.render(_spec(nodes=2, signal="B:USR1@90"), Path("/j"), Path("/l"))
    _bash_ok(text)
    lines = text.splitlines()
    trap = next(line for line in lines if line.startswith("trap "))
    assert trap.endswith("scancel --signal=USR1 \"$SLURM_JOB_ID\"' USR1")
    srun = next(i for i, line in enumerate(lines) if line.startswith("srun "))
    assert lines.index(trap) < srun  # set before srun starts
    assert lines[lines.index("srun_pid=$!") - 1].endswith(" &") and lines[-1] == 'exit "$status"'
    plain = spec.render(_spec(nodes=2, signal="USR1@90"), Path("/j"), Path("/l"))
    assert "trap " not in plain and "srun_pid" not in plain  # sent to the ranks themselves: nothing to pass on


def _run_shim(tmp_path, door, real_text="#!/bin/sh\necho real ran \"$@\"\n"):
    from distlab.slurm import login

    real = tmp_path / "usr"
    real.mkdir(parents=True, exist_ok=True)
    (real / "sinfo").write_text(real_text)
    (real / "sinfo").chmod(0o755)
    bin_dir = login.write_shims(tmp_path, door, "node0", path=str(real))
    return subprocess.run([str(bin_dir / "sinfo"), "-h"], capture_output=True, text=True)


def test_a_login_shim_enters_through_the_held_file_and_refuses_anything_else(tmp_path):
    """Issue #45 item 2: after the nodes closed or node0 died, a shim sent commands into whatever held the
    pid written into it. Now: the notebook's own descriptor, checked against its start time and the
    namespace's inode; otherwise it refuses and runs nothing."""
    import os

    from distlab.nodes import held as held_mod
    from distlab.slurm import login

    if os.geteuid() != 0:
        pytest.skip("the shims enter namespaces as root only (CI runs as root)")
    own = held_mod.Held("node 0", os.getpid(), os.getppid(), os.pidfd_open(os.getpid()))
    own.fds["net"] = os.open("/proc/self/ns/net", os.O_RDONLY)  # a held network: here, the host's own
    try:
        right = login.door(own)
        ok = _run_shim(tmp_path / "ok", right)
        assert ok.returncode == 0 and ok.stdout == "real ran -h\n", ok.stderr
        for wrong in (login.Door(right.kernel_pid, right.kernel_start + 1, right.fd, right.inode),  # pid reused
                      login.Door(right.kernel_pid, right.kernel_start, right.fd, right.inode + 1),  # another network
                      login.Door(right.kernel_pid, right.kernel_start, 987, right.inode)):         # file closed
            refused = _run_shim(tmp_path / f"no{wrong.fd}{wrong.inode}{wrong.kernel_start}", wrong)
            assert refused.returncode == 1 and "real ran" not in refused.stdout
            assert refused.stderr.startswith("distlab: this Slurm cluster's nodes are gone"), refused.stderr
    finally:
        own.close()

def test_the_door_lets_the_job_user_alone_in_whatever_shares_its_gid():
    """Issue #58 item 2: the door was root:<the job user's group> 0710, and a second /etc/group entry with that
    gid (or an LDAP group) let its members in. Its ACL names the job user's uid and grants its group nothing."""
    value = door.acl_value(7, 1234, 1)
    assert door.acl_users(value) == {1234: 1}
    entries = [struct.unpack_from("<HHI", value, k) for k in range(4, len(value), 8)]
    assert entries == [(door.ACL_USER_OBJ, 7, door.ACL_UNDEFINED_ID), (door.ACL_USER, 1, 1234),
                       (door.ACL_GROUP_OBJ, 0, door.ACL_UNDEFINED_ID), (door.ACL_MASK, 1, door.ACL_UNDEFINED_ID),
                       (door.ACL_OTHER, 0, door.ACL_UNDEFINED_ID)]


def _stat(uid: int, mode: int):
    import stat as st
    from types import SimpleNamespace

    return SimpleNamespace(st_uid=uid, st_mode=st.S_IFDIR | mode)


def test_a_temp_folder_is_used_only_when_root_s_and_sticky():
    """Issue #58 item 1: a $TMPDIR any user could write without the sticky bit (or another user's) let that
    user rename the database folder and plant a socket in its place. Such a $TMPDIR is passed over, and said."""
    folders = {"/tmp": _stat(0, 0o1777), "/var/tmp": _stat(0, 0o1777), "/open": _stat(0, 0o777),
               "/theirs": _stat(1000, 0o1777), "/mine": _stat(0, 0o1777), "/closed": _stat(0, 0o1700)}
    lstat = folders.__getitem__
    assert door.usable_tmp("/open", lstat) == "is not sticky (whoever may write there may rename what it holds)"
    assert door.usable_tmp("/theirs", lstat) == "belongs to uid 1000, not root"
    assert door.usable_tmp("/closed", lstat) == "not every user may enter it"
    said = []
    for tmpdir in ("/open", "/theirs", "/closed"):
        assert door.system_tmp({"TMPDIR": tmpdir}, lstat, said.append) == "/tmp"
    assert said[0] == ("distlab.slurm: TMPDIR=/open is not sticky (whoever may write there may rename what it "
                       "holds): the cluster's door and database go to /tmp instead")
    assert len(said) == 3
    assert door.system_tmp({"TMPDIR": "/mine"}, lstat, said.append) == "/mine"
    assert door.system_tmp({}, lstat, said.append) == "/tmp" and len(said) == 3
    folders["/tmp"] = _stat(0, 0o777)
    assert door.system_tmp({}, lstat, said.append) == "/var/tmp"


def test_a_daemon_gets_a_minimal_environment():
    """Issue #58 item 4: every daemon got the notebook's whole environment (a token in it was readable in
    MariaDB's /proc/<pid>/environ, as mysql)."""
    assert daemons.daemon_env(Path("/d/slurm.conf")) == {"PATH": daemons.DAEMON_PATH, "SLURM_CONF": "/d/slurm.conf"}


TCP_TABLE = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1AA1 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0 100 0 0 10 0
   1: 00000000:1AA2 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 222 1 0 100 0 0 10 0
   2: 0100007F:1AA1 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 333 1 0 20 4 30 10 -1
"""


def test_the_listener_on_a_port_is_found_by_its_socket():
    """Issue #58 item 3, where namespaces are refused: nothing is sent to a daemon's port until the daemon
    itself listens there (a squatter listening first received root's readiness probe)."""
    assert daemons.listening_inodes(0x1AA1, [TCP_TABLE]) == {111}  # the connected socket (333) is no listener
    assert daemons.listening_inodes(0x1AA2, [TCP_TABLE]) == {222}  # on any address
    assert daemons.listening_inodes(80, [TCP_TABLE]) == set()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert daemons.who_listens(os.getpid(), port) == "none"
        s.listen()
        assert daemons.who_listens(os.getpid(), port) == "daemon"
        assert daemons.who_listens(1, port) == "other"


# --- no Slurm command of distlab asks the site's DNS for a controller (configless mode) ----------------------

FAKE_SCONTROL = ('#!/bin/sh\necho "SLURM_CONF=${SLURM_CONF-unset}" >> "$(dirname "$0")/ran"\n'
                 'echo "Slurmctld(primary) at x is UP"\n')


@pytest.fixture
def fake_scontrol(tmp_path, monkeypatch):
    """An ``scontrol`` first on PATH that records the SLURM_CONF it was run with, and no slurm.conf anywhere."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(clientconf, "DEFAULT_CONFS", (str(tmp_path / "etc" / "slurm.conf"),), raising=False)
    return bin_dir / "ran"


def test_with_no_slurm_conf_no_slurm_command_runs(fake_scontrol):
    """Before: ``scontrol ping`` ran with no configuration, and Slurm asked DNS for ``_slurmctld._tcp``."""
    assert cluster.controller_answers() is False
    with pytest.raises(SlurmNotFoundError) as caught:
        commands.ping()
    assert str(caught.value) == NO_CONFIG.format(conf=None, defaults=clientconf.DEFAULT_CONFS[0])
    assert not fake_scontrol.exists(), fake_scontrol.read_text()


def test_a_slurm_conf_named_but_missing_runs_nothing(fake_scontrol, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "gone.conf"))  # Slurm would retry it for 60 s
    assert cluster.controller_answers() is False
    with pytest.raises(SlurmNotFoundError):
        commands.ping()
    assert not fake_scontrol.exists()


def test_every_slurm_command_gets_slurm_conf_set(fake_scontrol, tmp_path):
    conf = tmp_path / "etc" / "slurm.conf"
    conf.parent.mkdir()
    conf.write_text("ClusterName=x\n")
    assert cluster.controller_answers() is True
    commands.ping()
    assert fake_scontrol.read_text().splitlines() == [f"SLURM_CONF={conf}"] * 2


def test_every_task_gets_the_notebook_python_torchrun_and_a_private_tmpdir(tmp_path):
    """Issue #48 items 2 and 6: the cluster's TaskProlog, named in its slurm.conf, puts the notebook's python and
    torchrun first on PATH and TMPDIR in the door (gone with the cluster), for jobs written by hand too."""
    from distlab.slurm import jobenv

    door = tmp_path / "door"
    text = slurmconf.config_text(tmp_path, "vm", 1, 2, "root", 2, 100, Path("/s"), task_prolog=door / jobenv.PROLOG)
    assert f"\nTaskProlog={door / jobenv.PROLOG}\n" in text
    prolog = jobenv.prolog_text(door, ["/opt/site-packages"])
    assert f'echo "export PATH={door / jobenv.BIN}:$PATH"' in prolog
    assert 'export PYTHONPATH=/opt/site-packages${PYTHONPATH:+:$PYTHONPATH}' in prolog
    assert f"tmp={door / jobenv.TMP}/job-" in prolog and 'mkdir -p -m 700 "$tmp"' in prolog
    assert "PYTHONPATH" not in jobenv.prolog_text(door, [])
    made = jobenv.wrappers(Path("/usr/bin/python3.11"))
    assert made["torchrun"].endswith('exec /usr/bin/python3.11 -m torch.distributed.run "$@"\n')
    assert made["python"].endswith('exec /usr/bin/python3.11 "$@"\n') and set(made) == {"python", "python3", "torchrun"}


def test_a_new_job_account_never_gets_a_uid_that_owns_leftovers(tmp_path, monkeypatch):
    """Issue #48 item 6: files a deleted distlab-job left in /tmp went to the next cluster's new distlab-job,
    which useradd gave the same (freed) uid."""
    import grp
    import pwd

    if os.geteuid() != 0:
        pytest.skip("giving a file to another uid needs root")
    taken = {a.pw_uid for a in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
    orphan = jobuser.fresh_system_uid(taken, *jobuser.system_uid_range())  # what useradd would hand out next
    leftover = tmp_path / "torchelastic_abc"
    leftover.mkdir()
    os.chown(leftover, orphan, orphan)
    (tmp_path / "mine").mkdir()
    assert jobuser.leftover_uids([str(tmp_path)]) == {orphan}
    monkeypatch.setattr(jobuser, "SHARED_TMP", (str(tmp_path),))
    argv = []
    monkeypatch.setattr(account.subprocess, "run", lambda a, **kw: argv.append(a) or
                        subprocess.CompletedProcess(a, 1, "", "not made: a test"))
    with pytest.raises(errors.ClusterError, match="could not create its job user"):
        cluster.ensure_account("distlab-no-such-user", True)
    uid = int(argv[0][argv[0].index("--uid") + 1])
    assert uid != orphan and uid not in taken and argv[0][0] == "useradd"
    assert jobuser.fresh_system_uid({999, 998}, 100, 999) == 997


def test_a_cluster_with_accounting_sends_its_jobs_to_its_slurmdbd(tmp_path):
    """Issue #48 item 5: the cluster keeps job accounting (slurmdbd, its own MariaDB) unless told not to."""
    from distlab.slurm import accounting

    sock = tmp_path / "munge.sock"
    text = slurmconf.config_text(tmp_path, "vm", 1, 2, "root", 2, 100, sock, dbd=("127.0.0.1", 6819))
    conf = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    assert conf["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert (conf["AccountingStorageHost"], conf["AccountingStoragePort"]) == ("127.0.0.1", "6819")
    assert conf["AccountingStoragePass"] == str(sock)  # munge's socket for slurmdbd: not read from AuthInfo
    assert conf["JobAcctGatherType"] == "jobacct_gather/linux"
    off = slurmconf.config_text(tmp_path, "vm", 1, 2, "root", 2, 100, sock)
    assert "AccountingStorageType=accounting_storage/none" in off and "jobacct_gather/none" in off
    dbd = dict(line.split("=", 1) for line in accounting.dbd_conf_text(tmp_path, sock, 6819, "root").splitlines()
               if "=" in line and not line.startswith("#"))
    assert dbd["CommunicationParameters"] == "NoInAddrAny" and dbd["StorageHost"] == "localhost"
    assert dbd["AuthInfo"] == f"socket={sock}" and "StoragePass" not in dbd  # no password anywhere
    options = accounting.mariadb_options(tmp_path / "db")
    assert "--skip-networking" in options and "--no-defaults" == options[0] and "--user=mysql" in options
    argv = accounting.slurmdbd_argv(tmp_path, tmp_path / "db", rename_host=True)
    assert argv[:3] == ["unshare", "--uts", "sh"] and argv[-2:] == ["slurmdbd", "-D"]
    assert f"MYSQL_UNIX_PORT={tmp_path}/db/mysqld.sock" in argv
    assert accounting.slurmdbd_argv(tmp_path, tmp_path / "db", rename_host=False)[0] == "env"
    assert accounting.loopback_only(["127.0.1.1"]) and not accounting.loopback_only(["127.0.0.1", "172.17.0.2"])
    assert not accounting.loopback_only([])
    boot = accounting.install_argv(tmp_path / "db", "/usr/share/mysql")
    assert boot[:2] == ["sh", "-c"] and "mysql_system_tables_data.sql" in boot[2] and "fill_help" not in boot[2]
    assert "| exec mariadbd --no-defaults" in boot[2] and " --bootstrap " in boot[2]
    assert accounting.install_argv(tmp_path / "db")[0] == "mariadb-install-db"  # no SQL files found: the script


def test_daemons_stop_controller_before_database_before_munge():
    """slurmctld hands slurmdbd what it still holds, slurmdbd needs MariaDB, and every daemon asks munged."""
    daemons = [cluster.Daemon(name, k, 0.0) for k, name in
               enumerate(["munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd-node0", "slurmd-node1"])]
    assert [d.name for d in cluster.stop_order(daemons)] == ["slurmd-node1", "slurmd-node0", "slurmctld", "slurmdbd",
                                                             "mariadbd", "munged"]
    shuffled = [daemons[3], daemons[0], daemons[5], daemons[1], daemons[2], daemons[4]]
    assert [d.name for d in cluster.stop_order(shuffled)][2:] == ["slurmctld", "slurmdbd", "mariadbd", "munged"]


def test_accounted_waits_for_the_whole_record(tmp_path):
    """sacct first has a job's state under a stand-in name (allocation) and its first node; accounted() waits
    until the name and node list match the controller's, and says what it saw when they never do."""
    count = tmp_path / "count"
    count.write_text("0")
    (tmp_path / "sacct").write_text(f"""#!/bin/sh
n=$(cat {count}); echo $((n + 1)) > {count}
if [ "$n" -lt 2 ]; then echo "COMPLETED|allocation|node0"; else echo "COMPLETED|fine|node[0-1]"; fi
""")
    (tmp_path / "scontrol").write_text("#!/bin/sh\necho 'JobId=7 JobName=fine JobState=COMPLETED NodeList=node[0-1]'\n")
    for name in ("sacct", "scontrol"):
        (tmp_path / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    assert cluster.accounted(7, env, timeout=10) == "COMPLETED" and count.read_text().strip() == "3"
    (tmp_path / "scontrol").write_text("#!/bin/sh\necho 'JobId=7 JobName=other JobState=COMPLETED NodeList=x'\n")
    with pytest.raises(errors.SlurmError, match=r"no whole final record of job 7 after 1 s: COMPLETED\|fine"):
        cluster.accounted(7, env, timeout=1)


def test_the_layout_of_a_jobs_own_files():
    """Issue #60: each of distlab.slurm's file names, as the layout's docstring lists them."""
    from distlab.slurm import layout

    attempt = Path("/r/logs/attempt2")
    assert layout.exit_file(attempt, 3) == attempt / "rank3.exit"
    assert layout.rank_run_json(attempt, 3) == attempt / "rank3.run.json"
    assert layout.batch_log(Path("/r"), 41) == Path("/r/logs/slurm-41.out")
    assert (layout.META, layout.SBATCH) == ("slurm-job.json", "job.sbatch")


def test_a_timeout_keeps_each_stacks_indent_drops_its_trailing_blank_and_says_when_none_started():
    """Issue #60: a stack's first line is indented (``  File ...``); only its end is trimmed."""
    e = errors.SlurmTimeoutError(4, 10.0, {0: '  File "a.py", line 1\n\n'}, "/runs/x", result="r")
    assert '--- rank 0 ---\n  File "a.py", line 1\nA rank waiting' in str(e)
    assert (e.job_id, e.timeout, e.stacks, e.result) == (4, 10.0, {0: '  File "a.py", line 1\n\n'}, "r")
    none = errors.SlurmTimeoutError(4, 10.0, {}, "/runs/x")
    assert "ran out:\n(no rank had started)\nA rank waiting" in str(none) and none.result is None


def test_each_slurm_error_says_its_words_and_keeps_what_it_was_given():
    """Issue #60: word for word, as the errors module promises, and the attributes the callers read."""
    e = errors.SlurmArgumentError("time", "ten", "not a time limit", "Give minutes, e.g. 10.")
    assert str(e) == "distlab.slurm: invalid time='ten': not a time limit. Give minutes, e.g. 10." and e.name == "time"
    assert isinstance(e, ValueError)
    assert str(errors.SlurmArgumentError("nodes", 0, "at least 1")) == "distlab.slurm: invalid nodes=0: at least 1."
    failed = errors.SlurmJobFailedError("job 3 failed", result="r", rank=1)
    assert (str(failed), failed.result, failed.rank) == ("job 3 failed", "r", 1)
    assert (errors.SlurmJobFailedError("x").result, errors.SlurmJobFailedError("x").rank) == (None, None)
    assert str(errors.ClusterError("it needs root", "Run as root.")) == (
        "distlab.slurm: cannot start a one-machine cluster: it needs root. Run as root.")
    interrupted = errors.SlurmInterrupted(4, "/runs/x")
    assert (interrupted.job_id, interrupted.run_dir) == (4, "/runs/x")


def test_the_job_environment_word_for_word():
    """Issue #60: every line of the wrappers and the TaskProlog, and the import paths in order, once each."""
    import distlab
    from distlab.slurm import jobenv

    made = jobenv.wrappers(Path("/opt/my python/bin/python3"))
    assert made["python3"] == ("#!/bin/sh\n# distlab: the notebook's `python3` for this cluster's jobs (the job user "
                               "may not enter the notebook's environment)\nexec '/opt/my python/bin/python3' \"$@\"\n")
    assert made["python"].splitlines()[1].startswith("# distlab: the notebook's `python` for")
    assert made["torchrun"].splitlines()[1].startswith("# distlab: the notebook's `torchrun` for")
    assert jobenv.prolog_text(Path("/d"), ["/a", "/b"]) == (
        "#!/bin/sh\n# distlab: Slurm's TaskProlog. slurmstepd runs it as the job user before each task and sets every"
        "\n# `export NAME=value` line it prints in the task's environment.\n"
        'echo "export PATH=/d/env/bin:$PATH"\n'
        'echo "export PYTHONPATH=/a:/b${PYTHONPATH:+:$PYTHONPATH}"\n'
        'tmp=/d/tmp/job-"$SLURM_JOB_ID"\nmkdir -p -m 700 "$tmp" && echo "export TMPDIR=$tmp"\n')
    own = str(Path(distlab.__file__).resolve().parents[1])
    assert jobenv.import_paths(()) == [own]
    assert jobenv.import_paths(("/site", own, "/site")) == [own, "/site"]


def test_the_job_environment_is_installed_in_the_door_with_its_owners_and_modes(tmp_path, monkeypatch):
    """Issue #60: ``install`` writes env/bin's three programs and the TaskProlog, root's and the door's
    group's (0750), never over a file already there, and tmp/ the job user's alone (0700)."""
    import stat
    from types import SimpleNamespace

    from distlab.slurm import jobenv, jobuser

    if os.geteuid() != 0:
        pytest.skip("handing files to root and the job user's group needs root")
    account = SimpleNamespace(pw_uid=4321, pw_gid=4322, pw_name="job")
    monkeypatch.setattr(jobuser, "job_python", lambda acc: (Path("/usr/bin/python3"), ("/site",)) if acc is account
                        else pytest.fail(f"job_python asked about {acc!r}"))
    door = tmp_path / "door"
    door.mkdir()
    prolog = jobenv.install(door, account)
    assert prolog == door / "task-prolog" and prolog.read_text() == jobenv.prolog_text(
        door, jobenv.import_paths(("/site",)))
    for path in (door / "env", door / "env/bin", prolog, *(door / "env/bin" / n for n in ("python", "python3",
                                                                                        "torchrun"))):
        st = path.lstat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 4322, 0o750), path
    assert (door / "env/bin/torchrun").read_text() == jobenv.wrappers(Path("/usr/bin/python3"))["torchrun"]
    tmp = (door / "tmp").lstat()
    assert (tmp.st_uid, tmp.st_gid, stat.S_IMODE(tmp.st_mode)) == (4321, 4322, 0o700)
    with pytest.raises(FileExistsError):
        jobenv._write(prolog, "planted", 4322)
    assert jobenv.prolog_text(Path("/d"), []) == (
        "#!/bin/sh\n# distlab: Slurm's TaskProlog. slurmstepd runs it as the job user before each task and sets every"
        "\n# `export NAME=value` line it prints in the task's environment.\n"
        'echo "export PATH=/d/env/bin:$PATH"\n'
        'tmp=/d/tmp/job-"$SLURM_JOB_ID"\nmkdir -p -m 700 "$tmp" && echo "export TMPDIR=$tmp"\n')


# --- mutation second pass (#60): the sbatch scripts and the checks word for word -------------------

SBATCH_SCRIPTS = Path(__file__).with_name("sbatch")  # the expected scripts: read them as a learner would
SCRIPT_CASES = {
    # one node, distlab's agent; a Python of the system with the notebook's packages, every optional option,
    # a warning signal for the batch shell alone (so srun runs in the background, behind a trap)
    "one_node_torchrun": dict(python=Path("/usr/bin/python3.11"), site_paths=("/venv/site", "/more site"),
                              gpus_per_node=2, partition="gpu", workdir=Path("/w"), requeue=True,
                              signal="B:SIGUSR1@60", extra=["--mem=4G"]),
    # a directive of exactly the comments' column (40 characters): its comment goes above it
    "one_node_tasks": dict(mode="tasks", cpus_per_task=3, time="5", workdir=Path("/home/learner/notebooks1")),
    # several nodes: the rendezvous on the first; srun's continued lines behind the trap; a long option
    "nodes_torchrun": dict(nodes=2, signal="B:USR2@90", extra=["--constraint=the-nodes-with-a-fast-network"]),
    # a path too long for its comment's column, a Python whose path needs quoting, a signal for the ranks
    "nodes_tasks": dict(mode="tasks", nodes=3, signal="R:USR1@30", python=Path("/opt/py 3/bin/python3"),
                        workdir=Path("/a/long/working/folder/of/the/notebook")),
}


@pytest.mark.parametrize("case", sorted(SCRIPT_CASES))
def test_each_kind_of_sbatch_script_word_for_word(case):
    """The whole script, comments included: they are what a learner reads to learn what the job does.
    A change to the script shows here as a diff: review it, then write the new text into tests/sbatch/."""
    job = _spec(target=Path("/w/train.py"), name="train", **SCRIPT_CASES[case])
    text = spec.render(job, Path(f"/runs/r1/{case}.sbatch"), Path("/runs/r1/logs/slurm-%j.out"))
    assert text == (SBATCH_SCRIPTS / f"{case}.sbatch").read_text()


def _refused(check, *args) -> str:
    with pytest.raises(errors.SlurmArgumentError) as info:
        check(*args)
    return str(info.value)


def test_each_check_accepts_its_edges_and_refuses_in_its_own_words():
    must = "must be an integer >= {}."
    assert _refused(spec.positive, "nodes", 0) == "distlab.slurm: invalid nodes=0: " + must.format(1)
    assert _refused(spec.positive, "nodes", True) == "distlab.slurm: invalid nodes=True: " + must.format(1)
    assert _refused(spec.positive, "nodes", 2.0) == "distlab.slurm: invalid nodes=2.0: " + must.format(1)
    assert _refused(spec.positive, "n", 1, 2) == "distlab.slurm: invalid n=1: " + must.format(2)
    assert spec.positive("gpus", 0, 0) == 0 and spec.positive("nodes", 1) == 1 and spec.positive("n", 2, 2) == 2
    time = ': is not a Slurm time limit. Write minutes (10), "MM:SS", "HH:MM:SS" or "D-HH:MM:SS".'
    assert _refused(spec.check_time, 0) == "distlab.slurm: invalid time=0" + time
    assert _refused(spec.check_time, True) == "distlab.slurm: invalid time=True" + time
    assert _refused(spec.check_time, "x") == "distlab.slurm: invalid time='x'" + time
    assert spec.check_time(1) == "1"
    name = ": must be 1-64 letters, digits, '_', '.', '+' or '-'."
    assert spec.check_name("a" * 64) == "a" * 64 and spec.check_name("A_z.9+-") == "A_z.9+-"
    assert _refused(spec.check_name, "a" * 65) == f"distlab.slurm: invalid name={'a' * 65!r}" + name
    assert _refused(spec.check_name, 3) == "distlab.slurm: invalid name=3" + name
    extra = ': is not one sbatch option. Give each as "--option=value" (e.g. "--mem=4G").'
    assert spec.check_extra(None) == [] and spec.check_extra(["#SBATCH   --mem=4G  "]) == ["--mem=4G"]
    assert _refused(spec.check_extra, ["--mem=4G", "--x=1\n--y"]) == (
        "distlab.slurm: invalid extra='--x=1\\n--y'" + extra)
    assert _refused(spec.check_extra, [None]) == "distlab.slurm: invalid extra=None" + extra
    signal = ': is not [B:]SIGNAL[@seconds]. For example "USR1@60".'
    assert [spec.check_signal(s) for s in (None, "USR1", "SIGTERM@5", "R:USR2@60")] == [None, "USR1", "SIGTERM@5",
                                                                                       "R:USR2@60"]
    assert _refused(spec.check_signal, 5) == "distlab.slurm: invalid signal=5" + signal
    assert _refused(spec.check_signal, "X:USR1") == "distlab.slurm: invalid signal='X:USR1'" + signal
    assert _refused(spec.check_signal, "usr1") == "distlab.slurm: invalid signal='usr1'" + signal
    assert spec.check_mode("tasks") == "tasks" and spec.check_mode("torchrun") == "torchrun"
    assert _refused(spec.check_mode, "mpi") == "distlab.slurm: invalid mode='mpi': must be one of 'torchrun', 'tasks'."
    assert _refused(spec.check_partition, "gpu", []) == (
        "distlab.slurm: invalid partition='gpu': is not a partition of this cluster. Partitions here: (none) "
        "(see `sinfo`).")


def test_a_job_spec_says_its_world_size_and_whether_it_is_on_one_node():
    assert _spec(nodes=3, ranks_per_node=4).world_size == 12
    assert _spec(nodes=1).single_node and not _spec(nodes=2).single_node


SLURM_CONFS = Path(__file__).with_name("slurmconf")  # the expected slurm.conf files


def test_the_one_node_and_the_nodes_slurm_conf_word_for_word():
    """Every line of the cluster's configuration: one node on 127.0.0.1 with defaults, and a cluster on
    Nodes with every option (a partition, the door's spool, a TaskProlog, accounting). A change shows here
    as a diff: review it, then write the new text into tests/slurmconf/."""
    one = slurmconf.config_text(Path("/c"), "vm", 6817, 6818, "slurm", 2, 900, Path("/m/munge.sock"))
    assert one == (SLURM_CONFS / "one_node.conf").read_text()
    nodes = slurmconf.config_text(Path("/c"), "vm", 7001, 7002, "root", 4, 1800, Path("/m/munge.sock"),
                                  partition="lab", spool=Path("/door/spool"),
                                  nodes=[("node0", "10.77.0.1"), ("node1", "10.77.0.2")],
                                  task_prolog=Path("/door/task-prolog"), dbd=("10.77.0.1", 6819))
    assert nodes == (SLURM_CONFS / "nodes.conf").read_text()


def test_the_programs_are_looked_for_on_path_and_in_the_sbin_folders(monkeypatch):
    monkeypatch.setenv("PATH", "/a:/b")
    asked = []

    def which(program, path=None):
        asked.append(path)
        return None if program in ("munged", "sbatch", "srun") else f"/x/{program}"

    assert slurmconf.missing_programs(which) == {"munged": "munge", "sbatch": "slurm-client", "srun": "slurm-client"}
    assert set(asked) == {"/a:/b:/usr/sbin:/sbin"} and len(asked) == len(slurmconf.PROGRAMS)
    monkeypatch.delenv("PATH")
    asked.clear()
    slurmconf.missing_programs(which)
    assert set(asked) == {":/usr/sbin:/sbin"}
    assert slurmconf.install_hint({"munged": "munge", "sbatch": "slurm-client", "slurmd": "slurmd"}) == (
        "Install them: apt-get install munge slurm-wlm (Debian/Ubuntu; slurm-wlm brings slurmctld, slurmd and "
        "slurm-client), or use a real cluster.")


def test_a_free_port_is_an_unprivileged_port_of_the_loopback_address():
    port = slurmconf.free_port()
    assert isinstance(port, int) and 1024 <= port < 65536


def test_a_node_declares_every_core_and_nine_tenths_of_the_memory(monkeypatch):
    import types

    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(total=10 * 2**30))
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert slurmconf.node_resources() == (6, 9216)
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # not known: one
    assert slurmconf.node_resources() == (1, 9216)
