"""What chapter 13 says of torchrun (torch 2.13): a plain agent dies of SIGUSR1 and leaves its rank running;
with ``--signals-to-handle ...,SIGUSR1`` it passes the signal on, then shuts the rank down after
``--shutdown-timeout``; ``--log-dir`` writes a rank's output only with ``--tee`` or ``--redirects``. No Slurm:
the agent is signalled directly, as Slurm's ``--signal=USR1@T`` would."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

WORKER = '''import os, signal, sys, time
out = sys.argv[1]
signal.signal(signal.SIGUSR1, lambda s, f: open(out + ".signals", "a").write(f"{s}\\n"))
with open(out + ".pid.tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(out + ".pid.tmp", out + ".pid")
while True:
    time.sleep(0.1)
'''


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _agent_and_rank(tmp_path, *options):
    """Start ``torchrun --standalone --nproc-per-node 1 OPTIONS worker.py``; wait until its rank has its handler."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    out = tmp_path / "rank"
    agent = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                              *options, str(worker), str(out)], cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    pid_file = out.with_suffix(".pid")
    deadline = time.monotonic() + 120
    while not pid_file.exists():
        assert agent.poll() is None and time.monotonic() < deadline, agent.stderr and agent.stderr.read()
        time.sleep(0.05)
    return agent, int(pid_file.read_text()), out.with_suffix(".signals")


def _stop(agent, pid: int) -> None:
    if agent.poll() is None:
        agent.kill()
        agent.wait()
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


def test_plain_torchrun_dies_of_sigusr1_and_leaves_its_rank(tmp_path):
    agent, pid, signals = _agent_and_rank(tmp_path)
    try:
        agent.send_signal(signal.SIGUSR1)
        assert agent.wait(timeout=30) == -signal.SIGUSR1      # the default action: the agent is gone
        time.sleep(0.5)
        assert _alive(pid) and not signals.exists()           # its rank runs on, and got nothing from it
    finally:
        _stop(agent, pid)


def test_signals_to_handle_passes_sigusr1_on_then_shuts_the_rank_down(tmp_path):
    agent, pid, signals = _agent_and_rank(tmp_path, "--signals-to-handle", "SIGTERM,SIGUSR1",
                                          "--shutdown-timeout", "2")
    try:
        agent.send_signal(signal.SIGUSR1)
        code = agent.wait(timeout=60)
        assert code not in (0, -signal.SIGUSR1), code          # it lived through it, then ended with an error
        assert signals.read_text().split() == [str(int(signal.SIGUSR1))]   # the rank got it from the agent
        assert not _alive(pid)                                 # and was killed: a warning ends the attempt
    finally:
        _stop(agent, pid)


@pytest.mark.parametrize("option, in_files", [((), False), (("--tee", "3"), True), (("--redirects", "3"), True)])
def test_log_dir_holds_the_ranks_output_only_with_tee_or_redirects(tmp_path, option, in_files):
    (tmp_path / "hello.py").write_text('print("hello from the rank", flush=True)\n')
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                           "--log-dir", str(tmp_path / "logs"), *option, "hello.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    files = [p for p in (tmp_path / "logs").rglob("*") if p.is_file() and "hello from the rank" in p.read_text()]
    assert bool(files) == in_files, files
