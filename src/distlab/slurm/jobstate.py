"""What a job's state means, apart from asking Slurm for it (pure: :mod:`.commands` runs the commands).

* :class:`JobState` and the parsers of ``squeue`` and ``scontrol`` lines;
* :func:`follow`: one poll's state against the last one seen: a change to print, a requeue to tell once;
* :func:`gone_state`: how a job ended once the controller forgot it (the ranks' exit codes decide);
* :func:`first_failed` and :func:`failure_error`: which error a job that did not complete raises;
* :func:`newest_record`: which of several records of one job id :func:`distlab.slurm.attach` takes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import JOB_ENDED, JOB_FAILED, SlurmJobFailedError

#: states after which a job never runs again (PREEMPTED without requeue included)
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE", "PREEMPTED", "SPECIAL_EXIT", "REVOKED"}
SQUEUE_FORMAT = "%T|%r|%N"


@dataclass(frozen=True)
class JobState:
    """One look at a job: ``state`` (PENDING, RUNNING, COMPLETED, ...), why it waits, where it runs."""

    state: str
    reason: str = ""
    nodes: str = ""
    exit_code: str = ""

    @property
    def finished(self) -> bool:
        return self.state in FINAL

    def describe(self) -> str:
        """``PENDING (Resources)``, ``RUNNING on node[1-2]``, ``COMPLETED (exit code 0:0)``."""
        if self.state == "PENDING":
            return f"PENDING ({self.reason})" if self.reason and self.reason != "None" else "PENDING"
        if self.state in ("RUNNING", "COMPLETING") and self.nodes:
            return f"{self.state} on {self.nodes}"
        if self.finished and self.exit_code:
            return f"{self.state} (exit code {self.exit_code})"
        return self.state


def parse_squeue(text: str) -> JobState | None:
    """A line of ``squeue -h -o %T|%r|%N`` -> JobState (None for no line)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    if not line:
        return None
    state, reason, nodes = (line.split("|") + ["", ""])[:3]
    return JobState(state.split()[0], reason, nodes)


def parse_scontrol(text: str) -> dict[str, str]:
    """``scontrol show job -o`` -> {key: value}. Values are the non-blank text after ``key=``."""
    return dict(re.findall(r"(?:^|\s)([A-Za-z][\w/:]*)=(\S*)", text))


def controller_state(fields: dict[str, str]) -> JobState | None:
    """The state in ``scontrol show job``'s fields, with Slurm's exit code; None without one."""
    if "JobState" not in fields:
        return None
    return JobState(fields["JobState"], fields.get("Reason", ""), fields.get("NodeList", ""),
                    fields.get("ExitCode", ""))


@dataclass(frozen=True)
class Seen:
    """What one poll makes of the state Slurm gave: the state to go on with, and whether to tell it."""

    state: JobState
    changed: bool = False  # a new state, or an attempt that began again: one line for the learner
    requeued: bool = False


def follow(given: JobState | None, last: JobState | None, attempts: int, requeues: int) -> Seen:
    """One poll: Slurm's answer ``given`` (None: it knows no such job) after ``last`` (None before the
    first), with ``attempts`` attempt folders and ``requeues`` requeues told so far.

    A job Slurm no longer knows after it was seen has ended (``GONE``: the controller forgot it). A new
    attempt folder is a requeue even when no poll saw the job wait (requeued and running again
    between two polls); a job seen waiting again after it ran is one too, told once."""
    state = given or JobState("UNKNOWN")
    if state == JobState("UNKNOWN") and last is not None:
        state = JobState("GONE")
    started_again = attempts - 1 > requeues
    if state == last and not started_again:
        return Seen(state)
    requeued = started_again or (state.state == "PENDING" and last is not None
                                 and last.state in ("RUNNING", "COMPLETING"))
    return Seen(state, changed=True, requeued=requeued)


def gone_state(codes: list[int | None]) -> JobState:
    """How a job ended that Slurm keeps no record of: COMPLETED only if every rank exited with 0."""
    return JobState("COMPLETED" if codes and all(c == 0 for c in codes) else "FAILED")


#: why a job ended without completing, when no rank's own error explains it
ENDED_BECAUSE = {"TIMEOUT": " (its time limit, --time)", "CANCELLED": " (scancel, by you or an administrator)",
                 "NODE_FAIL": " (a node failed)", "PREEMPTED": " (preempted by a job of higher priority)",
                 "OUT_OF_MEMORY": " (a task ran out of memory)"}


def first_failed(exit_codes: dict[int, int | None], exit_time) -> int | None:
    """The rank that failed by itself first: a positive exit code (ranks Slurm killed afterwards exit by
    a signal), the earliest ``exit_time(rank)``; None when no rank did."""
    failed = [r for r, c in exit_codes.items() if c is not None and c > 0]
    return min(failed, key=exit_time) if failed else None


def failure_error(result, first: int | None, batch_tail: list[str]) -> SlurmJobFailedError:
    """The error for ``result``, a job that did not complete: rank ``first``'s own failure with its last
    lines, else why Slurm ended the job with the batch script's last lines (``batch_tail``)."""
    if first is not None:
        last_lines = "\n".join(result.logs.get(first, "").rstrip().splitlines()[-15:])
        return SlurmJobFailedError(JOB_FAILED.format(
            job_id=result.job_id, state=result.state, exit_code=result.exit_code or "?", rank=first,
            rank_exit=result.exit_codes[first], last_lines=last_lines or "(nothing)", run_dir=result.run_dir),
            result=result, rank=first)
    return SlurmJobFailedError(JOB_ENDED.format(
        job_id=result.job_id, state=result.state, exit_code=result.exit_code or "?",
        reason=ENDED_BECAUSE.get(result.state, ""), batch_tail="\n".join(batch_tail[-10:]) or "(nothing)",
        run_dir=result.run_dir), result=result)


def newest_record(records: list[dict], job_id: int, slurm_conf: str | None) -> dict | None:
    """Of the records of submitted jobs, the one for ``job_id``: with several (two clusters numbered
    their jobs alike), one submitted under the current ``SLURM_CONF`` first, then the newest."""
    mine = [r for r in records if r.get("job_id") == int(job_id)]
    if not mine:
        return None
    return max(mine, key=lambda r: (r.get("slurm_conf") == slurm_conf, r["submitted"]))
