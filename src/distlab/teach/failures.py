"""Chapter 9, the failure lab: helpers to diagnose broken runs, and the fixes the chapter shows.

Distributed bugs cost time because they hang or blame the wrong rank. These helpers turn what a
failed run leaves behind (each rank's log, each rank's stack) into answers: which processes are
still alive, when the fault happened, which line each rank was stuck on. The lessons themselves (the
rule that finds a rank that died without a word, the atomic checkpoint write, every mistake and its
fix) are code in the chapter's cells; this module keeps the harness, the deterministic batches and
reference weights a resumed run is checked against, and the exercise checks.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

import psutil

FAULT_MARK = "FAULT_AT"  # workers print "FAULT_AT <time.time()>" right before they break on purpose
_FAULT_LINE = re.compile(rf"^{FAULT_MARK} (\d+(?:\.\d+)?)\s*$", re.MULTILINE)
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


# --- leftovers ---------------------------------------------------------------------------------

def worker_processes(pid: int | None = None) -> list[psutil.Process]:
    """Every process below ``pid`` (default: this kernel) that still exists, zombies included,
    except the ones kept on purpose (the forkserver, the resource tracker, open warm ranks, the
    holders of open nodes and agents waiting on them).

    A zombie has exited but was never reaped; it still counts, because a launcher that forgets
    to reap its children leaks them just the same.
    """
    from distlab.forkserver import prestart

    prestart.wait()  # a server being started in the background is not a leftover
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    kept = _warm_rank_pids() | _standby_agent_pids() | _node_holder_pids()
    return [p for p in children if not _is_multiprocessing_helper(p) and p.pid not in kept]


def _warm_rank_pids() -> set[int]:
    """The processes of every open :class:`distlab.Ranks`: kept from cell to cell by design, until
    ``close()`` (after which any that is left counts as a worker like any other)."""
    from distlab.warm import ranks

    return {pid for r in ranks.open_ranks() for pid in r.pids}


def _standby_agent_pids() -> set[int]:
    """Agents waiting on open :class:`distlab.Nodes` for their next launch (``distlab.launch.standby``):
    kept by design until the nodes close."""
    import sys

    module = sys.modules.get("distlab.launch.standby")
    return module.waiting_pids() if module is not None else set()


def _node_holder_pids() -> set[int]:
    """The processes that hold open :class:`distlab.Nodes` (what runs on a node is a worker)."""
    import sys

    module = sys.modules.get("distlab.nodes.cluster")
    return set().union(*(nodes.holder_pids() for nodes in module.open_nodes())) if module is not None else set()


def _is_multiprocessing_helper(p: psutil.Process) -> bool:
    """multiprocessing's resource tracker (started by the first ``mp.spawn`` or process pool in
    this process), distlab's forkserver (started by the first launch; the ranks it forks are
    workers) and the server's idle spare ranks live as long as their parent by design; they are
    not workers."""
    from distlab.forkserver.mode import SPARE_NAME, forkserver_pid

    server = forkserver_pid()
    if p.pid == server:
        return True
    try:
        if server is not None and p.ppid() == server and p.name() == SPARE_NAME:
            return True
        return "multiprocessing.resource_tracker" in " ".join(p.cmdline())
    except psutil.Error:
        return False


def settled_workers(pid: int | None = None, grace_s: float = 3.0) -> list[psutil.Process]:
    """:func:`worker_processes`, after giving processes that are just ending ``grace_s`` to be
    reaped (a rank stopped at the end of a cell can still be exiting when the cell returns); a
    process that is left behind is still there after the grace."""
    deadline = time.monotonic() + grace_s
    left = worker_processes(pid)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = worker_processes(pid)
    return left


def no_workers_left(pid: int | None = None) -> bool:
    """True when this kernel has no child process left; otherwise print what is left and say False."""
    left = []
    for p in settled_workers(pid):
        try:
            left.append(f"pid {p.pid} ({p.status()}): {' '.join(p.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            continue  # exited while we looked
    for line in left:
        print("still running:", line)
    return not left


def check_after_every_cell(shell=None) -> list[str]:
    """Record, after every cell the kernel runs from now on, any process left below the kernel.

    Registers an IPython ``post_run_cell`` hook and returns the list it appends to
    (``"cell 7: pid 123 (sleeping): python -u -m distlab.launch.rank ..."``), so a notebook can
    assert at its end that the list stayed empty.
    """
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    found: list[str] = []

    def check(result) -> None:
        for p in settled_workers():
            try:
                found.append(f"cell {result.execution_count}: pid {p.pid} ({p.status()}): "
                             f"{' '.join(p.cmdline())[:120]}")
            except psutil.NoSuchProcess:
                continue

    shell.events.register("post_run_cell", check)
    return found


# --- reading a failed run ----------------------------------------------------------------------

def fault_time(logs: dict[int, str]) -> float:
    """The earliest ``FAULT_AT <t>`` any rank printed: when the run was broken on purpose."""
    times = [float(m.group(1)) for text in logs.values() for m in _FAULT_LINE.finditer(text)]
    if not times:
        raise ValueError(f"no rank printed a {FAULT_MARK} line")
    return min(times)


def where_ranks_are(stacks: dict[int, str], script) -> dict[int, str]:
    """For each rank, the innermost line of ``script`` on its stack, as source text.

    faulthandler prints file names and line numbers only; looking the line up in the worker
    script turns ``line 19 in stuck`` into ``time.sleep(600)``.
    """
    script = Path(script)
    lines = script.read_text().splitlines()
    found = {}
    for rank, stack in stacks.items():
        found[rank] = "(not in the script)"
        for m in map(_FRAME.match, stack.splitlines()):  # faulthandler: most recent call first
            if m and Path(m["path"]).name == script.name and 0 < int(m["line"]) <= len(lines):
                found[rank] = f"{m['func']}: {lines[int(m['line']) - 1].strip()}"
                break
    return found


# --- a GPU checkpoint, data and the reference -------------------------------------------------

def save_as_from_gpu(obj, path, device: str = "cuda:0") -> None:
    """Save ``obj`` as rank 0 of a GPU job would: every storage is tagged ``device``.

    ``torch.save`` records where each tensor lived; ``torch.load`` puts it back there unless
    ``map_location`` says otherwise. On a CPU-only machine this writes the checkpoint a GPU job
    would have written, so the missing-``map_location`` mistake can be shown anywhere.
    """
    import torch
    import torch.serialization as ser

    original = ser.location_tag
    ser.location_tag = lambda storage: device
    try:
        torch.save(obj, path)
    finally:
        ser.location_tag = original


def batch(step: int, rank: int, size: int = 8):
    """The (inputs, targets) rank ``rank`` trains on at ``step``: the same after any restart."""
    import torch

    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(size, 10, generator=g), torch.randn(size, 5, generator=g)


def reference_weights(steps: int, world_size: int, lr: float = 0.05, seed: int = 0) -> dict:
    """Weights of an uninterrupted run, computed in one process.

    DDP averages the ranks' gradients, which equals the gradient of the mean of their losses;
    so one model trained on that mean ends where every rank of a healthy DDP run ends.
    """
    import torch

    from .models import ToyModel

    torch.manual_seed(seed)
    model = ToyModel()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        opt.zero_grad()
        losses = [torch.nn.functional.mse_loss(model(x), y) for x, y in (batch(step, r) for r in range(world_size))]
        (sum(losses) / world_size).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# --- exercises ---------------------------------------------------------------------------------

CAUSES = ("raised", "died hard", "missing rank", "op mismatch", "shape mismatch", "uneven batches")
SYMPTOMS = {
    "A": "rank 0: RuntimeError ... Connection closed by peer; rank 1's log stops without a traceback",
    "B": "Detected mismatch between collectives on ranks ... Tensor shapes: 4vs 8",
    "C": "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 2000 ms",
    "D": "timeout: rank 0's innermost line is loss.backward(), rank 1's is dist.barrier()",
    "E": "rank 0: terminate called after throwing gloo::EnforceNotMet ... Received data size doesn't match",
    "F": "Detected mismatch between collectives on ranks ... Op type: ALLREDUCEvs BROADCAST",
}
_DIAGNOSIS = {"A": "died hard", "B": "shape mismatch", "C": "missing rank", "D": "uneven batches",
              "E": "shape mismatch", "F": "op mismatch"}
_HINTS = {
    "A": "a rank that raises prints a traceback; which kind of death prints none?",
    "B": "DETAIL compares a fingerprint of each collective: what differs here?",
    "C": "monitored_barrier names the rank that never arrived.",
    "D": "backward() runs DDP's gradient all-reduce; one rank is already past its last batch.",
    "E": "gloo received more bytes than the tensor it was given can hold.",
    "F": "both ranks called a collective, but not the same one.",
}


def check_diagnosis(answer: dict | None) -> bool:
    """Self-check: ``answer`` maps each symptom letter of ``SYMPTOMS`` to one of ``CAUSES``."""
    if answer is None:
        print("No answer yet: replace None with a dict such as {'A': 'died hard', ...}.")
        print("Causes to choose from:", ", ".join(CAUSES))
        return False
    unknown = {k: v for k, v in answer.items() if v not in CAUSES}
    assert not unknown, f"{unknown} are not among the causes {CAUSES}"
    missing = sorted(set(SYMPTOMS) - set(answer))
    assert not missing, f"symptoms {missing} have no answer yet"
    wrong = sorted(k for k in SYMPTOMS if answer[k] != _DIAGNOSIS[k])
    assert not wrong, "not quite: " + "; ".join(f"{k}: {_HINTS[k]}" for k in wrong)
    print("correct")
    return True


def check_safe_save(save) -> bool:
    """Self-check for ``save(state, path, rank)``: only rank 0 writes, and never in place.

    Runs ``save`` in this process (no workers): as rank 1, as rank 0, and watches ``torch.save``
    to see whether the final path is ever the file being written.
    """
    import tempfile

    import torch

    if save is None:
        print("No answer yet: replace None with your function save(state, path, rank).")
        return False
    state = {"step": 7, "w": torch.arange(4.0)}
    targets = []
    original = torch.save

    def watched(obj, f, *args, **kwargs):
        targets.append(Path(f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", "<buffer>")))
        return original(obj, f, *args, **kwargs)

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ckpt.pt"
        torch.save = watched
        try:
            save(state, path, 1)
            assert not any(Path(d).iterdir()), "rank 1 wrote a file: only rank 0 should write the checkpoint"
            save(state, path, 0)
        finally:
            torch.save = original
        assert path.exists(), "rank 0 left no file at path: write the checkpoint there (in the end)"
        assert path not in targets, ("torch.save wrote straight into path: a reader (or a crash) in the middle "
                                     "sees half a file. Save to a temporary file next to it, then os.replace")
        back = torch.load(path)
        assert back["step"] == 7 and torch.equal(back["w"], state["w"]), "the file at path is not the state saved"
        assert [p.name for p in Path(d).iterdir()] == ["ckpt.pt"], "temporary files were left behind"
    print("correct")
    return True


def check_uneven_fixed(fn, timeout: float = 120) -> bool:
    """Self-check for exercise 3: launch ``fn`` on 2 gloo ranks; it must finish, rank 0 taking 3 steps and
    rank 1 five, with equal weights on both ranks. A hang is ended by ``timeout`` and reported as a failure."""
    if fn is None:
        print("No answer yet: replace None with your function uneven_fixed().")
        return False
    import torch

    import distlab

    try:
        result = distlab.launch(fn, world_size=2, backend="gloo", timeout=timeout)
    except distlab.WorkerTimeoutError as e:
        where = where_ranks_are(e.stacks, e.result.script) if e.result is not None else e.stacks
        raise AssertionError(f"it hung for {timeout:g} s; where each rank was: {where}. Hint: the rank that runs "
                             "out of batches first must keep shadowing the other's all-reduces (Join).") from None
    r0, r1 = result.returns[0], result.returns[1]
    assert isinstance(r0, dict) and {"steps", "weights"} <= set(r0), (
        "return {'steps': steps_taken, 'weights': model.module.net1.weight.detach()} from every rank")
    assert [r0["steps"], r1["steps"]] == [3, 5], (
        f"rank 0 took {r0['steps']} steps and rank 1 {r1['steps']}; the exercise wants 3 and 5")
    assert torch.equal(r0["weights"], r1["weights"]), (
        "it finished, but the replicas differ: did every step go through the DDP model?")
    print("correct: rank 1's two extra steps all-reduced with rank 0's zeros, and the replicas agree")
    return True
