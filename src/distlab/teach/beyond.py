"""Chapter 12, beyond data parallel: measuring what each way of splitting a model communicates and
holds, the cost model the chapter's closing map is computed from, and the exercises' self-checks.

Only measurement and prediction live here; the models, the splits and the training loops are in
the chapter's cells.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# --------------------------------------------------------------------------- counting collectives

#: ring cost per rank, as a multiple of the message size n (nccl-tests' "bus bandwidth" factors)
RING_FACTOR = {"all_reduce": lambda w: 2 * (w - 1) / w, "all_gather": lambda w: (w - 1) / w,
               "reduce_scatter": lambda w: (w - 1) / w, "broadcast": lambda w: 1.0,
               "send": lambda w: 1.0, "recv": lambda w: 0.0}

_KINDS = {"allreduce_": "all_reduce", "all_reduce": "all_reduce", "all_reduce_": "all_reduce",
          "_allgather_base_": "all_gather", "allgather_": "all_gather", "all_gather_into_tensor": "all_gather",
          "allgather_into_tensor_coalesced_": "all_gather", "all_gather_into_tensor_out": "all_gather",
          "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter",
          "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced_": "reduce_scatter",
          "broadcast_": "broadcast", "send": "send", "recv_": "recv", "recv_any_source_": "recv"}


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item)


class CollectiveBytes(TorchDispatchMode):
    """While active, count every collective and point-to-point operation that passes PyTorch's
    dispatcher, by kind, with its message size: the largest tensor it is given (an all-gather's
    output, a reduce-scatter's input, an all-reduce's buffer, a sent tensor).

    Why a dispatch mode: FSDP2, tensor parallelism (DTensor), pipelining and Python comm hooks
    each issue their collectives differently, but all of them end up as ``c10d`` or
    ``_c10d_functional`` operators, which a mode sees (DDP's reducer too: its all-reduce is a
    ``c10d.allreduce_`` call on the thread that runs backward). Not seen: what DTensor issues while
    it handles an operator itself (``loss_parallel``'s all-reduces, a norm of sharded gradients):
    a mode is switched off inside its own ``__torch_dispatch__``, so the operator it passed on runs
    without it; count those with ``torch.distributed.tensor.debug.CommDebugMode``.
    """

    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = {}
        self.bytes: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = _KINDS.get(func._overloadpacket.__name__) if func.namespace in ("c10d", "_c10d_functional") else None
        if kind is not None:
            size = max((t.numel() * t.element_size() for t in _tensors(list(args) + list((kwargs or {}).values()))),
                       default=0)
            self.calls[kind] = self.calls.get(kind, 0) + 1
            self.bytes[kind] = self.bytes.get(kind, 0) + size
        return func(*args, **(kwargs or {}))

    def wire_bytes(self, world_size: int) -> float:
        """Bytes one rank sends, in a ring implementation of each collective."""
        return sum(RING_FACTOR[k](world_size) * n for k, n in self.bytes.items())


class GatheredBlocks:
    """Count, each time one of ``blocks`` (FSDP2 modules) runs forward and each time its backward starts,
    how many of them hold their parameters whole: ``forward`` and ``backward``, in the order they ran.

    Why: the blocks gathered at once are FSDP2's memory above the shards, and prefetching is what
    raises the count. Why private state: a prefetched block's all-gather has been issued and its
    output allocated, but FSDP2 swaps the module's parameters to the whole ones only when the block
    runs, so the parameters alone would not show it; the parameter group's pending
    ``_all_gather_result`` does (``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``).
    """

    def __init__(self, blocks):
        self.blocks = list(blocks)
        self.forward: list[int] = []
        self.backward: list[int] = []
        self._handles = [h for b in self.blocks for h in (b.register_forward_pre_hook(self._as_forward_starts),
                                                           b.register_forward_hook(self._after_forward))]

    def count(self) -> int:
        """Blocks whose parameters are whole now, or whose all-gather is issued and not yet used."""
        groups = [b._get_fsdp_state()._fsdp_param_group for b in self.blocks]
        return sum(g is not None and (g._all_gather_result is not None or g.is_unsharded) for g in groups)

    def _as_forward_starts(self, module, inputs):
        # FSDP2's pre-forward hook is prepended (torch/distributed/fsdp/_fully_shard/_fsdp_state.py): it has
        # gathered this block already
        self.forward.append(self.count())

    def _after_forward(self, module, inputs, output):
        # FSDP2's post-forward hook ran first and put its pre-backward hook on this tensor: that one runs first
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad: self.backward.append(self.count()))

    def clear(self):
        self.forward.clear()
        self.backward.clear()

    def remove(self):
        for handle in self._handles:
            handle.remove()


def wire_bytes(bytes_by_kind: dict[str, float], world_size: int) -> float:
    """Bytes one rank sends for messages of these kinds and sizes, in a ring implementation."""
    return sum(RING_FACTOR[k](world_size) * n for k, n in bytes_by_kind.items())


# --------------------------------------------------------------------------- the closing map

BYTES_PER_PARAM = 16   # fp32 Adam: 4 (weights) + 4 (gradients) + 8 (two moments)


@dataclass(frozen=True)
class Cost:
    """Per rank and training step: model-state bytes held, bytes sent (ring), how the split is laid
    out, and the messages behind ``wire``: bytes per collective kind, as ``CollectiveBytes`` counts them."""

    memory: float
    wire: float
    layout: str
    messages: dict = field(default_factory=dict, compare=False)


def _tp_params(psi: int, depth: int, d: int, q: int) -> float:
    """Parameters a tensor-parallel rank holds: all but the row-wise layers' biases (``d`` per
    block, replicated) are split ``q`` ways."""
    return (psi - depth * d) / q + depth * d


def _fsdp_messages(params: float) -> dict[str, float]:
    """Two all-gathers (forward, backward) and one reduce-scatter of ``4 * params`` bytes."""
    return {"all_gather": 2 * 4 * params, "reduce_scatter": 4 * params}


def _tp_messages(depth: int, d: int, batch: int) -> dict[str, float]:
    """Per block one forward all-reduce of the activations and one backward (none for the first
    block's input): ``2 * depth - 1`` all-reduces of ``4 * batch * d`` bytes."""
    return {"all_reduce": (2 * depth - 1) * 4 * batch * d}


def _pp_messages(d: int, batch: int, stages: int) -> dict[str, float]:
    """A stage sends its output activations forward and its input's gradients back, and receives
    the other two; the first and last stage do one of each. The busiest rank's messages."""
    k = 1 if stages == 2 else 2
    return {"send": k * 4 * batch * d, "recv": k * 4 * batch * d}


def _cost(memory: float, layout: str, *messages_and_groups: tuple[dict[str, float], int]) -> Cost:
    """A Cost whose wire bytes are each message's ring cost in the group that carries it."""
    wire = sum(wire_bytes(m, group) for m, group in messages_and_groups)
    merged: dict[str, float] = {}
    for m, _ in messages_and_groups:
        for kind, n in m.items():
            merged[kind] = merged.get(kind, 0) + n
    return Cost(memory, wire, layout, merged)


def strategy_costs(psi: int, depth: int, d: int, batch: int, world: int) -> dict[str, Cost]:
    """Memory and communication per rank for each way of splitting a stack of ``depth`` MLP blocks
    of width ``d`` (``psi`` parameters) on ``world`` ranks; ``batch`` samples per data-parallel group.

    Combinations use a 2-D mesh of ``p x q = world`` ranks with ``q = 2``: FSDP2 over ``p``, and
    TP or PP over ``q``. A split that does not divide the model evenly is left out.
    """
    n, per = world, BYTES_PER_PARAM
    out = {"DDP": _cost(per * psi, f"{n} data", ({"all_reduce": 4 * psi}, n)),
           "FSDP2": _cost(per * psi / n, f"{n} shard", (_fsdp_messages(psi), n)),
           "TP": _cost(per * _tp_params(psi, depth, d, n), f"{n} tensor", (_tp_messages(depth, d, batch), n))}
    if depth % n == 0:
        out["PP"] = _cost(per * psi / n, f"{n} stages", (_pp_messages(d, batch, n), n))
    if n >= 4 and n % 2 == 0:
        p, q = n // 2, 2
        tp = _tp_params(psi, depth, d, q)
        out["FSDP2 x TP"] = _cost(per * tp / p, f"{p} shard x {q} tensor", (_fsdp_messages(tp), p),
                                  (_tp_messages(depth, d, batch), q))
        if depth % q == 0:
            out["FSDP2 x PP"] = _cost(per * psi / q / p, f"{p} shard x {q} stages", (_fsdp_messages(psi / q), p),
                                      (_pp_messages(d, batch, q), q))
    return out


def costs_table(costs: dict[str, Cost], measured: dict[str, tuple[float, float]] | None = None) -> str:
    """Text table of the map, in kB; ``measured`` adds (memory, wire) measured by the chapter."""
    measured = measured or {}
    head = f"{'split':12} {'layout':22} {'memory kB':>10} {'measured':>9} {'sent kB/step':>13} {'measured':>9}"
    lines = [head]
    for name, c in costs.items():
        m = measured.get(name)
        got = (f"{m[0] / 1e3:>9.1f}", f"{m[1] / 1e3:>9.1f}") if m else (f"{'':>9}", f"{'':>9}")
        lines.append(f"{name:12} {c.layout:22} {c.memory / 1e3:>10.1f} {got[0]} {c.wire / 1e3:>13.1f} {got[1]}")
    return "\n".join(line.rstrip() for line in lines)


# --------------------------------------------------------------------------- exercises


def _no_answer(answer, what: str) -> bool:
    if answer is None:
        print(f"No answer yet: replace None with {what}.")
        return True
    return False


def _close(answer, expected: float, rel: float = 1e-3) -> bool:
    try:
        return abs(float(answer) - expected) <= rel * abs(expected) + 1e-12
    except (TypeError, ValueError):
        return False


def check_fsdp_bytes(answer, psi: int, world: int) -> bool:
    """Exercise 1: model-state bytes per rank under FSDP2 with fp32 Adam."""
    if _no_answer(answer, "a number of bytes"):
        return False
    expected = BYTES_PER_PARAM * psi / world
    if _close(answer, BYTES_PER_PARAM * psi):
        raise AssertionError("That is what every DDP rank holds. FSDP2 shards all three kinds of state.")
    assert _close(answer, expected), (
        f"Not quite: {answer!r}. fp32 Adam keeps 4 + 4 + 8 bytes per parameter; FSDP2 divides all of it by the ranks.")
    print(f"correct: {expected / 1e9:.2f} GB per rank")
    return True


def check_tp_message(answer, tokens: int, d: int, bytes_per_element: int) -> bool:
    """Exercise 2: the size of one row-wise layer's all-reduce in a tensor-parallel block."""
    if _no_answer(answer, "a number of bytes"):
        return False
    expected = tokens * d * bytes_per_element
    assert _close(answer, expected), (
        f"Not quite: {answer!r}. The row-wise layer's partial outputs are summed: one value per token and feature.")
    print(f"correct: {expected / 2**20:.0f} MiB per all-reduce, twice per block and step (forward and backward)")
    return True


def bubble_fraction(stages: int, microbatches: int) -> float:
    """GPipe's idle fraction with equal-cost micro-batches: (S - 1) / (M + S - 1)."""
    return (stages - 1) / (microbatches + stages - 1)


def check_bubble(answer, stages: int, microbatches: int) -> bool:
    """Exercise 3: GPipe's bubble fraction."""
    if _no_answer(answer, "a fraction between 0 and 1"):
        return False
    expected = bubble_fraction(stages, microbatches)
    assert _close(answer, expected), (
        f"Not quite: {answer!r}. Count the time slots of one phase: the last micro-batch leaves the last stage "
        "after M + S - 1 slots, and each stage worked in M of them.")
    print(f"correct: {expected:.3f}; more micro-batches shrink it (M = 32 gives {bubble_fraction(stages, 32):.3f})")
    return True
