"""Slurm round trip: a trivial 2-rank job (gloo init, one all_reduce, destroy) on the one-machine cluster.

    distlab.slurm   slurm.submit(trivial.py, ranks_per_node=2): check, write, sbatch, stream every rank's
                    output, collect logs and exit codes
    by hand         the same sbatch script (written by distlab.slurm for a fresh run folder, untimed),
                    then `sbatch --parsable` and `squeue -j ID` every 0.1 s until the job has left the queue

The two alternate in one run (order swapped each round); medians are reported, then where one hand-run
job's time goes: queue + scheduling (sbatch -> RUNNING), step launch (RUNNING -> each rank's runtime up:
srun, torchrun, the rank's interpreter), and the script itself (import torch, c10d rendezvous, all_reduce,
teardown, job end). Last line: `ratio: X` = distlab.slurm / by hand.

Usage: python bench/slurm_roundtrip.py [--rounds 3] [--mode torchrun|tasks]   (root: it starts the cluster)
"""
import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

from distlab import slurm
from distlab.slurm import jobuser, spec
from distlab.slurm.submit import check_job, job_account, prepare_folder, write_files

TRIVIAL = '''import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()}: {t.item()}")
dist.destroy_process_group()
'''
POLL_S = 0.1


def by_distlab(script: Path, mode: str) -> float:
    t0 = time.perf_counter()
    res = slurm.submit(script, ranks_per_node=2, mode=mode, view=None)
    assert res.exit_codes == {0: 0, 1: 0} and "3.0" in res.logs[1], res.logs
    return time.perf_counter() - t0


def prepared(script: Path, mode: str) -> Path:
    """A fresh run folder with the sbatch script distlab.slurm would submit (not timed)."""
    job, prepare = check_job(script, (), 1, 2, mode, 0, None, "00:10:00", None, False, None, (), None,
                                 "spawn", "auto", None)
    job.name = "slurm-by-hand"
    folder, account = prepare_folder(job, prepare, is_file=True)
    script = write_files(folder, job)
    if account is not None:  # the local cluster runs jobs as its job user, never root
        jobuser.hand_over(folder.path, account)
    return script


def by_hand(sbatch: Path) -> tuple[float, dict]:
    account = job_account()
    as_user = {} if account is None else {**jobuser.as_user(account), "cwd": sbatch.parent,
                                          "env": jobuser.job_environment(os.environ, account, sbatch.parent)}
    t0 = time.perf_counter()
    job_id = subprocess.run(["sbatch", "--parsable", str(sbatch)], capture_output=True, text=True, check=True,
                            umask=0o077, **as_user).stdout.strip()
    running = None
    while True:
        state = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout
        if running is None and "RUNNING" in state:
            running = time.perf_counter()
        if not state.strip():
            break
        time.sleep(POLL_S)
    end = time.perf_counter()
    ready = [p.stat().st_mtime for p in (sbatch.parent / "ready").glob("rank*")]
    wall0 = time.time() - (end - t0)
    phases = {"queue + scheduling": (running or end) - t0,
              "step launch": (max(ready) - wall0) - ((running or end) - t0) if ready else float("nan"),
              "script + job end": end - t0 - ((max(ready) - wall0) if ready else 0.0)}
    return end - t0, phases


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mode", default="torchrun", choices=spec.MODES)
    a = p.parse_args()
    cluster = slurm.local_cluster()
    os.chdir(cluster.workdir("slurm-bench-"))  # the job user reads the script here
    script = Path("trivial.py").resolve()
    script.write_text(TRIVIAL)
    ours, hand, phases = [], [], []
    by_distlab(script, a.mode)  # warm-up: first job of a fresh node, page cache
    for k in range(a.rounds):
        for who in (("distlab", "hand") if k % 2 == 0 else ("hand", "distlab")):
            if who == "distlab":
                ours.append(by_distlab(script, a.mode))
            else:
                seconds, split = by_hand(prepared(script, a.mode))
                hand.append(seconds)
                phases.append(split)
        print(f"round {k}: distlab.slurm {ours[-1]:.2f} s, by hand {hand[-1]:.2f} s", flush=True)
    print(f"median distlab.slurm {statistics.median(ours):.2f} s, by hand {statistics.median(hand):.2f} s "
          f"({a.mode} mode, {a.rounds} rounds)")
    for name in phases[0]:
        print(f"  by hand, {name}: {statistics.median(ph[name] for ph in phases):.2f} s")
    print(f"ratio: {statistics.median(ours) / statistics.median(hand):.2f}")


if __name__ == "__main__":
    main()
