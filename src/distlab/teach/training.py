"""Chapter 7: what proves the article's ``ddp_train.py`` right, and the launch lines around it.

The script itself is the lesson, so it lives in the chapter: a ``%%writefile ddp_train.py`` cell of
``book/07_two_gpu_training.ipynb``, with the article's changes marked by comments. This module holds
what is not the lesson:

* :func:`script_from_notebook` and :func:`write_ddp_train` take that cell out of the notebook, so the
  unit tests, the two-node test and ``bench/gpu_check.sh`` run exactly the code a learner reads;
* :func:`reference_train` trains the same model on one process with the *global* batches DDP sees,
  for the equivalence check;
* :func:`torchrun_commands` and :func:`slurm_script` write the multi-node launch lines;
* ``check_*`` functions are the chapter's exercise self-checks.
"""
from __future__ import annotations

import contextlib
import datetime
import io
import json
import math
import os
import queue
import re
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from distlab.errors import NodeRunInterrupted
from distlab.teach import answers

CHAPTER = "07_two_gpu_training.ipynb"
SCRIPT_NAME = "ddp_train.py"

#: What a launcher sets in a rank's environment. The script has its own copy (to start clean under
#: ``python ddp_train.py``); tests and ``bench/gpu_check.sh`` clear these before they start the script.
LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")


def free_port() -> int:
    """A port the OS reports free right now, for tests that start their own rendezvous (the script has its
    own copy). Another program may take it before it is bound: a test's risk, not a learner's."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

# ---------------------------------------------------------------------------------------------
# The script, taken from the chapter's %%writefile cell
# ---------------------------------------------------------------------------------------------


def chapter_notebook() -> Path:
    """Chapter 7's notebook in the checkout this distlab runs from (``src/distlab/teach`` -> ``book/``)."""
    path = Path(__file__).resolve().parents[3] / "book" / CHAPTER
    if not path.is_file():
        raise FileNotFoundError(f"book/{CHAPTER} not found next to {Path(__file__).resolve().parents[3]}; "
                                "the script lives in the chapter: run from a checkout of the distlab repository.")
    return path


def script_from_notebook(notebook, name: str = SCRIPT_NAME) -> str:
    """The text a ``%%writefile <name>`` code cell of ``notebook`` writes (the cell minus its magic line).

    Reads the ``.ipynb`` as JSON, so it needs neither Jupyter nor nbformat (the GPU check runs it bare).
    """
    cells = json.loads(Path(notebook).read_text())["cells"]
    found = []
    for cell in cells:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        first, _, rest = source.partition("\n")
        if cell["cell_type"] == "code" and first.split() == ["%%writefile", name]:
            found.append(rest if rest.endswith("\n") else rest + "\n")
    if len(found) != 1:
        raise ValueError(f"{notebook}: expected one '%%writefile {name}' cell, found {len(found)}")
    return found[0]


def write_ddp_train(folder, notebook=None) -> Path:
    """Write chapter 7's ``ddp_train.py`` into ``folder`` and return its path."""
    path = Path(folder) / SCRIPT_NAME
    path.write_text(script_from_notebook(notebook or chapter_notebook()))
    return path


# ---------------------------------------------------------------------------------------------
# The single-process reference: what DDP must be equal to
# ---------------------------------------------------------------------------------------------

def rank_indices(size: int, world_size: int, rank: int, epoch: int) -> list[int]:
    """The sample indices rank ``rank`` trains on in ``epoch`` (DistributedSampler's defaults, seed 0)."""
    from torch.utils.data.distributed import DistributedSampler

    sampler = DistributedSampler(range(size), num_replicas=world_size, rank=rank)
    sampler.set_epoch(epoch)
    return list(sampler)


def global_batches(size: int, batch_size: int, world_size: int, epoch: int) -> list[list[int]]:
    """Step ``i``'s global batch: batch ``i`` of every rank, concatenated in rank order.

    DDP averages the ranks' gradients, and each rank's gradient is the mean over its own batch, so with
    equal batch sizes one DDP step equals one plain step on this concatenation.
    """
    shards = [rank_indices(size, world_size, r, epoch) for r in range(world_size)]
    per_rank = len(shards[0])
    return [[i for shard in shards for i in shard[b:b + batch_size]] for b in range(0, per_rank, batch_size)]


@contextmanager
def one_thread():
    """Run the block with one intra-op thread: for tiny matrices one thread is fastest, and on a machine
    whose cores the ranks share, extra threads only spin and wait."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def reference_train(size: int, batch_size: int, world_size: int, epochs: int, seed: int = 0,
                    lr: float = 0.01) -> dict:
    """Train SimpleModel in this process on DDP's global batches; returns ``model`` state and ``losses``.

    Builds model and data in the script's order after ``torch.manual_seed(seed)``, so it starts from the
    same parameters and the same DummyDataset as every rank of ``ddp_train.py --seed seed``.
    """
    from .models import DummyDataset, SimpleModel

    with one_thread():
        torch.manual_seed(seed)
        model = SimpleModel()
        dataset = DummyDataset(size=size)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        criterion = torch.nn.CrossEntropyLoss()
        losses = []
        for epoch in range(epochs):
            for idx in global_batches(size, batch_size, world_size, epoch):
                optimizer.zero_grad()
                loss = criterion(model(dataset.data[idx]), dataset.targets[idx])
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
    return {"model": {k: v.detach().clone() for k, v in model.state_dict().items()}, "losses": losses}


def max_abs_difference(a: dict, b: dict) -> float:
    """Largest element-wise difference between two state dicts with the same keys."""
    assert a.keys() == b.keys(), f"different parameters: {sorted(a.keys() ^ b.keys())}"
    return max((a[k].float().cpu() - b[k].float().cpu()).abs().max().item() for k in a)


def states_equal(a: dict, b: dict) -> bool:
    """Bit-for-bit equality of two state dicts."""
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


def steps_per_epoch(size: int, batch_size: int, world_size: int) -> int:
    """Optimizer steps each rank takes per epoch (DistributedSampler pads to a multiple of world_size)."""
    return math.ceil(math.ceil(size / world_size) / batch_size)


def losses_by_epoch_step(rows: list[dict]) -> dict[tuple[int, int], float]:
    """A rank's reported losses keyed by (epoch, batch), so a resumed run lines up with a full one."""
    return {(r["epoch"], r["batch"]): r["loss"] for r in rows if "loss" in r}


def samples_per_s(result) -> float:
    """Rank 0's reported throughput of a ddp_train.py run (global samples per second)."""
    values = result.series("samples_per_s", rank=0)
    assert values, "the run reported no samples_per_s (was it started through distlab?)"
    return float(values[-1])


def step_time(result, quantile: float = 0.5, rank: int = 0) -> float:
    """A quantile of a run's reported per-step times (0.5: the median, 0.0: the fastest step).

    On a shared machine the fastest step is the most repeatable figure: other programs can only make
    steps slower, so the minimum is closest to what the step itself costs.
    """
    times = sorted(result.series("step_time", rank=rank))
    assert times, "the run reported no step_time"
    return times[min(int(quantile * len(times)), len(times) - 1)]


def checksums_in(log: str) -> dict[int, float]:
    """``{rank: checksum}`` from the script's ``Rank r, parameter checksum: x`` lines.

    The value has exactly 10 decimals, so a line two ranks wrote into one pipe at once (unbuffered
    ``print`` writes the text and the newline separately) still parses.
    """
    pattern = r"Rank (\d+), parameter checksum: (-?\d+\.\d{10})"
    return {int(rank): float(value) for rank, value in re.findall(pattern, log)}


def epochs_in(log: str) -> dict[int, list[int]]:
    """``{rank: [epochs it trained]}`` from the script's ``Rank r, Epoch e, Batch b`` lines: what shows
    that a run trained, where a run that resumed from a finished checkpoint prints none."""
    found: dict[int, set[int]] = {}
    for rank, epoch in re.findall(r"Rank (\d+), Epoch (\d+), Batch \d+", log):
        found.setdefault(int(rank), set()).add(int(epoch))
    return {rank: sorted(epochs) for rank, epochs in sorted(found.items())}


# ---------------------------------------------------------------------------------------------
# Checkpoints written by every rank: the race, frozen so it can be shown
# ---------------------------------------------------------------------------------------------

def save_in_progress(state, path, atomic: bool, fraction: float = 0.5) -> None:
    """Freeze a save of ``state`` to ``path`` part-way: the bytes a reader would find at that moment.

    ``torch.save(state, path)`` truncates ``path`` first and then writes, so a reader sees a prefix.
    ``save_checkpoint`` writes the prefix to a temporary name instead; ``path`` keeps the old file.
    """
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    target = Path(path).with_name(Path(path).name + ".tmp") if atomic else Path(path)
    with open(target, "wb") as f:
        f.write(data[: int(len(data) * fraction)])


def try_load(path) -> str:
    """``"complete"`` when ``torch.load`` reads the file, else the error's type and first line."""
    try:
        torch.load(path, map_location="cpu", weights_only=True)
        return "complete"
    except Exception as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


# ---------------------------------------------------------------------------------------------
# Beyond one machine
# ---------------------------------------------------------------------------------------------

def torchrun_command(nnodes, nproc_per_node: int, endpoint: str,
                     script: str = "ddp_train.py", script_args=(), rdzv_id: str = "ddp_train",
                     tee: bool = False, max_restarts: int = 0, rdzv_conf: str = "") -> list[str]:
    """argv for one node. With the c10d rendezvous the agents meet at ``endpoint`` (host:port on one
    node, reachable from all), agree on ranks and a store; ``--rdzv-id`` names the job.
    No ``--node-rank``: c10d ignores it (torch uses it only with ``--rdzv-backend static``) and numbers
    the nodes by sorting them (:data:`C10D_ORDER`), so every node runs the same line.
    ``nnodes``: a number, or ``"MIN:MAX"`` (elastic: the job goes on with as few as MIN nodes).
    ``tee``: ``--tee 3``, each rank's lines prefixed with ``[default<local rank>]:``."""
    extra = [*(["--max-restarts", str(max_restarts)] if max_restarts else []),
             *(["--rdzv-conf", rdzv_conf] if rdzv_conf else []), *(["--tee", "3"] if tee else [])]
    return ["torchrun", "--nnodes", str(nnodes),
            "--nproc-per-node", str(nproc_per_node), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
            "--rdzv-id", rdzv_id, *extra, script, *[str(a) for a in script_args]]


#: How torch 2.13's c10d rendezvous numbers the nodes (``dynamic_rendezvous.py``): once a round is
#: complete, ``for rank, node in enumerate(sorted(state.participants))``, where each participant is a
#: ``_NodeDesc(addr, pid, local_id)`` dataclass with ``order=True``: sorted by the host's FQDN
#: (``socket.getfqdn()``, or ``--local-addr``) as a string, then by the agent's process id. Not the
#: order in which the agents joined; and ``node10`` sorts before ``node2``.
C10D_ORDER = ("addr", "pid", "local_id")


def torchrun_commands(nnodes, nproc_per_node: int, endpoint: str, script: str = "ddp_train.py",
                      script_args=(), rdzv_id: str = "ddp_train", tee: bool = False, max_restarts: int = 0,
                      rdzv_conf: str = "", machines: int | None = None) -> list[str]:
    """The shell command to type on each node: the same line on every one (c10d numbers the nodes).
    ``machines``: how many to write (default ``nnodes``, or MAX of ``"MIN:MAX"``)."""
    count = machines or int(str(nnodes).split(":")[-1])
    return [shlex.join(torchrun_command(nnodes, nproc_per_node, endpoint, script, script_args, rdzv_id, tee,
                                        max_restarts, rdzv_conf))
            for _ in range(count)]


#: torchrun's c10d settings for a lesson on a lost machine: a node that misses 3 keep-alives 1 s apart
#: is dead (default: 5 s apart), and a round with fewer than the most nodes closes 1 s after it could
#: (default 30 s): the job goes on without the lost node within seconds.
QUICK_ELASTIC = "keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1"
#: What gloo says when a peer's process is gone (its kernel closed or reset the connection):
#: ``Connection closed by peer [ADDR]:PORT`` or ``Read error [ADDR]:PORT: Connection reset by peer``.
PEER_LOST = r"(closed by peer \[{address}\]|\[{address}\]:\d+: Connection reset by peer)"


#: In the environment of every process a run on nodes starts (torchrun's ranks inherit it): what
#: finds them on each node when they must be stopped, even after they left the command's session.
RUN_MARK = "DISTLAB_NODE_RUN"
#: Seconds a command has after SIGTERM (a torchrun agent stops its ranks first) before everything of
#: the run is SIGKILLed: torchrun's agents were seen ignoring SIGTERM for more than 8 s.
TERM_S = 3.0


def run_on_nodes(nodes, commands: list[str], timeout: float = 300, echo: bool = True, env: dict | None = None,
                 first: int | None = None, ready: str | None = None) -> list[str]:
    """Run ``commands[k]`` on node ``k`` of ``nodes`` (a :class:`distlab.Nodes`), all at once, as one
    terminal per machine would; print each line as it comes, as ``[nodeK] line``; return each
    node's output. Raises ``RuntimeError`` naming the node whose command failed (the others are
    stopped), or the nodes still running at ``timeout``. ``env``, ``first``, ``ready``: see :class:`OnNodes`."""
    return OnNodes(nodes, commands, env=env, echo=echo, first=first, ready=ready).wait(timeout)


class OnNodes:
    """Commands running on nodes, one each, started at once; their lines as they come.

    ``lines`` holds ``(seconds since the start, node, line)``; :meth:`lose` kills every process of a
    node, as when a machine's processes die, and :meth:`wait` then expects that node's command to fail.
    ``first`` and ``ready``: node ``first``'s command starts alone, the others once it printed a line
    matching ``ready`` (a regular expression), as when one machine's agent is up long before the others'."""

    def __init__(self, nodes, commands: list[str], env: dict | None = None, echo: bool = True,
                 first: int | None = None, ready: str | None = None):
        self.nodes, self.commands, self.echo = nodes, commands, echo
        env = {**{k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}, **(env or {})}
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])  # this torchrun
        env.setdefault("OMP_NUM_THREADS", "1")
        # lines as they come (a lesson waits for one, then kills a node): a script's print() into
        # torchrun's --tee file is block-buffered, and a learner's Jupyter does not set this for it
        env.setdefault("PYTHONUNBUFFERED", "1")
        for command in dict.fromkeys(commands):
            _check_program(command, env["PATH"])  # before any process starts
        env[RUN_MARK] = secrets.token_hex(8)
        self.mark = f"{RUN_MARK}={env[RUN_MARK]}"
        self.t0 = time.monotonic()
        self.lines: list[tuple[float, int, str]] = []
        self.lost: set[int] = set()
        self._queue: queue.Queue = queue.Queue()
        self._folded = FoldedFrames(nodes.hosts)
        self.procs: list[subprocess.Popen | None] = [None] * len(commands)
        self._open = 0
        order = [first, *(k for k in range(len(commands)) if k != first)] if first is not None else range(len(commands))
        for k in order:
            self._start(k, env)
            if k == first and ready:
                try:
                    self.wait_for(ready, node=first)
                except RuntimeError:
                    self._stop(grace_s=0)
                    raise

    def _start(self, k: int, env: dict) -> None:
        self.procs[k] = self.nodes.popen(k, ["sh", "-c", self.commands[k]], stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        self._open += 1
        threading.Thread(target=self._read, args=(k, self.procs[k]), daemon=True).start()

    def _read(self, k, proc) -> None:
        for line in proc.stdout:
            self._queue.put((k, line.rstrip("\n")))
        self._queue.put((k, None))

    def _take(self, wait_s: float) -> bool:
        """Move lines that arrived into ``lines`` (and print them); False once every stream ended."""
        try:
            k, line = self._queue.get(timeout=wait_s)
        except queue.Empty:
            return self._open > 0
        while True:
            if line is None:
                self._open -= 1
                self._folded.flush(k)
            else:
                self.lines.append((time.monotonic() - self.t0, k, line))
                if self.echo:
                    self._folded.show(k, line)
            try:
                k, line = self._queue.get_nowait()
            except queue.Empty:
                return self._open > 0

    def wait_for(self, pattern: str, node: int | None = None, timeout: float = 120) -> float:
        """Seconds since the start at which a line matching ``pattern`` (a regular expression) came
        from ``node`` (any node if None), waiting for it if need be."""
        deadline, seen = time.monotonic() + timeout, 0
        try:
            while True:
                for t, k, line in self.lines[seen:]:
                    if (node is None or k == node) and re.search(pattern, line):
                        return t
                seen = len(self.lines)
                if time.monotonic() > deadline or not self._take(0.1) and seen == len(self.lines):
                    where = "any node" if node is None else self.nodes.hosts[node]
                    raise RuntimeError(f"no line matching {pattern!r} came from {where} within {timeout:g} s")
        except KeyboardInterrupt:
            raise NodeRunInterrupted(self.nodes.hosts, self._stop(grace_s=0)) from None

    def lose(self, node: int) -> float:
        """Kill every process of ``node`` now (its machine's processes die); the time it happened."""
        self.lost.add(node)
        self.nodes.kill_processes(node)
        return time.monotonic() - self.t0

    def wait(self, timeout: float = 300) -> list[str]:
        """Each node's output once every command ended; ``RuntimeError`` naming the node whose command
        failed first (a lost node's is expected to), after stopping the others, or at ``timeout``."""
        deadline, first_failed = time.monotonic() + timeout, None
        try:
            while self._take(0.2) and time.monotonic() < deadline:
                failed = [k for k, p in enumerate(self.procs) if p.poll() not in (None, 0) and k not in self.lost]
                if failed:
                    first_failed = failed[0]
                    break  # the others would wait for it in the rendezvous
        except KeyboardInterrupt:
            raise NodeRunInterrupted(self.nodes.hosts, self._stop(grace_s=0)) from None
        self._stop(grace_s=10 if self._open == 0 else 0.5)
        for k in ([first_failed] if first_failed is not None else range(len(self.procs))):
            if self.procs[k].returncode != 0 and k not in self.lost:
                late = f" (stopped: still running after {timeout:g} s)" if self._open and first_failed is None else ""
                tail = "\n".join([line for _, n, line in self.lines if n == k][-20:])
                raise RuntimeError(f"node {k} ({self.nodes.hosts[k]}): `{self.commands[k]}` ended with exit code "
                                   f"{self.procs[k].returncode}{late}; its last lines:\n{tail}")
        return ["\n".join(line for _, n, line in self.lines if n == k) for k in range(len(self.procs))]

    def _stop(self, grace_s: float) -> int:
        """Wait ``grace_s`` for the commands, SIGTERM the ones left (a torchrun agent stops its ranks),
        and after :data:`TERM_S` SIGKILL every process of this run still on a node, found by
        :data:`RUN_MARK` (torchrun's ranks run in sessions of their own, out of reach of the
        command's process group). A second interrupt meanwhile is ignored: it would leave the rest
        running. How many processes needed SIGKILL."""
        with sigint_ignored():
            end = time.monotonic() + grace_s
            running = [p for p in self.procs if p is not None and not _ended(p, end)]
            for proc in running:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
            end = time.monotonic() + TERM_S
            for proc in running:
                _ended(proc, end)  # TERM_S for them all, not each
            killed = sum(len(self.nodes.kill_processes(k, mark=self.mark)) for k in range(len(self.procs))
                         if not self.nodes.closed and self.nodes.alive(k))
            for proc in filter(None, self.procs):
                _ended(proc, time.monotonic() + 5)
        return killed


def _check_program(command: str, path: str) -> None:
    """Raise if the program ``command`` starts (its first word after ``NAME=value`` words) is neither a
    file along ``path`` nor a shell builtin. The nodes see this machine's files, so what ``sh`` cannot
    find here, no node finds: say so now, not after a rendezvous that waits for an agent never started."""
    try:
        words = shlex.split(command)
    except ValueError:
        return
    words = [w for w in words if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", w)]
    if not words or subprocess.run(["sh", "-c", 'command -v "$1" >/dev/null', "sh", words[0]],
                                   env={"PATH": path}).returncode == 0:
        return
    hint = ("pip puts torch's `torchrun` beside Python; a virtual environment made without console "
            "scripts has none: reinstall torch there (pip install --force-reinstall --no-deps torch), or "
            f"write `{sys.executable} -m torch.distributed.run` in place of `torchrun`"
            if words[0] == "torchrun" else "install it, or write its full path in the command")
    raise RuntimeError(f"`{words[0]}` was not found on the nodes: none in the folders searched, in this order "
                       f"PATH={path} (the first is this kernel's Python's, {os.path.dirname(sys.executable)}). "
                       f"{hint[0].upper()}{hint[1:]}.")


def _ended(proc: subprocess.Popen, end: float) -> bool:
    """Whether ``proc`` ended by the monotonic time ``end`` (waiting for it until then)."""
    try:
        proc.wait(timeout=max(0.0, end - time.monotonic()))
        return True
    except subprocess.TimeoutExpired:
        return False


@contextmanager
def sigint_ignored():
    """SIGINT ignored in the block (in the main thread, where Python delivers it): stopping a run must
    not be cut short by the learner's second Ctrl-C, or part of it would keep running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, saved)


class FoldedFrames:
    """Prints nodes' lines as ``[nodeK] line``, with a C++ stack trace (``frame #3: ...`` lines, which
    torch's store prints with some warnings) folded into one line saying how many frames it had, and
    likewise a run of torch's INFO log lines (``LOGLEVEL=INFO``; its warnings still show)."""

    FRAME = re.compile(r"^(frame #\d+: |<omitting python frames>)")
    INFO = re.compile(r"^I\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")
    KINDS = ((FRAME, "lines of C++ stack trace"), (INFO, "lines of torch's INFO log"))

    def __init__(self, hosts: list[str], out=None):
        self.hosts, self.out, self.frames = hosts, out, {}

    def show(self, k: int, line: str) -> None:
        kind = next((what for pattern, what in self.KINDS if pattern.match(line)), None)
        if kind is not None and self.frames.get(k, (kind,))[0] == kind:
            self.frames[k] = (kind, self.frames.get(k, (kind, 0))[1] + 1)
            return
        self.flush(k)
        if kind is not None:
            self.frames[k] = (kind, 1)
            return
        print(f"[{self.hosts[k]}] {line}", file=self.out, flush=True)

    def flush(self, k: int) -> None:
        if k in self.frames:
            kind, count = self.frames.pop(k)
            print(f"[{self.hosts[k]}] ({count} {kind}, in the returned output)", file=self.out, flush=True)


_TEE_LINE = re.compile(r"^\[(?P<role>[A-Za-z_]+)(?P<local>\d+)\]:Rank (?P<rank>\d+),")


def ranks_by_local_rank(output: str) -> dict[int, int]:
    """local rank -> global rank, read from one node's ``torchrun --tee 3`` output: torchrun puts
    ``[default<local rank>]:`` before each line, the script prints ``Rank <global rank>, ...``."""
    found: dict[int, int] = {}
    for line in output.splitlines():
        match = _TEE_LINE.match(line)
        if match:
            found.setdefault(int(match["local"]), int(match["rank"]))
    return found


_LOG_TIME = re.compile(r"^I(\d{4} \d\d:\d\d:\d\d\.\d+) ")


def agent_rendezvous(output: str) -> dict:
    """What one node's torchrun agent logged at ``LOGLEVEL=INFO`` about its rendezvous: when it
    started (its first log line), when it began the rendezvous (``Rendezvous'ing worker group``,
    logged just before it joins), and the node's rank the rendezvous gave it (``group_rank=``).
    Times are the agent's own clock (``datetime``, month and day of the log, year 1900)."""
    found: dict = {}
    for line in output.splitlines():
        stamp = _LOG_TIME.match(line)
        if not stamp:
            continue
        at = datetime.datetime.strptime(stamp.group(1), "%m%d %H:%M:%S.%f")
        found.setdefault("started", at)
        if "Rendezvous'ing worker group" in line:
            found.setdefault("rendezvous", at)
        rank = re.search(r"\]\s+group_rank=(\d+)$", line)
        if rank:
            found.setdefault("group_rank", int(rank.group(1)))
    return found


SLURM_TEMPLATE = """#!/bin/bash
#SBATCH --job-name={job_name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1          # one torchrun agent per node; it starts the ranks
#SBATCH --gpus-per-node={gpus}
#SBATCH --cpus-per-task={cpus}
#SBATCH --time={time}

# The first node of the allocation hosts the c10d rendezvous, at its address as Slurm knows it
# (NodeAddr: its short name need not resolve on the other nodes).
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
head_addr=$(scontrol show node -o "$head_node" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')
# A port of this job's own: with a fixed one, a second job on the same first node would join the
# first job's store (chapter 13).
port=$((20000 + SLURM_JOB_ID % 12000))
# Since Slurm 22.05 srun does not pass --cpus-per-task on to its tasks: say it again.
export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK

# No --node-rank: c10d ignores it and numbers the nodes by their sorted host names (FQDN).
# ("$SLURM_NODEID" on this line would be expanded once, here on the first node, and give every
# node 0.) --kill-on-bad-exit: a node whose torchrun fails ends the others now, not at NCCL's timeout.
srun --kill-on-bad-exit=1 torchrun \\
    --nnodes "$SLURM_NNODES" \\
    --nproc-per-node {gpus} \\
    --rdzv-backend c10d \\
    --rdzv-endpoint "$head_addr:$port" \\
    --rdzv-id "$SLURM_JOB_ID" \\
    {command}
"""


def slurm_script(nodes: int = 2, gpus_per_node: int = 2, script: str = "ddp_train.py", script_args=(),
                 job_name: str = "ddp_train", time: str = "00:30:00", cpus_per_task: int = 8) -> str:
    """An sbatch file: SLURM picks the nodes, ``srun`` starts one torchrun per node. The rendezvous is
    on the first node's ``NodeAddr`` at a port derived from the job id, as chapter 13 teaches."""
    command = shlex.join([script, *[str(a) for a in script_args]])
    return SLURM_TEMPLATE.format(job_name=job_name, nodes=nodes, gpus=gpus_per_node, cpus=cpus_per_task,
                                 time=time, command=command)


# ---------------------------------------------------------------------------------------------
# Exercise self-checks
# ---------------------------------------------------------------------------------------------


def check_global_batch(answer, per_rank_batch: int = 32, world_size: int = 2) -> bool:
    """Exercise 1: the batch size of the single-process run that DDP training is equal to."""
    if answers.unanswered(answer, "a number of samples"):
        return False
    expected = per_rank_batch * world_size
    assert answer == expected, (
        f"{answer} is not it. Each of the {world_size} ranks computes a mean gradient over its own "
        f"{per_rank_batch} samples and DDP averages those: a mean over how many samples in all?")
    print(f"correct: {world_size} ranks x {per_rank_batch} = {expected} samples per optimizer step")
    return True


def check_steps_per_epoch(answer, size: int = 10000, batch_size: int = 32, world_size: int = 2) -> bool:
    """Exercise 2: optimizer steps per epoch on each rank."""
    if answers.unanswered(answer, "a number of steps"):
        return False
    expected = steps_per_epoch(size, batch_size, world_size)
    assert answer == expected, (
        f"{answer} is not it. DistributedSampler gives each rank ceil({size}/{world_size}) indices; "
        f"the DataLoader cuts them into batches of {batch_size} (the last one may be smaller).")
    print(f"correct: ceil(ceil({size}/{world_size})/{batch_size}) = {expected} steps per epoch on every rank")
    return True


def check_node_command(command, nnodes: int = 2, nproc_per_node: int = 4,
                       endpoint: str = "gpu-node-0:29400") -> bool:
    """Exercise 3: the torchrun line for a machine of a multi-node job (flag order does not matter).
    ``--node-rank`` is refused: the c10d rendezvous ignores it, so it would only mislead a reader."""
    if answers.unanswered(answer=command, what="a torchrun command line (a string)"):
        return False
    given = _flags(shlex.split(command))
    want = _flags(torchrun_command(nnodes, nproc_per_node, endpoint))
    assert shlex.split(command)[0] == "torchrun", "start the line with torchrun"
    for flag in ("--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint"):
        assert given.get(flag) == want[flag], (
            f"{flag} should be {want[flag]!r}, got {given.get(flag)!r}. "
            "Hint: compare with training.torchrun_commands(...) for another cluster.")
    assert "--node-rank" not in given, (
        "leave out --node-rank: with --rdzv-backend c10d torch ignores it (only the static rendezvous reads it) "
        "and numbers the machines by sorting their host names, so every machine types the same line")
    assert given.get("script") == "ddp_train.py", "the command should end with the script: ddp_train.py"
    print("correct: the same line on every machine; each joins the c10d rendezvous and starts its ranks")
    return True


def _flags(argv: list[str]) -> dict[str, str]:
    """``{"--flag": value, "script": first positional}``; accepts ``--flag=value`` and underscores."""
    out, i = {}, 1
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            name = name.replace("_", "-")
            if not eq:
                i += 1
                value = argv[i] if i < len(argv) else ""
            out[name] = value
        elif "script" not in out:
            out["script"] = arg
        i += 1
    return out
