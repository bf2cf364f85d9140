"""What a Slurm job's state means (distlab.slurm.jobstate), which slurm.conf a command reads
(distlab.slurm.clientconf), and the checks of submit's arguments (spec.requested): pure, no process."""
from pathlib import Path
from types import SimpleNamespace

import pytest

from distlab.slurm import clientconf, jobstate, layout, spec
from distlab.slurm.errors import NO_CONFIG, SlurmArgumentError, SlurmJobFailedError, SlurmNotFoundError
from distlab.slurm.jobstate import JobState, Seen, follow

RUNNING = JobState("RUNNING", "None", "vm")


# --- one poll against the last -------------------------------------------------------------------------------

def test_the_first_poll_is_a_change_and_the_same_state_again_is_not():
    assert follow(RUNNING, None, 1, 0) == Seen(RUNNING, changed=True, requeued=False)
    assert follow(RUNNING, RUNNING, 1, 0) == Seen(RUNNING, changed=False, requeued=False)
    done = JobState("COMPLETED", exit_code="0:0")
    assert follow(done, RUNNING, 1, 0) == Seen(done, changed=True, requeued=False)


def test_a_job_slurm_does_not_know_is_unknown_before_it_was_seen_and_gone_after():
    assert follow(None, None, 0, 0) == Seen(JobState("UNKNOWN"), changed=True)
    assert follow(JobState("UNKNOWN"), None, 0, 0).state == JobState("UNKNOWN")
    assert follow(None, RUNNING, 1, 0) == Seen(JobState("GONE"), changed=True)
    assert follow(JobState("UNKNOWN"), RUNNING, 1, 0).state == JobState("GONE")
    # once gone, gone stays: no second line
    assert follow(None, JobState("GONE"), 1, 0) == Seen(JobState("GONE"), changed=False)
    # an UNKNOWN with a reason is Slurm's word, not "no record"
    odd = JobState("UNKNOWN", "x")
    assert follow(odd, RUNNING, 1, 0).state == odd


def test_a_new_attempt_folder_is_a_requeue_even_when_the_state_looks_the_same():
    assert follow(RUNNING, RUNNING, 2, 0) == Seen(RUNNING, changed=True, requeued=True)
    assert follow(RUNNING, RUNNING, 2, 1) == Seen(RUNNING, changed=False, requeued=False)  # told already
    assert follow(RUNNING, RUNNING, 3, 1) == Seen(RUNNING, changed=True, requeued=True)
    assert follow(RUNNING, None, 1, 0).requeued is False  # the first attempt is no requeue


@pytest.mark.parametrize("before", ["RUNNING", "COMPLETING"])
def test_waiting_again_after_running_is_a_requeue(before):
    waiting = JobState("PENDING", "BeginTime")
    assert follow(waiting, JobState(before), 1, 0) == Seen(waiting, changed=True, requeued=True)


def test_waiting_first_or_after_another_wait_is_no_requeue():
    waiting = JobState("PENDING", "Priority")
    assert follow(waiting, None, 0, 0) == Seen(waiting, changed=True, requeued=False)
    assert follow(waiting, JobState("PENDING", "Resources"), 0, 0) == Seen(waiting, changed=True, requeued=False)
    assert follow(JobState("RUNNING"), waiting, 1, 0).requeued is False


def test_a_forgotten_job_completed_only_if_every_rank_exited_with_0():
    assert jobstate.gone_state([0, 0]) == JobState("COMPLETED")
    assert jobstate.gone_state([0, 1]) == JobState("FAILED")
    assert jobstate.gone_state([0, None]) == JobState("FAILED")
    assert jobstate.gone_state([]) == JobState("FAILED")


def test_scontrols_fields_give_the_state_with_slurms_exit_code():
    fields = {"JobState": "TIMEOUT", "Reason": "TimeLimit", "NodeList": "vm", "ExitCode": "0:15", "JobId": "4"}
    assert jobstate.controller_state(fields) == JobState("TIMEOUT", "TimeLimit", "vm", "0:15")
    assert jobstate.controller_state({"JobState": "PENDING"}) == JobState("PENDING", "", "", "")
    assert jobstate.controller_state({"Reason": "None"}) is None


def test_squeue_lines_in_every_shape():
    assert jobstate.parse_squeue("  \n") is None
    assert jobstate.parse_squeue("RUNNING\n") == JobState("RUNNING", "", "")
    assert jobstate.parse_squeue("RUNNING|None\nPENDING|Resources|x") == JobState("RUNNING", "None", "")
    assert jobstate.parse_squeue("\n COMPLETED|None|vm") == JobState("COMPLETED", "None", "vm")
    assert jobstate.parse_scontrol("JobId=7 Comment= NodeList=vm") == {"JobId": "7", "Comment": "", "NodeList": "vm"}
    assert jobstate.parse_scontrol("a=1 x=2") == {"a": "1", "x": "2"}
    assert jobstate.parse_scontrol("ab=1") == {"ab": "1"}
    assert jobstate.parse_scontrol("X a/b:c=9") == {"a/b:c": "9"}
    assert jobstate.parse_scontrol("k=v\tTres/Per:N=2") == {"k": "v", "Tres/Per:N": "2"}
    assert jobstate.parse_scontrol("x9=1 9x=2") == {"x9": "1"}


def test_states_describe_themselves():
    assert JobState("PENDING").describe() == "PENDING"
    assert JobState("COMPLETING", nodes="vm").describe() == "COMPLETING on vm"
    assert JobState("RUNNING").describe() == "RUNNING"
    assert JobState("FAILED").describe() == "FAILED"
    assert JobState("RUNNING", exit_code="0:0").describe() == "RUNNING"
    assert JobState("PREEMPTED", exit_code="0:15").describe() == "PREEMPTED (exit code 0:15)"
    assert JobState("REVOKED").finished and JobState("DEADLINE").finished and JobState("SPECIAL_EXIT").finished
    assert JobState("OUT_OF_MEMORY").finished and JobState("BOOT_FAIL").finished
    assert not JobState("REQUEUED").finished and not JobState("GONE").finished
    assert jobstate.SQUEUE_FORMAT == "%T|%r|%N"


# --- which error a job that did not complete raises ------------------------------------------------------------

def test_the_first_rank_that_failed_by_itself_is_the_earliest_positive_exit():
    times = {0: 5.0, 1: 3.0, 2: 4.0, 3: 1.0}
    assert jobstate.first_failed({0: 1, 1: 2, 2: -15, 3: None}, times.get) == 1
    assert jobstate.first_failed({0: 1, 1: 0, 2: -9}, times.get) == 0
    assert jobstate.first_failed({0: 0, 1: -15}, times.get) is None
    assert jobstate.first_failed({}, times.get) is None


def _result(state="FAILED", codes=None, exit_code="1:0", logs=None):
    return SimpleNamespace(job_id=9, state=state, exit_code=exit_code, exit_codes=codes or {0: 3},
                           logs=logs if logs is not None else {0: "a\nb\n"}, run_dir="/runs/x")


def test_a_ranks_failure_shows_its_last_fifteen_lines():
    lines = "".join(f"line {i}\n" for i in range(20))
    e = jobstate.failure_error(_result(codes={0: -15, 1: 4}, logs={1: lines}), 1, ["ignored"])
    assert isinstance(e, SlurmJobFailedError) and e.rank == 1 and e.result.job_id == 9
    assert str(e) == ("distlab.slurm: job 9 ended FAILED (Slurm exit code 1:0); rank 1 failed first (exit code 4).\n"
                      "--- last lines rank 1 printed ---\n" + "\n".join(f"line {i}" for i in range(5, 20)) +
                      "\nRun folder (sbatch script and every rank's log): /runs/x")


def test_a_rank_that_printed_nothing_and_no_exit_code_from_slurm():
    e = jobstate.failure_error(_result(exit_code="", logs={}), 0, [])
    assert str(e) == ("distlab.slurm: job 9 ended FAILED (Slurm exit code ?); rank 0 failed first (exit code 3).\n"
                      "--- last lines rank 0 printed ---\n(nothing)\n"
                      "Run folder (sbatch script and every rank's log): /runs/x")


@pytest.mark.parametrize(("state", "why"), [
    ("TIMEOUT", " (its time limit, --time)"), ("CANCELLED", " (scancel, by you or an administrator)"),
    ("NODE_FAIL", " (a node failed)"), ("PREEMPTED", " (preempted by a job of higher priority)"),
    ("OUT_OF_MEMORY", " (a task ran out of memory)"), ("FAILED", "")])
def test_a_job_slurm_ended_says_why_with_the_batch_scripts_last_ten_lines(state, why):
    tail = [f"b{i}" for i in range(12)]
    e = jobstate.failure_error(_result(state=state, exit_code="0:15"), None, tail)
    assert e.rank is None and e.result.state == state
    assert str(e) == (f"distlab.slurm: job 9 ended {state} (Slurm exit code 0:15){why}.\n"
                      "--- last lines of the batch script's output ---\n" + "\n".join(tail[2:]) +
                      "\nRun folder (sbatch script and every rank's log): /runs/x")


def test_a_job_slurm_ended_without_output_or_exit_code():
    e = jobstate.failure_error(_result(state="CANCELLED", exit_code=""), None, [])
    assert "(Slurm exit code ?)" in str(e) and "--- last lines of the batch script's output ---\n(nothing)\n" in str(e)


# --- attach: which record ------------------------------------------------------------------------------------

def test_attach_takes_the_record_under_the_current_slurm_conf_then_the_newest():
    a = {"job_id": 5, "submitted": 10.0, "slurm_conf": "/c/one"}
    b = {"job_id": 5, "submitted": 20.0, "slurm_conf": "/c/two"}
    other = {"job_id": 6, "submitted": 30.0, "slurm_conf": "/c/one"}
    assert jobstate.newest_record([a, b, other], 5, "/c/one") is a
    assert jobstate.newest_record([a, b, other], "5", "/c/two") is b
    assert jobstate.newest_record([a, b, other], 5, None) is b
    assert jobstate.newest_record([a, b], 6, "/c/one") is None
    assert jobstate.newest_record([{"submitted": 1.0}], 5, None) is None
    assert jobstate.newest_record([], 5, None) is None


# --- which slurm.conf ----------------------------------------------------------------------------------------

@pytest.fixture
def defaults(tmp_path, monkeypatch):
    paths = (tmp_path / "etc.conf", tmp_path / "run.conf")
    monkeypatch.setattr(clientconf, "DEFAULT_CONFS", tuple(map(str, paths)))
    return paths


def test_slurm_conf_when_set_wins_if_it_exists(defaults, tmp_path):
    named = tmp_path / "mine.conf"
    defaults[0].write_text("x")
    assert clientconf.config_file({"SLURM_CONF": str(named)}) is None
    named.write_text("x")
    assert clientconf.config_file({"SLURM_CONF": str(named)}) == str(named)
    assert clientconf.config_file({"SLURM_CONF": str(tmp_path)}) is None  # a folder is no file
    assert clientconf.config_file({"SLURM_CONF": ""}) == str(defaults[0])  # empty: as unset


def test_without_slurm_conf_the_first_default_that_exists(defaults):
    assert clientconf.config_file({}) is None
    defaults[1].write_text("x")
    assert clientconf.config_file({}) == str(defaults[1])
    defaults[0].write_text("x")
    assert clientconf.config_file({}) == str(defaults[0])


def test_the_environment_read_is_os_environ_unless_given(defaults, tmp_path, monkeypatch):
    named = tmp_path / "env.conf"
    named.write_text("x")
    monkeypatch.setenv("SLURM_CONF", str(named))
    monkeypatch.setenv("KEEP", "1")
    assert clientconf.config_file() == str(named)
    env = clientconf.client_env()
    assert env["SLURM_CONF"] == str(named) and env["KEEP"] == "1"


def test_client_env_sets_the_file_found_or_refuses(defaults):
    defaults[1].write_text("x")
    assert clientconf.client_env({"A": "b"}) == {"A": "b", "SLURM_CONF": str(defaults[1])}
    defaults[1].unlink()
    with pytest.raises(SlurmNotFoundError) as info:
        clientconf.client_env({"SLURM_CONF": "/gone.conf"})
    assert str(info.value) == NO_CONFIG.format(conf="/gone.conf", defaults=" and ".join(map(str, defaults)))


# --- submit's arguments --------------------------------------------------------------------------------------

GOOD = dict(nodes=2, ranks_per_node=3, gpus_per_node=1, cpus_per_task=4, time_limit="00:05:00", mode="tasks",
            requeue=1, signal="USR1@60", extra=["--mem=4G"], python=Path("/py"), import_path=Path("/src"),
            workdir=Path("/w"))


def test_submits_arguments_become_the_job_asked_for():
    job = spec.requested(**GOOD)
    assert (job.nodes, job.ranks_per_node, job.gpus_per_node, job.cpus_per_task) == (2, 3, 1, 4)
    assert (job.time, job.mode, job.requeue, job.signal, job.extra) == ("00:05:00", "tasks", True, "USR1@60",
                                                                         ["--mem=4G"])
    assert (job.python, job.import_path, job.workdir) == (Path("/py"), Path("/src"), Path("/w"))
    assert (job.target, job.run_dir) == (Path("."), Path("."))
    assert job.world_size == 6 and job.requeue is True
    bare = spec.requested(**{**GOOD, "gpus_per_node": 0, "cpus_per_task": None, "requeue": 0, "signal": None,
                             "extra": ()})
    assert (bare.gpus_per_node, bare.cpus_per_task, bare.requeue, bare.signal, bare.extra) == (0, None, False, None, [])


@pytest.mark.parametrize(("argument", "value", "named"), [
    ("nodes", 0, "nodes=0: must be an integer >= 1"),
    ("ranks_per_node", 0, "ranks_per_node=0: must be an integer >= 1"),
    ("gpus_per_node", -1, "gpus_per_node=-1: must be an integer >= 0"),
    ("cpus_per_task", 0, "cpus_per_task=0: must be an integer >= 1"),
    ("time_limit", "soon", "time='soon': is not a Slurm time limit"),
    ("mode", "mpi", "mode='mpi': must be one of"),
    ("signal", "USR1 now", "signal='USR1 now': is not"),
    ("extra", ["mem=4G"], "extra='mem=4G': is not one sbatch option")])
def test_each_wrong_argument_is_named(argument, value, named):
    with pytest.raises(SlurmArgumentError) as info:
        spec.requested(**{**GOOD, argument: value})
    assert f"distlab.slurm: invalid {named}" in str(info.value)


def test_the_style_and_a_scripts_command_line():
    assert spec.check_style("spawn") == "spawn" and spec.check_style("launch") == "launch"
    with pytest.raises(SlurmArgumentError) as info:
        spec.check_style("fork")
    assert str(info.value) == ("distlab.slurm: invalid style='fork': must be \"spawn\" (fn(rank, *args)) or "
                               "\"launch\" (fn(*args)).")
    assert spec.script_args("--epochs 2  --lr\t0.1") == ("--epochs", "2", "--lr", "0.1")
    assert spec.script_args(["--epochs", 2]) == ("--epochs", "2")
    assert spec.script_args(()) == ()


def test_a_job_folders_name_keeps_what_a_file_name_may_hold():
    assert layout.folder_prefix("slurm-train_v1.2", "20261207-020000") == "20261207-020000-slurm-train_v1.2-"
    assert layout.folder_prefix("a b/c", "t") == "t-a_b_c-"
    assert layout.folder_prefix("", "t") == "t-run-"
    assert layout.folder_prefix("x" * 50, "t") == "t-" + "x" * 40 + "-"
    assert layout.folder_prefix("Zz09", "t") == "t-Zz09-"


def test_a_ranks_last_lines_keep_its_leading_blank_lines_and_drop_trailing_ones():
    e = jobstate.failure_error(_result(logs={0: "\n\nx\n\n\n"}), 0, [])
    assert "--- last lines rank 0 printed ---\n\n\nx\nRun folder" in str(e)


def test_client_env_reads_the_environment_it_is_given_not_os_environ(defaults, tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    named = tmp_path / "given.conf"
    named.write_text("x")
    assert clientconf.client_env({"SLURM_CONF": str(named)}) == {"SLURM_CONF": str(named)}
