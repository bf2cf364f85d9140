"""Chapter 12's cost model, apart from the tools that count a live run's collectives
(:mod:`distlab.teach.beyond`): the bytes one rank sends for given messages in a ring, the memory and
communication per rank of each way of splitting a model (the chapter's closing map), and the
exercises' self-checks.

Pure: numbers and text only, so that the mutation run (``[tool.mutmut]``) tests it without a process group.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from distlab.teach import answers

#: ring cost per rank, as a multiple of the message size n (nccl-tests' "bus bandwidth" factors)
RING_FACTOR = {"all_reduce": lambda w: 2 * (w - 1) / w, "all_gather": lambda w: (w - 1) / w,
               "reduce_scatter": lambda w: (w - 1) / w, "broadcast": lambda w: 1.0,
               "send": lambda w: 1.0, "recv": lambda w: 0.0}


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


def _close(answer, expected: float) -> bool:
    """Whether ``answer`` is right: chapter 12's byte counts are exact: within 0.1 %."""
    return answers.close(answer, expected, rel=1e-3, floor=1e-12)


def check_fsdp_bytes(answer, psi: int, world: int) -> bool:
    """Exercise 1: model-state bytes per rank under FSDP2 with fp32 Adam."""
    if answers.unanswered(answer, "a number of bytes"):
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
    if answers.unanswered(answer, "a number of bytes"):
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
    if answers.unanswered(answer, "a fraction between 0 and 1"):
        return False
    expected = bubble_fraction(stages, microbatches)
    assert _close(answer, expected), (
        f"Not quite: {answer!r}. Count the time slots of one phase: the last micro-batch leaves the last stage "
        "after M + S - 1 slots, and each stage worked in M of them.")
    print(f"correct: {expected:.3f}; more micro-batches shrink it (M = 32 gives {bubble_fraction(stages, 32):.3f})")
    return True
