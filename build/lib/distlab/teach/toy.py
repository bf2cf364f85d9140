"""Chapter 3: the article's basic DDP example, and checks of what DDP promises.

DDP keeps N copies of a model identical without ever comparing them: it makes them *start*
equal (a broadcast from rank 0 when it is constructed) and *step* equally (every rank gets the
same averaged gradient). These helpers turn the values ranks return into those two checks.
"""
from __future__ import annotations


def snapshot(module) -> dict:
    """A CPU copy of every parameter, safe to keep while training continues and to return from a rank."""
    return {name: p.detach().cpu().clone() for name, p in module.named_parameters()}


def max_abs_diff(a: dict, b: dict) -> float:
    """Largest absolute difference between two name -> tensor dicts with the same names."""
    if a.keys() != b.keys():
        raise KeyError(f"different names: {sorted(a)} vs {sorted(b)}")
    return max(float((a[k].cpu().float() - b[k].cpu().float()).abs().max()) for k in a)


def average(dicts: list[dict]) -> dict:
    """Element-wise mean of name -> tensor dicts: what an all-reduce(SUM) / world_size computes."""
    return {k: sum(d[k] for d in dicts) / len(dicts) for k in dicts[0]}


def drift(per_rank_history: dict[int, list[dict]]) -> list[float]:
    """Per step, the largest parameter difference between any rank and rank 0."""
    ranks = sorted(per_rank_history)
    steps = len(per_rank_history[ranks[0]])
    return [max(max_abs_diff(per_rank_history[r][s], per_rank_history[ranks[0]][s]) for r in ranks)
            for s in range(steps)]


# --- exercise self-checks ----------------------------------------------------------------------

def check_diverged(returns: dict, tolerance: float = 1e-6) -> None:
    """Exercise 1: ``returns`` maps rank -> that rank's final ``snapshot(ddp_model.module)``.
    Passes when the DDP replicas ended up different."""
    if len(returns) < 2 or any(v is None for v in returns.values()):
        raise AssertionError("Return snapshot(ddp_model.module) from every rank of a run with at least 2 ranks.")
    gap = max(max_abs_diff(returns[r], returns[0]) for r in returns)
    if gap <= tolerance:
        raise AssertionError(
            f"The replicas are still identical (largest difference {gap:.2e}). DDP averages gradients, so "
            "identical gradients are not enough to diverge: change what each rank does *with* them, or "
            "change the parameters outside DDP's view.")
    print(f"correct: the replicas differ by up to {gap:.2e}. DDP never compares parameters after construction; "
          "it only guarantees equal gradients, so anything else that differs per rank makes them drift.")


WHY_IDENTICAL = {
    "a": "DDP broadcasts rank 0's parameters after every optimizer step",
    "b": "the replicas start equal (broadcast at construction) and every rank applies the same averaged "
         "gradient with the same deterministic optimizer",
    "c": "all ranks see the same input data",
    "d": "the optimizer all-reduces the parameters in step()",
}


def check_why_identical(answer: str) -> None:
    """Exercise 2: why do DDP's replicas stay identical? One letter of ``WHY_IDENTICAL``."""
    key = str(answer).strip().lower()
    if key == "b":
        print("correct: equal start + equal gradients + the same update rule = equal parameters, step after step.")
        return
    hints = {
        "a": "DDP broadcasts parameters once, in its constructor; after that it sends gradients (and, by "
             "default, rank 0's buffers before each forward), never the parameters.",
        "c": "Each rank sees a different slice of the data; that is the point of data parallelism.",
        "d": "torch.optim knows nothing about other processes; DDP works in backward(), not in step().",
    }
    raise AssertionError(hints.get(key, f"Choose one of {sorted(WHY_IDENTICAL)}."))


WHICH_BUFFERS = {
    "a": "any rank's: DDP keeps the buffers identical on every rank",
    "b": "rank 0's: every forward starts from rank 0's buffers, so the other ranks' last updates would be "
         "overwritten anyway",
    "c": "the average over the ranks: DDP averages the buffers like the gradients",
}


def check_buffers_to_save(answer: str) -> None:
    """Exercise 3: after training with ``forward_sync_buffers=True`` (formerly ``broadcast_buffers``),
    whose BatchNorm statistics to save?"""
    key = str(answer).strip().lower()
    if key == "b":
        print("correct: the statistics that count are rank 0's (updated with rank 0's batches); the other ranks' "
              "copies carry one local update that the next forward would have replaced.")
        return
    hints = {
        "a": "Look at the table above: after each forward rank 1's running_mean differs from rank 0's.",
        "c": "DDP broadcasts buffers from rank 0, it does not average them (nn.SyncBatchNorm averages batch "
             "statistics inside each forward).",
    }
    raise AssertionError(hints.get(key, f"Choose one of {sorted(WHICH_BUFFERS)}."))
