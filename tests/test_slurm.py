"""distlab.slurm against a real one-machine Slurm cluster (slurmctld + slurmd + munged from Debian's
packages, started by distlab.slurm.local_cluster; CI installs them and runs as root).

Every test submits real jobs. Together they check: live output, return values and exit codes,
a failing rank, a timeout with stacks, Kernel > Interrupt -> scancel, requeue + resume, reattach
by id, checks before sbatch, private files, and that no daemon outlives the cluster.
"""
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
import slurm_jobs
from procs import running
from second_user import world_traversable_tmp

from distlab import slurm
from distlab.slurm import cluster as cluster_module
from distlab.slurm import commands, login, starting
from distlab.slurm import daemons as daemons_module

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(module_runs_root):
    c = slurm.local_cluster(use_existing=False)  # ours: the tests drain nodes and count daemons
    yield c
    daemons = list(c.daemons)
    c.stop()
    assert not [d.name for d in daemons if running(d.pid)], "a daemon outlived LocalCluster.stop()"
    assert not _processes_of(c.folder, c.door, c.db), "a process of the cluster outlived it"
    assert not c.folder.exists(), "the stopped cluster's folder is left in the runs root"
    assert not c.door.exists(), "the stopped cluster's door (conf, socket, jobs) is left in the temp dir"
    assert not c.db.exists(), "the stopped cluster's database (data, socket, log) is left in the temp dir"


def _processes_of(folder: Path, door: Path, db: Path | None = None) -> list[str]:
    """Live processes that belong to the cluster in ``folder`` (its SLURM_CONF, or its paths in argv)."""
    found = []
    paths = [str(folder), str(door)] + ([str(db)] if db else [])
    for p in psutil.process_iter(["pid", "cmdline", "name"]):
        try:
            if p.status() == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                continue
            argv = " ".join(p.info["cmdline"] or [])
            if any(path in argv for path in paths) or p.environ().get("SLURM_CONF") == str(door / "slurm.conf"):
                found.append(f"{p.pid} {p.info['name']}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


class Recorder:
    """A view that notes when each rank line arrived."""

    def __init__(self, on_line=None):
        self.lines, self.on_line = [], on_line

    def line(self, rank, text):
        self.lines.append((time.monotonic(), rank, text))
        if self.on_line:
            self.on_line(rank, text)

    def metric(self, rank, row):
        pass

    def close(self):
        pass


def _private(run_dir: Path) -> None:
    for p in run_dir.rglob("*"):
        mode = p.stat().st_mode & 0o777
        assert mode == (0o700 if p.is_dir() else 0o600), f"{p} has mode {mode:o}"


def test_function_job_streams_live_and_returns(cluster):
    view = Recorder()
    job = slurm.submit(slurm_jobs.hello, (4,), ranks_per_node=2, mode="tasks", join=False)
    res = job.join(view=view)
    ended = time.monotonic()
    assert res.state == "COMPLETED" and res.exit_codes == {0: 0, 1: 0}
    assert res.returns == {r: {"rank": r, "world": 2, "procid": str(r)} for r in (0, 1)}
    ticks = [t for t, rank, text in view.lines if text.startswith("tick")]
    assert len(ticks) == 8 and ticks[0] < ended - 0.6, "the first line arrived only at the end: not live"
    assert "tick 3 from rank 1" in res.logs[1] and res.job_id == job.id
    assert [s for _, s in res.history][-1] == "COMPLETED" and "RUNNING" in [s for _, s in res.history]
    _private(res.run_dir)
    again = slurm.attach(job.id)  # reattach by id (as another kernel would)
    assert again.run_dir == job.run_dir and again.logs == res.logs and again.state.state == "COMPLETED"


@pytest.mark.parametrize("mode", ["tasks", "torchrun"])
def test_failing_rank_is_named_and_survivors_stop(cluster, mode):
    """srun --kill-on-bad-exit stops the survivor in tasks mode; the one-node agent does in torchrun mode."""
    t0 = time.monotonic()
    with pytest.raises(slurm.SlurmJobFailedError) as info:
        slurm.submit(slurm_jobs.fail_on_rank1, ranks_per_node=2, mode=mode, view=None)
    e = info.value
    assert e.rank == 1 and "rank 1 failed first (exit code 1)" in str(e) and "ValueError: rank 1 gives up" in str(e)
    assert e.result.exit_codes[1] == 1 and e.result.exit_codes[0] not in (0, None)  # stopped by Slurm
    assert time.monotonic() - t0 < 40, "the survivor (sleeping 60 s) was not stopped"
    assert not commands.in_queue(e.result.job_id)


@pytest.mark.parametrize("mode", ["tasks", "torchrun"])
def test_timeout_cancels_with_each_ranks_stack(cluster, mode):
    with pytest.raises(slurm.SlurmTimeoutError) as info:
        slurm.submit(slurm_jobs.wait_forever, ranks_per_node=2, mode=mode, timeout=8, view=None)
    e = info.value
    assert sorted(e.stacks) == [0, 1], f"stacks of {sorted(e.stacks)} only"
    assert all("wait_forever" in s for s in e.stacks.values()), e.stacks
    assert not commands.in_queue(e.job_id)


def test_interrupt_cancels_the_job(cluster):
    def interrupt_once(rank, text):
        if "waiting" in text and not fired:
            fired.append(1)
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()

    fired = []
    job = slurm.submit(slurm_jobs.wait_forever, ranks_per_node=2, mode="tasks", join=False)
    with pytest.raises(slurm.SlurmInterrupted) as info:
        job.watch(view=Recorder(interrupt_once))
    assert isinstance(info.value, KeyboardInterrupt) and fired
    left = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    assert str(job.id) not in left and job.state.state == "CANCELLED"


def test_requeue_resumes_from_the_checkpoint(cluster, capsys):
    work = cluster.workdir()  # the job user writes the checkpoint: a folder of its own
    script = work / "resumable.py"
    script.write_text(slurm_jobs.RESUMABLE)
    ckpt, steps = work / "ckpt.json", 30
    job = slurm.submit(script, [str(steps), str(ckpt)], mode="tasks", requeue=True, join=False)
    job.watch(until=lambda: (job.latest("step") or 0) >= 8, view=None)
    subprocess.run(["scontrol", "requeue", str(job.id)], check=True)  # what preemption does: SIGTERM, requeue
    deadline = time.monotonic() + 30
    while job.state.reason != "BeginTime":  # requeue complete: the job waits for its new start time
        assert time.monotonic() < deadline, f"not requeued: {job.state}"
        time.sleep(0.1)
    time.sleep(3)  # a second past the revocation of the old credential: released at once it once ended FAILED
    subprocess.run(["scontrol", "update", f"JobId={job.id}", "StartTime=now"], check=True)  # not Slurm's ~2 min
    res = job.join(view=None)
    assert res.attempts == 2 and res.state == "COMPLETED"
    # "requeued, PENDING (BeginTime)" when a poll saw it wait; "requeued, RUNNING on ..." when it was
    # started again between two polls (its new attempt folder tells): either way, said once
    assert capsys.readouterr().out.count(f"[slurm] job {job.id} requeued, ") == 1
    assert [s for _, s in res.history].count("REQUEUED") == 1 and res.history[-1][1] == "COMPLETED"
    saved = json.loads(ckpt.read_text())
    rows = res.metrics[0]
    first = [r["step"] for r in rows if r["attempt"] == 0]
    second = [r["step"] for r in rows if r["attempt"] == 1]
    assert first[-1] == saved["step"] < steps, "the checkpoint is not where the first attempt stopped"
    assert second[0] == saved["step"] + 1 and second[-1] == steps, "the second attempt did not resume"
    assert f"resumed at step {saved['step']}" in res.logs[0]
    final = json.loads(res.logs[0].split("final ")[-1].splitlines()[0])
    assert final == slurm_jobs.reference_weights(steps), "resumed weights differ from an uninterrupted run"


def test_bad_input_fails_before_sbatch(cluster, tmp_path):
    before = _last_job_id()
    with pytest.raises(slurm.SlurmArgumentError, match="not a partition of this cluster.*Partitions here: debug"):
        slurm.submit(slurm_jobs.hello, (1,), partition="gpu-a100")
    with pytest.raises(slurm.SlurmNotFoundError, match="the script 'nope.py' not found"):
        slurm.submit("nope.py")
    with pytest.raises(slurm.SlurmArgumentError, match="is not a Slurm time limit"):
        slurm.submit(slurm_jobs.hello, (1,), time_limit="ten minutes")
    # root's own folders: the job user (jobs never run as root) could not enter or read them
    with pytest.raises(slurm.SlurmArgumentError, match="cannot be entered by the cluster's job user 'distlab-job'"):
        slurm.submit(slurm_jobs.hello, (1,), workdir=tmp_path)
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    with pytest.raises(slurm.SlurmArgumentError, match=r"os.chdir\(cluster.workdir\(\)\)"):
        slurm.submit(script, workdir=cluster.workdir())
    assert _last_job_id() == before, "a job reached sbatch"


def test_no_controller_and_no_slurm_are_clear(cluster, monkeypatch, tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text(cluster.conf.read_text().replace(f"SlurmctldPort={_port(cluster)}", "SlurmctldPort=9"))
    monkeypatch.setenv("SLURM_CONF", str(conf))
    with pytest.raises(slurm.SlurmNotFoundError, match="no Slurm controller answers"):
        slurm.submit(slurm_jobs.hello, (1,))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(slurm.SlurmNotFoundError, match="the Slurm command 'scontrol' not found. Install"):
        slurm.submit(slurm_jobs.hello, (1,))


def test_killed_owner_leaves_no_daemon(tmp_path):
    """A process that started a cluster is killed (-9): its watchdog stops every daemon."""
    root = tmp_path / "runs"
    code = ("import os, sys; from distlab import slurm; c = slurm.local_cluster(use_existing=False); "
            "print(c.folder, flush=True); sys.stdin.read()")
    owner = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "DISTLAB_RUNS": str(root)})
    folder = Path(owner.stdout.readline().strip())
    door, db = Path((folder / "door").read_text()), Path((folder / "db-folder").read_text())
    daemons = json.loads((folder / "daemons.json").read_text())
    assert sorted(d["name"] for d in daemons) == ["mariadbd", "munged", "slurmctld", "slurmd", "slurmdbd"]
    assert all(running(d["pid"]) for d in daemons)
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (any(running(d["pid"]) for d in daemons) or _processes_of(folder, door, db)):
        time.sleep(0.2)
    assert not [d["name"] for d in daemons if running(d["pid"])], "daemons outlived their kernel"
    assert not _processes_of(folder, door, db) and not folder.exists() and not door.exists() and not db.exists()


def test_close_leaves_no_database_process_socket_or_file(tmp_path):
    """close() (here from another process, whose cluster this one does not share) stops slurmdbd and MariaDB
    and removes the database folder with its data, socket and log; nothing of them is left."""
    root = tmp_path / "runs"
    code = ("import sys; from distlab import slurm; c = slurm.local_cluster(use_existing=False); "
            "print(c.folder, c.db, flush=True); sys.stdin.readline(); c.close(); print('closed', flush=True)")
    owner = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "DISTLAB_RUNS": str(root)})
    try:
        folder, db = map(Path, owner.stdout.readline().split())
        daemons = {d["name"]: d["pid"] for d in json.loads((folder / "daemons.json").read_text())}
        assert (db / "mysqld.sock").is_socket() and (db / "data").is_dir()
        owner.stdin.write("\n")
        owner.stdin.flush()
        assert owner.stdout.readline().strip() == "closed"
    finally:
        owner.stdin.close()
        owner.wait(60)
    assert not [name for name, pid in daemons.items() if running(pid)], daemons
    assert not db.exists() and not folder.exists()
    left = [p.info["name"] for p in psutil.process_iter(["name", "cmdline"])
            if p.info["name"] in ("mariadbd", "slurmdbd", "mariadb-install-db")
            and (str(db) in " ".join(p.info["cmdline"] or []) or str(folder) in " ".join(p.info["cmdline"] or []))]
    assert not left, left


def _sacct(job_id, env=None, **kw) -> dict[str, list[str]]:
    """sacct's record of a job: step name -> [JobName, State, ExitCode, MaxRSS]."""
    out = subprocess.run(["sacct", "-n", "-P", "-j", str(job_id), "-o", "JobID,JobName,State,ExitCode,MaxRSS"],
                         capture_output=True, text=True, check=True, **kw).stdout
    return {line.split("|")[0]: line.split("|")[1:] for line in out.splitlines() if line}


def test_sacct_shows_a_finished_and_a_failed_job(cluster, tmp_path):
    """Issue #48 item 5: sacct answered "Slurm accounting storage is disabled". Now it has each job's state,
    exit code and (a step that held 200 MB for 3 s) its peak memory; the job user reads it too."""
    work = cluster.workdir("sacct-")
    ids = {}
    for name, body in (("fine", "srun python3 -c 'import time; x = bytearray(200 << 20); time.sleep(3)'"),
                       ("broken", "echo doing; exit 3")):
        ids[name] = subprocess.run(["sbatch", "--parsable", f"--job-name={name}", f"--chdir={work}",
                                    "--output=/dev/null", "--wrap", body], capture_output=True, text=True, check=True,
                                   **cluster.as_job_user).stdout.strip()
    assert cluster.accounted(ids["fine"]) == "COMPLETED" and cluster.accounted(ids["broken"]) == "FAILED"
    fine, broken = _sacct(ids["fine"]), _sacct(ids["broken"])
    assert fine[ids["fine"]][:3] == ["fine", "COMPLETED", "0:0"], fine
    assert broken[ids["broken"]][:3] == ["broken", "FAILED", "3:0"], broken
    step = fine[f"{ids['fine']}.0"]
    assert step[1] == "COMPLETED" and step[3].endswith("K") and int(step[3][:-1]) > 150 * 1024, step
    as_user = _sacct(ids["broken"], **cluster.as_job_user)
    assert as_user[ids["broken"]][:3] == ["broken", "FAILED", "3:0"], as_user


def test_the_database_listens_on_no_port_and_other_users_cannot_reach_it(cluster, other_user):
    """MariaDB runs as mysql with no TCP socket at all; its folder (socket included) is mysql's, 0700."""
    import pwd

    maria = next(d for d in cluster.daemons if d.name == "mariadbd")
    process = psutil.Process(maria.pid)
    assert process.username() == "mysql" and process.net_connections("inet") == []
    st = cluster.db.stat()
    assert st.st_uid == pwd.getpwnam("mysql").pw_uid and st.st_mode & 0o777 == 0o700
    denied = subprocess.run(["runuser", "-u", other_user.pw_name, "--", "ls", str(cluster.db)], capture_output=True,
                            text=True)
    assert denied.returncode != 0 and "Permission denied" in denied.stderr


def _last_job_id() -> int:
    out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True, text=True).stdout.split()
    return max(map(int, out), default=0)


def _port(cluster) -> str:
    return next(line.split("=")[1] for line in cluster.conf.read_text().splitlines()
                if line.startswith("SlurmctldPort="))


def test_other_users_cannot_use_the_cluster(cluster, other_user):
    """Another uid (a real second user, and nobody) can get no munge credential from this cluster's munged
    (so no daemon of it will answer that uid), nor read its key or configuration; its job user can."""
    sock = Path(next(part.split("=", 1)[1] for part in cluster.conf.read_text().split()
                     if part.startswith("AuthInfo=")).split(",")[0].removeprefix("socket="))
    assert subprocess.run(["munge", "-n", "-S", str(sock)], capture_output=True).returncode == 0
    assert subprocess.run(["runuser", "-u", cluster.user, "--", "munge", "-n", "-S", str(sock)],
                          capture_output=True).returncode == 0
    for who in (["runuser", "-u", other_user.pw_name, "--"], ["setpriv", "--reuid=65534", "--regid=65534",
                                                               "--clear-groups"]):
        denied = subprocess.run([*who, "munge", "-n", "-S", str(sock)], capture_output=True, text=True)
        assert denied.returncode != 0 and "Permission denied" in denied.stderr
        for secret in (cluster.folder / "munge" / "munge.key", cluster.conf):
            assert subprocess.run([*who, "cat", str(secret)], capture_output=True).returncode != 0


def test_jobs_run_as_the_job_user_never_as_root(cluster):
    """A job's processes run as the cluster's job user (here the dedicated account: no SUDO_USER in CI);
    root itself may not run a job on this cluster at all (DisableRootJobs)."""
    import pwd

    assert cluster.user == "distlab-job" and pwd.getpwnam(cluster.user).pw_uid != 0
    res = slurm.submit(slurm_jobs.whoami, ranks_per_node=2, view=None)
    uid = pwd.getpwnam(cluster.user).pw_uid
    assert res.returns == {0: (uid, uid), 1: (uid, uid)}
    assert res.run_dir.stat().st_uid == uid and res.run_dir.parent == cluster.jobs
    assert slurm.attach(res.job_id).run_dir == res.run_dir
    refused = subprocess.run(["sbatch", "--wrap", "id -u"], capture_output=True, text=True, cwd=cluster.jobs)
    assert refused.returncode != 0, "root could submit a job"
    # the job user owns its run folder but cannot swap it for something else under root's feet
    swap = subprocess.run(["runuser", "-u", cluster.user, "--", "mv", str(res.run_dir), str(res.run_dir) + ".x"],
                          capture_output=True, text=True)
    assert swap.returncode != 0 and res.run_dir.is_dir()


def test_another_user_cannot_enter_the_jobs_folders(cluster, other_user):
    res = slurm.submit(slurm_jobs.whoami, view=None)
    for path in (cluster.door, res.run_dir, cluster.workdir()):
        done = subprocess.run(["runuser", "-u", other_user.pw_name, "--", "ls", str(path)], capture_output=True)
        assert done.returncode != 0, f"{other_user.pw_name} could list {path}"



def test_the_spool_is_entered_not_listed_once_slurmd_runs(cluster):
    """slurmd keeps each job's batch script in a folder of the job's user in its spool: the spool
    itself stays 0711 after slurmd started (it may make it 0755), so the door's group cannot list jobs."""
    assert cluster.door.stat().st_mode & 0o777 == 0o710
    assert (cluster.door / "spool").stat().st_mode & 0o777 == 0o711


SHARER = "distlab-share-gid"  # an account whose primary group is the job user's
DUPLICATE = "distlab-dup-gid"  # a second /etc/group entry with the job user's gid


@pytest.fixture
def job_users_gid_shared(cluster, other_user):
    """The job user's gid given to two more users: another account's primary group, and the other user's
    supplementary group through a second /etc/group entry with that gid (as LDAP would). Removed after."""
    gid = pwd.getpwnam(cluster.user).pw_gid
    try:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "-g", str(gid),
                        SHARER], capture_output=True, check=True)
        subprocess.run(["groupadd", "--non-unique", "--gid", str(gid), DUPLICATE], capture_output=True, check=True)
        subprocess.run(["usermod", "--append", "--groups", DUPLICATE, other_user.pw_name], capture_output=True,
                       check=True)
        yield [SHARER, other_user.pw_name]
    finally:
        subprocess.run(["gpasswd", "--delete", other_user.pw_name, DUPLICATE], capture_output=True)
        subprocess.run(["groupdel", "--force", DUPLICATE], capture_output=True)
        subprocess.run(["userdel", SHARER], capture_output=True)


def test_whoever_else_has_the_job_user_s_gid_cannot_use_the_cluster(cluster, job_users_gid_shared):
    """Issue #58 item 2: the door was root:<the job user's group> 0710 and the check listed that group's members
    only, so a user in a second /etc/group entry with the same gid got munge credentials, sinfo and sbatch.
    The door's ACL lets the job user alone in: neither a sharer of its primary group nor that user passes."""
    sock = cluster.door / "munge.sock"
    assert subprocess.run(["runuser", "-u", cluster.user, "--", "munge", "-n", "-S", str(sock)],
                          capture_output=True).returncode == 0
    for name in job_users_gid_shared:
        who = ["runuser", "-u", name, "--"]
        assert pwd.getpwnam(cluster.user).pw_gid in os.getgrouplist(name, pwd.getpwnam(name).pw_gid)
        denied = subprocess.run([*who, "munge", "-n", "-S", str(sock)], capture_output=True, text=True)
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, (name, denied.stderr)
        for path in (cluster.conf, cluster.door / "task-prolog"):
            assert subprocess.run([*who, "cat", str(path)], capture_output=True).returncode != 0, (name, path)
        assert subprocess.run([*who, "ls", str(cluster.jobs)], capture_output=True).returncode != 0, name


@pytest.mark.parametrize("mode", ["torchrun", "tasks"])
def test_a_one_node_job_hosts_no_store_on_a_port(cluster, mode):
    """torchrun's c10d store (and rank 0's TCPStore in tasks mode) listened on every interface, and
    torchrun's agent unpickles what it reads there: on one node the ranks meet in the run folder."""
    res = slurm.submit(slurm_jobs.listeners, ranks_per_node=2, mode=mode, view=None)
    assert res.returns[0]["sum"] == 2.0
    assert res.returns[0]["listeners"] == [] and res.returns[1]["listeners"] == []
    assert (res.run_dir / "stores").is_dir(), "the ranks did not meet in the run folder"


def test_no_daemon_port_is_reachable_from_the_host_s_network(cluster, other_user):
    """Issue #58 item 3: slurmdbd (like slurmctld and slurmd) listened on a loopback port any local user could
    reach, or take first. On this host they run in the cluster's private network: no port of theirs exists in
    the host's, where the notebook's commands reach them through the login shims; there they bind loopback only."""
    inside = {d.name: d.pid for d in cluster.daemons if d.name in ("slurmctld", "slurmd", "slurmdbd")}
    assert sorted(inside) == ["slurmctld", "slurmd", "slurmdbd"]
    host_net = os.stat("/proc/self/ns/net").st_ino
    assert all(os.stat(f"/proc/{pid}/ns/net").st_ino != host_net for pid in inside.values()), inside
    theirs = set().union(*(daemons_module.socket_inodes(pid) for pid in inside.values()))
    tables = [Path(t).read_text() for t in daemons_module.TCP_TABLES]
    for port in cluster.ports.values():
        assert not daemons_module.listening_inodes(port, tables) & theirs, port
    listening = subprocess.run([*cluster.net.command(["ss", "-Htlnp"])], capture_output=True, text=True).stdout
    bound = {line.split()[3] for line in listening.splitlines() if "slurm" in line}
    assert bound == {f"127.0.0.1:{port}" for port in cluster.ports.values()}, listening
    assert subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True).stdout.strip() == "idle"


SQUAT = """import select, socket, time
held = [socket.socket() for _ in range(3)]
for s in held:
    s.bind(("127.0.0.1", 0))
    s.listen()
print(*[s.getsockname()[1] for s in held], flush=True)
end = time.monotonic() + 120
while time.monotonic() < end:
    for s in select.select(held, [], [], 1)[0]:
        print("GOT", s.getsockname()[1], flush=True)
        s.accept()[0].close()
"""


def test_where_namespaces_are_refused_a_squatted_port_gets_no_probe(cluster, other_user, monkeypatch, tmp_path):
    """Issue #58 item 3, where namespaces are refused (a container; here the private network is switched off):
    another user binds the ports picked for slurmctld, slurmd and slurmdbd before the daemons do. Nothing is
    sent there (root's readiness probe carries a munge credential): each daemon starts again on a new port
    once another process is found listening on its own. This second cluster names its job user (``user=``)."""
    from second_user import other_python, start_as_other, stop_other, write_readable

    squat = write_readable(Path(tempfile.mkdtemp(prefix="distlab-squat-", dir=world_traversable_tmp())), "squat.py",
                           SQUAT)
    squat.parent.chmod(0o755)
    squatter = start_as_other(f"{other_python()} {squat}")
    try:
        taken = [int(p) for p in squatter.stdout.readline().split()]
        ports = iter(taken)  # the first three ports picked: slurmctld's, slurmd's, then slurmdbd's
        real = starting.free_port
        monkeypatch.setattr(starting, "free_port", lambda: next(ports, None) or real())
        monkeypatch.setattr(starting.privnet, "begin", lambda: None)
        monkeypatch.setattr(cluster_module, "_CURRENT", None)
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
        # (the module's cluster's login shims off PATH: they would send this cluster's commands to that one)
        monkeypatch.setenv("PATH", login.without_bin(os.environ["PATH"], cluster.folder / "bin"))
        second = slurm.local_cluster(root=tmp_path, use_existing=False, user=other_user.pw_name)
        try:
            assert second.running() and second.net is None and second.no_accounting is None
            assert not set(taken) & set(second.ports.values()), (taken, second.ports)
            conf = second.conf.read_text()
            assert f"SlurmctldPort={second.ports['ctld']}" in conf and f"SlurmdPort={second.ports['slurmd']}" in conf
            res = slurm.submit(slurm_jobs.whoami, view=None)
            assert res.returns == {0: (other_user.pw_uid, other_user.pw_uid)}
            assert cluster_module.accounted(res.job_id, second.env) == "COMPLETED"
        finally:
            second.stop()
    finally:
        output = stop_other(squatter)
        shutil.rmtree(squat.parent, ignore_errors=True)
    assert "GOT" not in output, f"a probe reached the squatter: {output} (taken: {taken}, ctld, slurmd, slurmdbd)"


def test_daemons_get_no_token_of_the_notebook_and_no_open_tmpdir(other_user, monkeypatch, tmp_path, capfd):
    """Issue #58 items 4 and 1. A token in root's environment was in MariaDB's /proc/<pid>/environ (a daemon
    running as ``mysql``), and in every other daemon's: each now starts with a minimal environment. A $TMPDIR
    without the sticky bit let another user rename the database folder and plant a listening socket in its
    place: the door and the database folder go to a root-owned sticky temp dir instead, and the cluster says so."""
    from second_user import as_other

    open_tmp = Path(tempfile.mkdtemp(prefix="distlab-open-tmp-", dir=world_traversable_tmp()))
    open_tmp.chmod(0o777)  # (as some learners' TMPDIR is)
    try:
        (open_tmp / "victim").mkdir()  # root's, like the database folder: another user renames it there
        assert as_other(f"mv {open_tmp}/victim {open_tmp}/taken").returncode == 0
        monkeypatch.setenv("TMPDIR", str(open_tmp))
        monkeypatch.setenv("DISTLAB_TEST_TOKEN", "token-of-the-notebook")
        monkeypatch.setattr(cluster_module, "_CURRENT", None)
        monkeypatch.delenv("SLURM_CONF", raising=False)
        monkeypatch.setenv("PATH", os.environ["PATH"])  # (put back after: this cluster puts its login shims first)
        started = slurm.local_cluster(root=tmp_path, use_existing=False)
        try:
            assert not started.door.is_relative_to(open_tmp) and not started.db.is_relative_to(open_tmp)
            assert f"TMPDIR={open_tmp} is not sticky" in capfd.readouterr().err
            assert sorted(d.name for d in started.daemons) == ["mariadbd", "munged", "slurmctld", "slurmd", "slurmdbd"]
            for d in started.daemons:
                environ = Path(f"/proc/{d.pid}/environ").read_bytes()
                assert b"token-of-the-notebook" not in environ, (d.name, environ)
        finally:
            started.stop()
    finally:
        shutil.rmtree(open_tmp, ignore_errors=True)


def one_task(tmp_path, code: str, single_node: bool = True):
    """(run folder, target, env) for ``python -m distlab.slurm.rank target`` as one task of a one-node job (or,
    ``single_node=False``, of a job on several nodes), without a cluster: what sbatch's script and srun would
    have set up."""
    from distlab.folders.runfolder import RunFolder

    root = tmp_path / "runs"
    root.mkdir(mode=0o700)
    folder = RunFolder.create("slurm-task", root)
    (folder.path / "run.json").write_text(json.dumps({"run_dir": str(folder.path), "parent_pid": 0,
                                                      "single_node": single_node, "sys_path": [],
                                                      "plain_python": False}))
    target = tmp_path / "target.py"
    target.write_text(code)
    env = {**os.environ, "DISTLAB_RUN_DIR": str(folder.path), "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
           "PYTHONPATH": str(Path(slurm.__file__).parents[2])}
    return folder, target, env


def test_a_rank_gets_a_private_temp_folder_whatever_tmpdir_says(tmp_path, shared_tmp):
    """A cluster (or a user's shell) may hand tasks TMPDIR=/tmp: the rank's tempfile (torch's
    pytorch-errorfile-*.pickle, read back by its launcher) must still go to a private folder."""
    folder, target, env = one_task(tmp_path, "import tempfile; print('TMP', tempfile.gettempdir())\n")
    env["TMPDIR"] = str(shared_tmp)
    done = subprocess.run([sys.executable, "-m", "distlab.slurm.rank", str(target)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    log = (folder.path / "logs" / "attempt0" / "rank0.out").read_text()
    assert done.returncode == 0, log + done.stderr
    used = Path(log.split("TMP ")[1].split()[0])
    assert used.is_relative_to(folder.path) and used.stat().st_uid == os.geteuid()
    assert used.stat().st_mode & 0o777 == 0o700


WARNED_AT_EVERY_MOMENT = """import signal, time
got = []
time.sleep(0.3)                   # still starting (importing torch): a warning now is held
signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
time.sleep(0.3)                   # training: a warning now reaches the handler
print("warnings handled:", bool(got), flush=True)
"""                               # and exiting: a warning now (Python has reset the handler) is held again


def test_a_warning_at_any_moment_of_a_slurm_rank_is_handled_or_held_never_fatal(tmp_path):
    """Slurm's warning (``--signal=USR1@T``) reaches every process of the step, once per attempt, at any moment.
    In CI a rank that had finished its steps got it while exiting, after Python had reset its handler to the
    default: it died (exit 138) and failed the job. Here SIGUSR1 goes to the step's processes
    (``distlab.slurm.rank`` and its rank) without pause, from the moment the rank starts until both have exited."""
    folder, target, env = one_task(tmp_path, WARNED_AT_EVERY_MOMENT)
    step = subprocess.Popen([sys.executable, "-m", "distlab.slurm.rank", str(target)], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not psutil.Process(step.pid).children() and step.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        sent = 0
        while step.poll() is None:
            try:
                os.killpg(step.pid, signal.SIGUSR1)
                sent += 1
            except ProcessLookupError:
                break
            time.sleep(0.0002)
        out = step.communicate(timeout=60)[0]
    finally:
        if step.poll() is None:
            step.kill()
    log = (folder.path / "logs" / "attempt0" / "rank0.out").read_text()
    assert sent > 100, sent
    assert step.returncode == 0, (step.returncode, out, log)
    assert "warnings handled: True" in log


COUNTED = """import signal, sys, time
got = []
signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
print("handler ready", flush=True)
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    time.sleep(0.05)
print("warnings handled:", len(got), flush=True)
"""


def _blocks(pid: int, sig: int) -> bool:
    """Whether ``pid``'s main thread has ``sig`` blocked (``SigBlk`` in /proc/PID/status)."""
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("SigBlk:"))
    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)


@pytest.mark.parametrize("when", ["before the ranks exist", "to every process, once the ranks run"])
def test_a_warning_reaches_each_torchrun_rank_exactly_once_whenever_it_comes(tmp_path, when):
    """Slurm's controller sends the warning at its first time-limit check within 30 s of the warning time: with
    ``--time=1 --signal=USR1@50``, at any moment of an attempt, also while torchrun's agents still import torch
    and meet, before any rank exists. In CI such a warning stayed pending in the agent (which holds it blocked)
    and the job ran to its end in one attempt. Here the chain a job on several nodes runs (distlab.slurm.bound's
    torchrun, distlab.slurm.rank, the rank) gets SIGUSR1 either at the agent alone, as soon as the agent
    holds it and long before it starts its ranks, or at every process once both ranks run, as Slurm sends it
    then. Either way each rank's handler runs exactly once."""
    from distlab.rendezvous.loopback import bind_loopback

    folder, target, env = one_task(tmp_path, COUNTED, single_node=False)  # torchrun sets RANK: SLURM_* unread
    env["GLOO_SOCKET_IFNAME"] = "lo"
    free = bind_loopback()
    port = free.getsockname()[1]
    free.close()
    agent = subprocess.Popen([sys.executable, "-m", "distlab.slurm.bound", "torchrun", "--nnodes", "1",
                              "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                              f"127.0.0.1:{port}", "-m", "distlab.slurm.rank", str(target), "6"],
                             env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    logs = [folder.path / "logs" / "attempt0" / f"rank{r}.out" for r in (0, 1)]
    try:
        deadline = time.monotonic() + 60
        if when.startswith("before"):
            while not _blocks(agent.pid, signal.SIGUSR1) and time.monotonic() < deadline:
                time.sleep(0.001)
            os.kill(agent.pid, signal.SIGUSR1)
            assert not psutil.Process(agent.pid).children(), "the ranks exist already: the test is moot"
        else:
            while not all(p.exists() and "handler ready" in p.read_text() for p in logs) \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            everyone = psutil.Process(agent.pid)  # Slurm signals every process of the step, not a group
            for p in [everyone, *everyone.children(recursive=True)]:
                p.send_signal(signal.SIGUSR1)
        out = agent.communicate(timeout=120)[0]
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
    texts = [p.read_text() if p.exists() else "" for p in logs]
    assert agent.returncode == 0, (out, texts)
    assert all("warnings handled: 1" in t for t in texts), texts


def _listening(pid: int) -> set[str]:
    return {c.laddr.ip for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def test_a_multi_node_store_listens_on_the_endpoint_address_only():
    """Several nodes must meet over the network, but torch's stores bind every interface: distlab.slurm.bound
    binds torchrun's c10d store and rank 0's env:// store to the endpoint's address (here 127.0.0.1)."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import RendezvousParameters, c10d_rendezvous_backend

    from distlab.rendezvous.loopback import bind_loopback
    from distlab.slurm import bound

    plain = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=5))
    assert _listening(os.getpid()) - {"127.0.0.1"}, "torch's own store is bound to one address: test is moot"
    del plain
    rendezvous = sys.modules["torch.distributed.rendezvous"]
    saved = (c10d_rendezvous_backend.TCPStore, rendezvous.TCPStore)
    try:
        bound.patch(c10d_rendezvous_backend)
        bound.patch(c10d_rendezvous_backend)  # idempotent
        free = bind_loopback()
        port = free.getsockname()[1]
        free.close()
        params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{port}", run_id="t", min_nodes=1,
                                      max_nodes=1, is_host=True)
        backend, store = c10d_rendezvous_backend.create_backend(params)
        assert _listening(os.getpid()) == {"127.0.0.1"}
        store.set("k", "v")
        assert dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5)).get("k") == b"v"
        del backend, store
        bound.patch(rendezvous)
        store = rendezvous._create_c10d_store("127.0.0.1", 0, 0, 1, timedelta(seconds=5))
        assert _listening(os.getpid()) == {"127.0.0.1"}
        del store
    finally:
        c10d_rendezvous_backend.TCPStore, rendezvous.TCPStore = saved


LISTENERS = """import os, psutil, torch.distributed as dist
dist.init_process_group("gloo")
for who in (psutil.Process(), psutil.Process().parent()):
    print("LISTEN", who.pid, sorted({c.laddr.ip for c in who.net_connections("tcp") if c.status == "LISTEN"}))
dist.destroy_process_group()
"""


def test_multi_node_entry_points_bind_their_stores(tmp_path):
    """The commands a multi-node job runs (torchrun through distlab.slurm.bound; a tasks-mode rank through
    distlab.slurm.rank), run here as one node: no store or agent listens beyond the endpoint's address."""
    from distlab.folders.runfolder import RunFolder
    from distlab.rendezvous.loopback import bind_loopback

    target = tmp_path / "target.py"
    target.write_text(LISTENERS)
    free = bind_loopback()
    port = free.getsockname()[1]
    free.close()
    env = {**os.environ, "PYTHONPATH": str(Path(slurm.__file__).parents[2]), "GLOO_SOCKET_IFNAME": "lo"}
    done = subprocess.run([sys.executable, "-m", "distlab.slurm.bound", "torchrun", "--nnodes", "1",
                           "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                           f"127.0.0.1:{port}", str(target)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    seen = [line for line in done.stdout.splitlines() if line.startswith("LISTEN")]
    assert done.returncode == 0 and len(seen) == 2, done.stdout + done.stderr
    assert all(line.endswith("['127.0.0.1']") or line.endswith("[]") for line in seen), seen
    assert seen[1].endswith("['127.0.0.1']"), "the agent hosts no store?"
    root = tmp_path / "runs"
    root.mkdir(mode=0o700)
    folder = RunFolder.create("slurm-bound", root)
    (folder.path / "run.json").write_text(json.dumps({"run_dir": str(folder.path), "parent_pid": 0,
                                                      "single_node": False, "sys_path": [], "plain_python": False}))
    env.update(DISTLAB_RUN_DIR=str(folder.path), SLURM_PROCID="0", SLURM_NTASKS="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port))
    done = subprocess.run([sys.executable, "-m", "distlab.slurm.rank", str(target)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    log = (folder.path / "logs" / "attempt0" / "rank0.out").read_text()
    assert done.returncode == 0, log
    rank0 = next(line for line in log.splitlines() if line.startswith("LISTEN"))
    assert rank0.endswith("['127.0.0.1']"), rank0


def _stopped_cluster_folder(tmp_path, account: str) -> Path:
    """What a stopped cluster that created ``account`` leaves for ``stop_folder``: no daemon, its records."""
    folder = tmp_path / "slurm-cluster-x"
    folder.mkdir(mode=0o700, parents=True)
    (folder / "daemons.json").write_text("[]")
    (folder / cluster_module.ACCOUNT_RECORD).write_text(account)
    return folder


def test_a_job_account_the_cluster_made_goes_when_it_stops_unless_another_cluster_uses_it(tmp_path):
    import pwd
    import tempfile

    name = "distlab-job-t"
    made = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--shell",
                           "/usr/sbin/nologin", name], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    other_door = None
    try:
        gid = pwd.getpwnam(name).pw_gid
        other_door = Path(tempfile.mkdtemp(prefix="distlab-slurm-", dir=cluster_module.system_tmp()))
        os.chown(other_door, 0, gid)  # a second cluster's jobs run as this account
        cluster_module.stop_folder(_stopped_cluster_folder(tmp_path / "a", name))
        assert cluster_module.account_exists(name), "removed while another cluster used it"
        other_door.rmdir()
        folder = _stopped_cluster_folder(tmp_path / "b", name)
        cluster_module.stop_folder(folder)
        assert not cluster_module.account_exists(name) and not folder.exists()
    finally:
        if other_door is not None and other_door.exists():
            other_door.rmdir()
        subprocess.run(["userdel", name], capture_output=True)
