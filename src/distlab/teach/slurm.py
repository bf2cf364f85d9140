"""Chapter 13, Slurm: the exercises' self-checks (the lesson itself is in the chapter's cells)."""
from __future__ import annotations

import os
import re
import subprocess

from distlab.teach import answers


def check_rank_mapping(answer, procid: int = 5, tasks_per_node: int = 4) -> bool:
    """Exercise 1: (RANK, LOCAL_RANK, SLURM_NODEID) of task ``procid`` when srun starts one task per rank,
    ``tasks_per_node`` on each node (Slurm's default block distribution fills node 0 first)."""
    if answers.unanswered(answer, "a tuple (RANK, LOCAL_RANK, node)"):
        return False
    expected = (procid, procid % tasks_per_node, procid // tasks_per_node)
    assert tuple(answer) == expected, (
        f"{tuple(answer)} is not it. RANK is SLURM_PROCID itself; tasks fill node 0 first, "
        f"{tasks_per_node} per node, and SLURM_LOCALID counts from 0 on each node.")
    print(f"correct: task {procid} is RANK {expected[0]}, LOCAL_RANK {expected[1]} on node {expected[2]}")
    return True


def check_resume_step(answer, saved_step: int = 37) -> bool:
    """Exercise 2: the first step a resumed attempt reports, after a checkpoint taken with ``saved_step``
    steps done (the script reports each step after finishing it, counting from 1)."""
    if answers.unanswered(answer, "a step number"):
        return False
    assert answer == saved_step + 1, (
        f"{answer} is not it. The checkpoint holds the weights after {saved_step} finished steps and "
        f"step = {saved_step}; the loop adds one before it reports.")
    print(f"correct: nothing is done twice and nothing is skipped: the next attempt reports {saved_step + 1} first")
    return True


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``gpu[07-09,12],cpu3`` -> ``gpu07``."""
    m = re.match(r"^([^\[,]+)(?:\[([^\]]+)\])?", nodelist)
    if not m:
        raise ValueError(f"not a Slurm node list: {nodelist!r}")
    prefix, ranges = m.groups()
    return prefix + (ranges.split(",")[0].split("-")[0] if ranges else "")


def expand_hostlist(nodelist: str) -> list[str]:
    """A Slurm node list's hosts, as ``scontrol show hostnames`` prints them: ``gpu[07-09],cpu3`` -> gpu07 ... cpu3."""
    hosts = []
    for prefix, ranges in re.findall(r"([^,\[]+)(?:\[([^\]]+)\])?,?", nodelist):
        if not ranges:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            hosts += [f"{prefix}{n:0{len(low)}d}" for n in range(int(low), int(high or low) + 1)]
    return hosts


STAND_IN = ('scontrol() {{ if [ "$1 $2" = "show hostnames" ]; then {python} -c "import sys; '
            'from distlab.teach.slurm import expand_hostlist; print(*expand_hostlist(sys.argv[1]), sep=chr(10))" "$3"; '
            'else echo "scontrol $*: {why}" >&2; return 1; fi; }}\n')


def scontrol_cannot_expand() -> str:
    """Why ``scontrol show hostnames`` cannot answer here, or "" where it can. Installed is not enough:
    scontrol reads a slurm.conf even to expand a host list, and with none it asks the site's DNS
    (configless mode) and fails, as for an ordinary user on a machine whose only cluster is the book's."""
    import shutil

    if shutil.which("scontrol") is None:
        return "scontrol is not installed here"
    probe = subprocess.run(["scontrol", "show", "hostnames", "n[1-2]"], capture_output=True, text=True, timeout=20)
    if probe.returncode != 0 or probe.stdout.split() != ["n1", "n2"]:
        return "scontrol finds no slurm.conf here (Slurm is installed, but no cluster is configured)"
    return ""


def check_master_addr(line, nodelist: str = "gpu[07-09],cpu3") -> bool:
    """Exercise 3: a bash line that sets MASTER_ADDR to the first host of SLURM_JOB_NODELIST. It is
    run with bash, with that variable set to ``nodelist`` (``scontrol show hostnames`` needs a slurm.conf,
    not a running controller). Where Slurm is not installed, a bash function answers ``scontrol show
    hostnames`` with the list's expansion, and the check says so."""
    if answers.unanswered(line, "a bash line (a string)"):
        return False
    import sys

    prelude = ""
    why = scontrol_cannot_expand()
    if why:
        print(f"{why}: for this check, a bash function answers `scontrol show hostnames` "
              "with the list's expansion (nothing else of Slurm).")
        prelude = STAND_IN.format(python=sys.executable, why=why)
    env = {**os.environ, "SLURM_JOB_NODELIST": nodelist}
    done = subprocess.run(["bash", "-c", f'{prelude}{line}\necho "$MASTER_ADDR"'], env=env, capture_output=True,
                          text=True, timeout=20)
    first = first_host(nodelist)
    got = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert got == first, (f"your line set MASTER_ADDR to {got!r}, not {first!r} (stderr: {done.stderr.strip()!r}). "
                          "Hint: scontrol show hostnames expands the list, one host per line.")
    print(f"correct: MASTER_ADDR={first}")
    return True


# --- chapter 13: a plain batch script, run here in its CPU form ----------------------------------

def cpu_form(gpu_script: str, environment: list[str], ranks_per_node: int = 1, step_time: float = 0.2,
             num_workers: int = 2) -> str:
    """The GPU batch script of chapter 13 as this CPU cluster runs it. Exactly these lines change: no GPUs
    asked for (``--gpus-per-node``), a fixed ``--nproc-per-node`` for ``gpu`` (torchrun refuses it without
    CUDA), the cores this machine has and one OpenMP thread per core (eight threads on one core run many
    times slower), the software environment (``environment``: the job user's Python instead of
    ``source .../activate``), ``python -m torch.distributed.run``, which is what the ``torchrun`` command
    runs (the notebook's ``torchrun`` script is in a virtual environment the job user may not enter), and
    the training's flags: every batch logged and ``--step-time`` seconds per batch at least, so that a
    warning finds the training still running (this small model trains an epoch in well under a second),
    and ``num_workers`` DataLoader workers per rank instead of the GPU form's 7 (one core per rank here),
    still more than none, so that Slurm's signals reach worker processes here too. Pure."""
    out = []
    for line in gpu_script.splitlines():
        if line.startswith("#SBATCH --gpus-per-node"):
            out.append("# (no GPUs here: " + line.split("#", 2)[1].strip() + ")")
        elif line.startswith("#SBATCH --cpus-per-task"):
            out.append(f"#SBATCH --cpus-per-task={ranks_per_node}")
        elif line.startswith("export OMP_NUM_THREADS="):
            out.append("export OMP_NUM_THREADS=1                          # here: one core per rank")
        elif line.lstrip().startswith("source "):
            out.extend(environment)
        else:
            line = line.replace("--nproc-per-node gpu", f"--nproc-per-node {ranks_per_node}")
            line = line.replace("--log-every 8", f"--log-every 1 --step-time {step_time}")
            line = line.replace("--num-workers 7", f"--num-workers {num_workers}")
            out.append(line.replace("srun --kill-on-bad-exit=1 torchrun",
                                    "srun --kill-on-bad-exit=1 python -m torch.distributed.run"))
    return "\n".join(out) + "\n"

