"""Functions and scripts the Slurm tests submit (captured from this module like a notebook's cells)."""
import os
import sys
import time

RESUMABLE = '''"""A job that survives requeue: SIGTERM -> checkpoint at the next step -> exit; a restart resumes.

No torch, so the test is about Slurm, not about import time. "Weights" are floats updated each step."""
import json, os, signal, sys, time

import distlab

STEPS, ckpt = int(sys.argv[1]), sys.argv[2]
stop = False
def on_term(signum, frame):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)

step, weights = 0, [1.0, -2.0, 0.5]
if os.path.exists(ckpt):
    state = json.load(open(ckpt))
    step, weights = state["step"], state["weights"]
    print(f"resumed at step {step}", flush=True)
while step < STEPS:
    if stop:
        tmp = ckpt + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"step": step, "weights": weights}, f)
        os.replace(tmp, ckpt)
        print(f"checkpoint at step {step}", flush=True)
        sys.exit(0)
    step += 1
    weights = [w * 0.9 + 0.01 * step for w in weights]
    print(f"step {step}", flush=True)
    distlab.report(step=step, attempt=int(os.environ.get("SLURM_RESTART_COUNT", "0")))
    time.sleep(0.15)
print("final", json.dumps(weights), flush=True)
'''


WARNED = '''"""A job that checkpoints when warned before its time limit (--signal=USR1@T) and requeues itself.

Each rank keeps its own state (no torch: the test is about Slurm). On SIGUSR1 (the warning) or SIGTERM, a
rank saves at the next step and exits; after the warning rank 0 also asks Slurm to requeue the job.
A new attempt resumes from each rank's checkpoint. A rank that has finished saves too: a warning that comes
after it finished but before its job ended (the controller's, late in an attempt) requeues the job, and the next
attempt must not train its steps again."""
import json, os, signal, subprocess, sys, time

import distlab

STEPS, folder = int(sys.argv[1]), sys.argv[2]
rank, attempt = int(os.environ["RANK"]), int(os.environ.get("SLURM_RESTART_COUNT", "0"))
ckpt = os.path.join(folder, f"ckpt{rank}.json")
why = []
signal.signal(signal.SIGUSR1, lambda s, f: why.append("warning"))
signal.signal(signal.SIGTERM, lambda s, f: why.append("SIGTERM"))

step, weights = 0, [1.0, -2.0, 0.5]
if os.path.exists(ckpt):
    state = json.load(open(ckpt))
    step, weights = state["step"], state["weights"]
    print(f"resumed at step {step}", flush=True)
def save():
    with open(ckpt + ".tmp", "w") as f:
        json.dump({"step": step, "weights": weights}, f)
    os.replace(ckpt + ".tmp", ckpt)


while step < STEPS:
    if why:
        save()
        print(f"{why[0]}: checkpoint at step {step}", flush=True)
        if rank == 0 and why[0] == "warning":
            subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=True)
            print("requeued the job", flush=True)
        sys.exit(0)
    step += 1
    weights = [w * 0.9 + 0.01 * step for w in weights]
    distlab.report(step=step, attempt=attempt)
    time.sleep(0.1)
save()
print("final", json.dumps(weights), flush=True)
'''


def reference_weights(steps: int) -> list[float]:
    weights = [1.0, -2.0, 0.5]
    for step in range(1, steps + 1):
        weights = [w * 0.9 + 0.01 * step for w in weights]
    return weights


def hello(rank, ticks):
    for i in range(ticks):
        print(f"tick {i} from rank {rank}", flush=True)
        time.sleep(0.3)
    return {"rank": rank, "world": int(os.environ["WORLD_SIZE"]), "procid": os.environ.get("SLURM_PROCID")}


def fail_on_rank1(rank):
    if rank == 1:
        time.sleep(0.5)
        raise ValueError("rank 1 gives up")
    time.sleep(60)  # a survivor: Slurm must stop it (srun --kill-on-bad-exit)


def wait_forever(rank):
    print(f"rank {rank} waiting", flush=True)
    sys.stdout.flush()
    time.sleep(3600)


def listeners(rank):
    """After the group is up: every TCP listener of this job's processes that is not on loopback."""
    import psutil
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    job, found = os.environ["SLURM_JOB_ID"], []
    for conn in psutil.net_connections("tcp"):
        if conn.status != psutil.CONN_LISTEN or conn.pid is None or conn.laddr.ip.startswith("127."):
            continue
        try:
            p = psutil.Process(conn.pid)
            if p.environ().get("SLURM_JOB_ID") == job and p.environ().get("SLURM_CONF") == os.environ["SLURM_CONF"]:
                found.append(f"{p.name()} {conn.laddr.ip}:{conn.laddr.port}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    dist.barrier()
    return {"sum": t.item(), "listeners": found}


def whoami(rank):
    """The rank's (real uid, effective uid)."""
    return os.getuid(), os.geteuid()
