"""What a Slurm job of distlab's is, checked, and the sbatch script it becomes. Pure: no process runs here.

Two ways to start the ranks inside the allocation:

* ``mode="torchrun"``: ``srun`` starts one ``torchrun`` agent per node; the agents meet in a c10d
  rendezvous on the first node of the allocation and start ``ranks_per_node`` ranks each (RANK,
  LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT set by torchrun). Restarts and a dead rank's survivors
  are torchrun's business.
* ``mode="tasks"``: ``srun`` starts one task per rank; :mod:`distlab.slurm.rank` turns Slurm's
  SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS into RANK / LOCAL_RANK / WORLD_SIZE, and the script
  exports MASTER_ADDR/MASTER_PORT for ``init_process_group``'s ``env://``.

Either way every rank runs as ``python -m distlab.slurm.rank TARGET ARGS``, which writes the rank's
output to the run folder (where the notebook reads it live) and runs TARGET as ``__main__``.

**One node: no rendezvous port.** torchrun's c10d store listens on every interface with no
authentication, and torch's agent unpickles the rendezvous state it reads from it on every
keep-alive: whoever can reach the port runs code as the job's user. A rank of ``mode="tasks"``
hosting ``init_process_group``'s TCPStore on ``*:port`` is the same kind of opening. So a job on
one node never hosts a TCP store: its ranks meet the way :func:`distlab.spawn`'s do, in a
``FileStore`` inside the (private) run folder (``single_node`` in ``run.json``; ``MASTER_PORT`` is
a placeholder nothing listens on). In ``mode="torchrun"`` the per-node agent is then distlab's own
(``python -m distlab.slurm.rank --nproc-per-node N``: it starts the node's ranks, stops the others
when one fails, passes signals on) instead of torchrun, whose every rendezvous backend hosts a TCP
store. Jobs on several nodes must meet over the network, so they trust it (as torchrun and
``run_script(nnodes>1)`` do): use them among machines and a network you trust. Their store then
listens only on the first node's address as the nodes resolve it (:mod:`distlab.slurm.bound`), not
on the node's other interfaces.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SlurmArgumentError

MODES = ("torchrun", "tasks")
TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")
NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
OPTION = re.compile(r"^--[a-z][a-z0-9-]*(=\S.*)?$")


@dataclass
class JobSpec:
    """Everything the sbatch script says. ``target`` is the Python file every rank runs."""

    target: Path
    run_dir: Path
    python: Path
    import_path: Path  # the folder distlab is imported from, for PYTHONPATH on the nodes
    site_paths: tuple[str, ...] = ()  # the notebook's site-packages, when the job runs another Python of its version
    target_args: tuple[str, ...] = ()
    name: str = "distlab"
    nodes: int = 1
    ranks_per_node: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    time: str = "00:10:00"
    partition: str | None = None
    mode: str = "torchrun"
    requeue: bool = False
    signal: str | None = None
    workdir: Path | None = None
    extra: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def single_node(self) -> bool:
        """One node: the ranks meet in a FileStore in the run folder, no port (see the module docstring)."""
        return self.nodes == 1


def positive(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SlurmArgumentError(name, value, f"must be an integer >= {minimum}")
    return value


def check_time(value) -> str:
    """Slurm's time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (an int: minutes)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)
    if not isinstance(value, str) or not TIME.match(value):
        raise SlurmArgumentError("time", value, "is not a Slurm time limit",
                                 'Write minutes (10), "MM:SS", "HH:MM:SS" or "D-HH:MM:SS".')
    return value


def check_name(value) -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise SlurmArgumentError("name", value, "must be 1-64 letters, digits, '_', '.', '+' or '-'")
    return value


def check_extra(lines) -> list[str]:
    """Extra ``#SBATCH`` options: ``"--mem=4G"`` or ``"#SBATCH --mem=4G"``, one option per item."""
    if isinstance(lines, str):
        lines = [lines]
    out = []
    for line in lines or []:
        option = line.removeprefix("#SBATCH").strip() if isinstance(line, str) else line
        if not isinstance(option, str) or "\n" in option or not OPTION.match(option):
            raise SlurmArgumentError("extra", line, "is not one sbatch option",
                                     'Give each as "--option=value" (e.g. "--mem=4G").')
        out.append(option)
    return out


def check_signal(value) -> str | None:
    """``--signal``'s ``[B:]SIG[@seconds]`` (e.g. ``"USR1@60"``)."""
    if value is None or (isinstance(value, str) and re.match(r"^([RB]:)?(SIG)?[A-Z0-9]+(@\d+)?$", value)):
        return value
    raise SlurmArgumentError("signal", value, "is not [B:]SIGNAL[@seconds]", 'For example "USR1@60".')


def check_mode(value) -> str:
    if value not in MODES:
        raise SlurmArgumentError("mode", value, f"must be one of {', '.join(map(repr, MODES))}")
    return value


def check_partition(value, known: list[str]) -> str | None:
    """None (the cluster's default) or a partition ``sinfo`` lists."""
    if value is None:
        return None
    if value not in known:
        raise SlurmArgumentError("partition", value, "is not a partition of this cluster",
                                 f"Partitions here: {', '.join(known) or '(none)'} (see `sinfo`).")
    return value


# ------------------------------------------------------------------------------------------ rendering

STYLES = ("spawn", "launch")


def check_style(value) -> str:
    if value not in STYLES:
        raise SlurmArgumentError("style", value, 'must be "spawn" (fn(rank, *args)) or "launch" (fn(*args))')
    return value


def script_args(args) -> tuple[str, ...]:
    """A script's command line: a string is split on white space (as a shell would, without quotes)."""
    from distlab import config

    return tuple(str(a) for a in config.check_script_args(args.split() if isinstance(args, str) else args))


def requested(*, nodes, ranks_per_node, gpus_per_node, cpus_per_task, time_limit, mode, requeue, signal, extra,
              python: Path, import_path: Path, workdir: Path) -> JobSpec:
    """The job :func:`distlab.slurm.submit`'s arguments ask for, each checked: a
    :class:`SlurmArgumentError` names the first wrong one. Its target, run folder and name come later."""
    return JobSpec(
        target=Path("."), run_dir=Path("."), python=python, import_path=import_path,
        nodes=positive("nodes", nodes), ranks_per_node=positive("ranks_per_node", ranks_per_node),
        gpus_per_node=positive("gpus_per_node", gpus_per_node, 0),
        cpus_per_task=None if cpus_per_task is None else positive("cpus_per_task", cpus_per_task),
        time=check_time(time_limit), mode=check_mode(mode), requeue=bool(requeue),
        signal=check_signal(signal), extra=check_extra(extra), workdir=workdir)


def _directives(spec: JobSpec, log: Path) -> list[tuple[str, str]]:
    """(option, comment) pairs, in the order the script shows them."""
    torchrun = spec.mode == "torchrun"
    agent = "one agent per node (distlab's); it starts the ranks" if spec.single_node \
        else "one torchrun agent per node; it starts the ranks"
    per_node = (1, agent) if torchrun else \
        (spec.ranks_per_node, "one task per rank: srun starts the ranks itself")
    rows = [(f"--job-name={spec.name}", ""), (f"--nodes={spec.nodes}", ""),
            (f"--ntasks-per-node={per_node[0]}", per_node[1])]
    cpus = spec.cpus_per_task or (spec.ranks_per_node if torchrun else 1)
    rows.append((f"--cpus-per-task={cpus}", "cores for each task" if not torchrun else "the agent's ranks share these"))
    if spec.gpus_per_node:
        rows.append((f"--gpus-per-node={spec.gpus_per_node}", ""))
    rows.append((f"--time={spec.time}", "Slurm ends the job (state TIMEOUT) after this"))
    if spec.partition:
        rows.append((f"--partition={spec.partition}", ""))
    if spec.workdir:
        rows.append((f"--chdir={spec.workdir}", "relative paths as in the notebook"))
    rows.append((f"--output={log}", "this script's own output: srun's and Slurm's messages"))
    rows.append(("--open-mode=append", "a requeued job appends to it instead of starting it again"))
    if spec.requeue:
        rows.append(("--requeue", "Slurm may put the job back in the queue (preemption, a failed node)"))
    if spec.signal:
        rows.append((f"--signal={spec.signal}", "a warning signal before the time limit"))
    rows.extend((option, "") for option in spec.extra)
    return rows


def _environment(spec: JobSpec) -> list[str]:
    """The lines between the #SBATCH options and srun: privacy, paths, the rendezvous address."""
    q = shlex.quote
    return [
        "",
        "umask 077                                 # every file the job writes: readable by you only",
        "# the notebook's python and torchrun, and the distlab it imports" if not spec.site_paths else
        "# a Python the job's user may run (the notebook's lives where it cannot), the notebook's packages",
        f"export PATH={q(str(spec.python.parent))}:\"$PATH\"",
        f"export PYTHONPATH={':'.join(q(str(p)) for p in (spec.import_path, *spec.site_paths))}"
        "${PYTHONPATH:+:$PYTHONPATH}",
        "# the run folder: each rank's log, report() rows and return value; torchrun's error files in tmp/",
        f"export DISTLAB_RUN_DIR={q(str(spec.run_dir))}",
        f"export TMPDIR={q(str(spec.run_dir / 'tmp'))}",
        "export PYTHONUNBUFFERED=1",
        "# since Slurm 22.05 srun no longer takes --cpus-per-task from the allocation: pass it on",
        "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK",
        "",
        *_rendezvous_lines(spec),
        "echo \"distlab: job $SLURM_JOB_ID attempt ${SLURM_RESTART_COUNT:-0} on $SLURM_JOB_NODELIST\"",
        "",
    ]


def _rendezvous_lines(spec: JobSpec) -> list[str]:
    """Where the ranks meet: a file in the run folder on one node; the first node's port on several."""
    if spec.single_node:
        return ["# One node: the ranks meet in a FileStore in the run folder, as distlab.spawn's do; no rank",
                "# and no agent listens on a port (torchrun's c10d store would, on every interface)."]
    return ["# The first node of the allocation hosts the rendezvous, on a port that is free there",
            "# (this script runs on that node), bound to its address only. Several nodes: the cluster's",
            "# network must be trusted (torch's stores have no authentication).",
            "head_node=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)",
            "# its address as Slurm knows it (NodeAddr): a node's short name need not resolve on the others",
            "head_addr=$(scontrol show node -o \"$head_node\" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')",
            "head_addr=${head_addr:-$head_node}",
            "# (a port below the ephemeral range, where srun takes its own: distlab.slurm.bound.free_port)",
            f"port=$({_python(spec)} -m distlab.slurm.bound port \"$head_addr\")"]


def _python(spec: JobSpec) -> str:
    """``python`` (found on the PATH the script sets), or the interpreter's full path when its name differs
    (the system's ``python3.11`` the job user runs)."""
    return "python" if spec.python.name == "python" else shlex.quote(str(spec.python))


def render(spec: JobSpec, script_path: Path, log: Path) -> str:
    """The sbatch script: readable, and runnable by hand with ``sbatch <script_path>``."""
    q = shlex.quote
    lines = ["#!/bin/bash",
             f"# Written by distlab.slurm: {spec.target.name} on {spec.nodes} node(s) x {spec.ranks_per_node} "
             f"rank(s), {spec.mode} mode.",
             f"# Submit it yourself with: sbatch {q(str(script_path))}"]
    width = 40  # comments start here; a longer line (a path) puts its comment on the line above
    for option, comment in _directives(spec, log):
        text = f"#SBATCH {option}"
        if comment and len(text) >= width:
            lines += [f"# {comment}:", text]
        else:
            lines.append(f"{text.ljust(width)}# {comment}" if comment else text)
    lines += _environment(spec)
    command = " ".join(q(str(a)) for a in (spec.target, *spec.target_args))
    if spec.single_node and spec.mode == "torchrun":
        lines += ["export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}   # what torchrun sets anyway (without a warning)",
                  "# one agent on the node, as torchrun would be, starting the ranks (distlab's: no TCP store)",
                  f"srun {_python(spec)} -m distlab.slurm.rank --nproc-per-node {spec.ranks_per_node} {command}"]
    elif spec.single_node:
        lines += ["# distlab.slurm.rank sets RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS",
                  f"srun --kill-on-bad-exit=1 {_python(spec)} -m distlab.slurm.rank {command}"]
    elif spec.mode == "torchrun":
        lines += ["export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}   # what torchrun sets anyway (without a warning)",
                  "# torchrun, its c10d store bound to the first node's address only (not every interface).",
                  "# No --node-rank: c10d ignores it and numbers the agents by sorting (host FQDN, pid), not in",
                  "# join order (\"$SLURM_NODEID\" here would also be expanded once, on this node: 0 for every node).",
                  "# --kill-on-bad-exit: an agent that fails ends the others now, not at a collective's timeout.",
                  f"srun --kill-on-bad-exit=1 {_python(spec)} -m distlab.slurm.bound torchrun \\",
                  f"    --nnodes \"$SLURM_NNODES\" --nproc-per-node {spec.ranks_per_node} \\",
                  "    --rdzv-backend c10d --rdzv-endpoint \"$head_addr:$port\" --rdzv-id \"$SLURM_JOB_ID\" \\",
                  f"    -m distlab.slurm.rank {command}"]
    else:
        lines += ["export MASTER_ADDR=\"$head_addr\" MASTER_PORT=\"$port\"   # init_process_group's env://",
                  "# distlab.slurm.rank sets RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS",
                  f"srun --kill-on-bad-exit=1 {_python(spec)} -m distlab.slurm.rank {command}"]
    if spec.signal and spec.signal.startswith("B:"):
        lines = _in_background(lines, spec.signal)
    return "\n".join(lines) + "\n"


def _in_background(lines: list[str], signal: str) -> list[str]:
    """``--signal=B:SIG@T`` signals only the batch shell, and a bash that has no trap for it dies of it (and
    the job with it). So the srun line runs in the background, the trap passes the signal on to every
    process of the job's steps (as ``--signal=SIG@T`` would have), and the script waits for srun."""
    name = signal.removeprefix("B:").split("@")[0].removeprefix("SIG")
    start = max(i for i, line in enumerate(lines) if line.startswith("srun "))
    end = start
    while lines[end].endswith("\\"):
        end += 1
    return [*lines[:start],
            f"# --signal=B:{name}: only this script gets it; pass it on to the ranks instead of dying of it",
            f"trap 'echo \"distlab: SIG{name} for the batch script, passed on to the ranks\"; "
            f"scancel --signal={name} \"$SLURM_JOB_ID\"' {name}",
            *lines[start:end], lines[end] + " &",
            "srun_pid=$!",
            "wait \"$srun_pid\"; status=$?",
            "# woken by the trap (status > 128) while srun runs on: wait again",
            "while [ \"$status\" -gt 128 ] && kill -0 \"$srun_pid\" 2>/dev/null; do",
            "    wait \"$srun_pid\"; status=$?",
            "done",
            "exit \"$status\"",
            *lines[end + 1:]]
