"""What the collectives should compute: the references chapter 5 checks its ranks against, and more.

Chapter 5 runs every collective on real ranks and checks each result against the *reference* here:
a few lines of plain tensor code that say what the collective means, with the ranks' tensors in a
list (``before[r]`` is rank ``r``'s tensor). ``None`` in a result means "this rank gets nothing"
(or, for ``reduce`` off the destination, "undefined": the backend may use it as scratch space).

Also here, as plain arithmetic: the segments the ring cuts a tensor into, nccl-tests' bandwidth
definitions and the all-reduce benchmark's input and expected sum, the backend-support tables,
and the chapter's exercise self-checks. Nothing here starts, joins or talks to a rank: the code
that runs on ranks is in :mod:`distlab.teach.collectives`.
"""
from __future__ import annotations

import functools
import html

import torch

OPS = ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR")
BITWISE = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}


def op_name(op) -> str:
    """``"SUM"`` for ``dist.ReduceOp.SUM`` or ``"sum"``: references take either."""
    name = getattr(op, "name", op)
    name = str(name).upper()
    if name not in OPS:
        raise ValueError(f"unknown reduce op {op!r}; the references know {', '.join(OPS)}")
    return name


def combine(tensors: list, op="SUM") -> torch.Tensor:
    """Element-wise reduction of equally shaped tensors: what every reduce-like collective computes."""
    stacked = torch.stack([torch.as_tensor(t) for t in tensors])
    name = op_name(op)
    if name == "SUM":
        return stacked.sum(0)
    if name == "AVG":
        return stacked.sum(0) / len(tensors)
    if name == "PRODUCT":
        return stacked.prod(0)
    if name in BITWISE:  # integer tensors only
        return functools.reduce(BITWISE[name], stacked.unbind(0))
    return stacked.amin(0) if name == "MIN" else stacked.amax(0)


# --- references: list of per-rank inputs -> list of per-rank results ------------------------------

def ref_broadcast(before: list, src: int = 0) -> list:
    """Every rank ends with ``src``'s tensor."""
    return [before[src].clone() for _ in before]


def ref_scatter(before: list, src: int = 0) -> list:
    """Rank ``r`` receives piece ``r`` of the list that only ``src`` holds (``before[src]``)."""
    return [piece.clone() for piece in before[src]]


def ref_gather(before: list, dst: int = 0) -> list:
    """``dst`` ends with a *list*: one tensor per rank, in rank order. The others get nothing."""
    return [[t.clone() for t in before] if r == dst else None for r in range(len(before))]


def ref_reduce(before: list, dst: int = 0, op="SUM") -> list:
    """``dst`` ends with *one* combined tensor; the other ranks' buffers are undefined (``None``)."""
    return [combine(before, op) if r == dst else None for r in range(len(before))]


def ref_all_reduce(before: list, op="SUM") -> list:
    """Every rank ends with the combined tensor."""
    return [combine(before, op) for _ in before]


def ref_all_gather(before: list) -> list:
    """Every rank ends with the list of all ranks' tensors."""
    return [[t.clone() for t in before] for _ in before]


def ref_reduce_scatter(before: list, op="SUM") -> list:
    """``before[r]`` is rank r's list of n pieces; rank ``i`` ends with piece ``i`` combined over ranks."""
    n = len(before)
    return [combine([before[r][i] for r in range(n)], op) for i in range(n)]


def ref_all_to_all(before: list) -> list:
    """``before[r][i]`` goes from rank r to rank i: a transpose of the ranks-by-pieces table."""
    n = len(before)
    return [[before[r][i].clone() for r in range(n)] for i in range(n)]


def ref_group_all_reduce(before: list, ranks: list, op="SUM") -> list:
    """An all-reduce inside the group ``ranks``: members get their combined tensor, the rest keep theirs."""
    total = combine([before[r] for r in ranks], op)
    return [total.clone() if r in ranks else t.clone() for r, t in enumerate(before)]


def ref_barrier(before: list) -> list:
    """A barrier moves no data: every tensor is left as it was."""
    return [t.clone() for t in before]


REFERENCES = {
    "broadcast": ref_broadcast, "scatter": ref_scatter, "gather": ref_gather, "reduce": ref_reduce,
    "all_reduce": ref_all_reduce, "all_gather": ref_all_gather, "reduce_scatter": ref_reduce_scatter,
    "all_to_all": ref_all_to_all, "barrier": ref_barrier, "group_all_reduce": ref_group_all_reduce,
}


def same(a, b) -> bool:
    """Equal values and structure: tensors (close), lists of tensors, or ``None``."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(same(x, y) for x, y in zip(a, b, strict=True)))
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return a.shape == b.shape and torch.allclose(a.double(), b.double())


def per_rank(returns: dict, name: str) -> tuple[list, list]:
    """``(before, after)`` lists, indexed by rank, from runs that returned ``{name: (before, after)}``."""
    ranks = sorted(returns)
    return [returns[r][name][0] for r in ranks], [returns[r][name][1] for r in ranks]


def defined_only(after: list, expected: list) -> list:
    """``after`` with ``None`` where the reference promises nothing: what a diagram should show."""
    return [got if want is not None else None for got, want in zip(after, expected, strict=True)]


def check_against_reference(name: str, before: list, after: list, **kwargs) -> list:
    """Assert that what the ranks ended with (``after``) is what the reference computes.

    Ranks where the reference says ``None`` (nothing, or undefined) are not compared.
    Returns the reference's result so a chapter can draw it.
    """
    expected = REFERENCES[name](before, **kwargs)
    assert len(after) == len(expected), f"{name}: {len(after)} ranks reported, expected {len(expected)}"
    for rank, (got, want) in enumerate(zip(after, expected, strict=True)):
        if want is not None:
            assert same(got, want), f"{name}: rank {rank} ended with {got}, the reference says {want}"
    return expected


# --- the ring's geometry ------------------------------------------------------------------------------

def ring_segments(numel: int, n: int) -> list[tuple[int, int]]:
    """(start, stop) of the n segments the ring cuts a tensor of ``numel`` elements into."""
    bounds = [0] + [t.numel() for t in torch.tensor_split(torch.empty(numel), n)]
    ends = torch.tensor(bounds).cumsum(0).tolist()
    return list(zip(ends[:-1], ends[1:], strict=True))


# --- bandwidth, the way nccl-tests defines it --------------------------------------------------------

def algbw(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth (bytes/s): the tensor's size over the time one all-reduce takes."""
    return nbytes / seconds


def busbw(nbytes: int, seconds: float, n: int) -> float:
    """Bus bandwidth (bytes/s) of an all-reduce: algbw x 2(n-1)/n, nccl-tests' definition.

    Each rank must send (and receive) 2(n-1)/n of the tensor, so busbw is what every rank's link
    really carried; it is comparable across world sizes and with the hardware's peak.
    """
    return algbw(nbytes, seconds) * 2 * (n - 1) / n


def bench_input(numel: int, rank: int) -> torch.Tensor:
    """Small integers in float32, so sums are exact and a misplaced chunk cannot go unnoticed."""
    return (torch.arange(numel) % 251).float() + rank


def bench_expected(numel: int, n: int) -> torch.Tensor:
    """The all-reduce (sum) of :func:`bench_input` over ranks 0..n-1."""
    return (torch.arange(numel) % 251).float() * n + n * (n - 1) // 2


# --- what each backend supports: measured here, and what the PyTorch documentation says -------------

DOCS_BACKENDS_URL = "https://pytorch.org/docs/stable/distributed.html#backends"
TABLE_ROWS = ("send/recv", "broadcast", "all_reduce", "reduce", "all_gather", "gather", "scatter",
              "reduce_scatter", "all_to_all", "barrier", "batch_isend_irecv")
# The "Backends" table of the torch.distributed documentation (gloo CPU and NCCL GPU columns: all ✓),
# and the batch_isend_irecv docstring ("NCCL, Gloo, and UCC backend are currently supported").
DOCS_GLOO_CPU = dict.fromkeys(TABLE_ROWS, "✓")
DOCS_NCCL_GPU = dict.fromkeys(TABLE_ROWS, "✓")
# The torch.distributed.ReduceOp docstring: AVG "is only available with the NCCL backend" (NCCL >= 2.10),
# BAND/BOR/BXOR "are not available when using the NCCL backend".
DOCS_OPS_GLOO = {"SUM": "✓", "PRODUCT": "✓", "MIN": "✓", "MAX": "✓", "AVG": "✘ (NCCL only)",
                 "BAND": "✓", "BOR": "✓", "BXOR": "✓"}
DOCS_OPS_NCCL = {"SUM": "✓", "PRODUCT": "✓", "MIN": "✓", "MAX": "✓", "AVG": "✓ (NCCL ≥ 2.10)",
                 "BAND": "✘", "BOR": "✘", "BXOR": "✘"}


def _mark(error) -> str:
    return "✓" if error is None else f"✘ <code>{html.escape(str(error)[:60])}</code>"


def html_table(header: list, rows: list) -> str:
    """A small HTML table: renders the same in Jupyter and in the built book (markdown tables in
    cell outputs need a non-default myst-nb setting, so HTML it is)."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def support_table(measured: dict, backend: str) -> str:
    """Each collective as measured here (``measured[name]`` = None or the error) and per the docs."""
    rows = [[f"<code>{name}</code>", _mark(measured.get(name, "not run")), DOCS_GLOO_CPU[name], DOCS_NCCL_GPU[name]]
            for name in TABLE_ROWS]
    return html_table(["collective", f"measured here ({backend})", "gloo, CPU (docs)", "NCCL, GPU (docs)"], rows)


def ops_table(measured: dict, backend: str) -> str:
    """Each ReduceOp in all_reduce as measured here, and per the ReduceOp docstring."""
    rows = [[f"<code>{op}</code>", _mark(measured.get(op, "not run")), DOCS_OPS_GLOO[op], DOCS_OPS_NCCL[op]]
            for op in OPS]
    return html_table(["ReduceOp", f"measured here ({backend})", "gloo (docstring)", "NCCL (docstring)"], rows)


# --- exercise self-checks ----------------------------------------------------------------------------

EXERCISE_RS_INPUT = [[torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([3.0])],
                     [torch.tensor([10.0]), torch.tensor([20.0]), torch.tensor([30.0])],
                     [torch.tensor([100.0]), torch.tensor([200.0]), torch.tensor([300.0])]]

SCENARIOS = {
    "every rank needs the sum of all ranks' gradients": "all_reduce",
    "rank 0 read the data set and hands each rank its own shard": "scatter",
    "rank 0 wants every rank's validation loss, as a list, to log them": "gather",
    "every rank must start from rank 0's freshly initialised weights": "broadcast",
    "each rank keeps only the summed gradients of the parameters it owns (ZeRO)": "reduce_scatter",
}


def check_reduce_scatter(answer: list) -> None:
    """Exercise: what does each of the 3 ranks hold after ``reduce_scatter`` of EXERCISE_RS_INPUT (SUM)?"""
    expected = ref_reduce_scatter(EXERCISE_RS_INPUT)
    if len(answer) != len(expected):
        raise AssertionError(f"Give one value per rank: {len(expected)} ranks.")
    for rank, (got, want) in enumerate(zip(answer, expected, strict=True)):
        if not same(torch.as_tensor(got, dtype=torch.float32).reshape(-1), want):
            raise AssertionError(f"Rank {rank}: not {got}. Rank i receives piece i of every rank's list, "
                                 "summed over the ranks.")
    print("correct:", [w.item() for w in expected])


def check_ring_bytes(answer: float, n: int = 8, nbytes: int = 64 * 2**20) -> None:
    """Exercise: how many bytes does each rank send in a ring all-reduce of ``nbytes`` on ``n`` ranks?"""
    expected = 2 * (n - 1) / n * nbytes
    if abs(answer - expected) > 1e-6 * expected:
        raise AssertionError(f"Not {answer}. Count the steps: n-1 in the reduce-scatter and n-1 in the "
                             "all-gather, each sending one segment of nbytes/n.")
    print(f"correct: 2(n-1)/n x {nbytes} = {expected:.0f} bytes, which is why busbw = algbw x 2(n-1)/n")


def check_bandwidth(algbw_gbps: float, busbw_gbps: float, n: int = 8, nbytes: int = 64 * 2**20,
                    seconds: float = 0.010) -> None:
    """Exercise: algbw and busbw (GB/s, 1 GB = 1e9 bytes) of an all-reduce of ``nbytes`` in ``seconds``."""
    want_alg, want_bus = algbw(nbytes, seconds) / 1e9, busbw(nbytes, seconds, n) / 1e9
    if abs(algbw_gbps - want_alg) > 0.02 * want_alg:
        raise AssertionError(f"algbw: not {algbw_gbps}. algbw = bytes / seconds (then / 1e9 for GB/s).")
    if abs(busbw_gbps - want_bus) > 0.02 * want_bus:
        raise AssertionError(f"busbw: not {busbw_gbps}. busbw = algbw x 2(n-1)/n with n = {n}.")
    print(f"correct: algbw {want_alg:.2f} GB/s, busbw {want_bus:.2f} GB/s")


def check_which_collective(answers: dict) -> None:
    """Exercise: name the collective for each scenario in SCENARIOS."""
    for scenario, want in SCENARIOS.items():
        got = answers.get(scenario)
        if got != want:
            raise AssertionError(f"{scenario!r}: not {got!r}. Who has the data before, and who needs what after?")
    print("correct: all", len(SCENARIOS), "scenarios")


def check_group_all_reduce(returns: dict, ranks: list, op: str) -> None:
    """Exercise 4: ``returns[r]`` is rank r's ``(before, after)`` of an all-reduce with ``op`` in the group
    ``ranks``; checked against :func:`ref_group_all_reduce` (ranks outside keep their tensor)."""
    before, after = per_rank(returns, "result")
    check_against_reference("group_all_reduce", before, after, ranks=ranks, op=op)
    print(f"correct: ranks {ranks} hold the {op_name(op)} of their tensors; the others kept theirs.")
