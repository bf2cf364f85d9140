"""Findings from the events the ranks recorded: pure, one function per kind of mistake.

Input: ``ranks[rank] = [event, ...]`` in the order that rank wrote them (:func:`by_rank` builds it
from each process's events). An event is a dict with ``k`` (its kind), ``file`` and ``line`` (the
learner's innermost line) and what its hook adds (see :mod:`distlab.check.hooks`). Each detector
reports only what the events prove: a finding is never a guess.
"""
from __future__ import annotations

from collections import defaultdict

from distlab.check.report import Finding

KINDS = (
    "no-sampler", "set-epoch-missing", "every-rank-saves", "module-prefix", "accumulation-without-no-sync",
    "gradients-not-synchronized", "padded-evaluation", "batchnorm-small-batch", "mismatched-collectives", "hang",
    "timeout", "script-error",
)
SMALL_BATCH = 8  # samples per rank below which BatchNorm's statistics come from too few samples

NO_SAMPLER = (
    "Every rank trains on the same samples ({overlap}): this DataLoader has no DistributedSampler, so each "
    "rank goes through the whole data set and {world} ranks do the work of one. Give it "
    "sampler=DistributedSampler(dataset) (and no shuffle=True: the sampler shuffles)."
)
SET_EPOCH_MISSING = (
    "A shuffling DistributedSampler went through {n} epochs with the same order: its epoch stayed "
    "{epoch}, and the order is drawn from seed + epoch. Call sampler.set_epoch(epoch) before each epoch's loop."
)
EVERY_RANK_SAVES = (
    "Ranks {ranks} all write {name}: they race to write the same file (a reader may find one rank's "
    "half-written bytes), and the work is done {n} times. Save on one rank: if dist.get_rank() == 0: "
    "torch.save(...), then dist.barrier() before anyone loads it."
)
MODULE_PREFIX = (
    "This saves the DDP wrapper's state_dict(): every key starts with 'module.', and a plain model's "
    "load_state_dict() refuses them (unexpected keys). Save model.module.state_dict() instead."
)
ACCUMULATION = (
    "{n} backward passes per optimizer step, and DDP all-reduced the gradients after each of them: "
    "{wasted} of every {n} all-reduces are wasted. Run all but the last micro-batch inside "
    "`with model.no_sync():`, so only the last backward all-reduces."
)
NOT_SYNCHRONIZED = (
    "The parameters were the same on every rank before the first step and differ after step {step}: "
    "each rank applied its own gradients, so the ranks train {world} different models. Wrap the model "
    "in DistributedDataParallel (or all-reduce the gradients before optimizer.step())."
)
PADDED = (
    "This DistributedSampler pads its {total} samples with {padded} repeated one(s), so that every rank "
    "gets as many: an evaluation over all ranks counts {padded} sample(s) twice. Count only the real "
    "samples (e.g. each rank takes range(rank, len(dataset), world_size)), or use a size divisible by {world}."
)
MISMATCHED = (
    "The ranks' collective number {i} differs: {calls}. A collective pairs the i-th call of every "
    "rank, so these ranks exchange the wrong tensors or wait forever. Make every rank call the same "
    "collectives, with the same shapes, in the same order."
)
HANG = (
    "The ranks stopped making progress: {calls}. A collective returns only when every rank calls it: "
    "look for one that only some ranks reach (inside an `if rank == ...`, or after a loop of different "
    "length on each rank)."
)
TIMEOUT = (
    "The script had not finished after {timeout:g} s: {calls}. Give it a smaller run (fewer epochs or "
    "samples), steps= to stop after that many optimizer steps, or a longer timeout=."
)
BATCHNORM = (
    "This DDP model has {layers} BatchNorm layer(s), and each rank trains on {batch} sample(s) a step: "
    "every BatchNorm normalizes with the mean and variance of its own rank's {batch} samples, not of the "
    "{total} of the step. Convert them before wrapping: model = nn.SyncBatchNorm.convert_sync_batchnorm(model), "
    "or give each rank at least {small} samples."
)
SCRIPT_ERROR = "The script raised {error}. Fix it first: the other checks need it to run."


def by_rank(processes: list[list[dict]]) -> dict[int, list[dict]]:
    """Each process's events under its rank: the rank ``init_process_group`` gave it, else the one
    its events carry (torchrun's RANK). A process with no rank (the one that calls mp.spawn) drops."""
    ranks: dict[int, list[dict]] = {}
    for events in processes:
        rank = next((e["rank"] for e in events if e.get("k") == "init"), None)
        if rank is None:
            rank = next((e["rank"] for e in events if e.get("rank") is not None), None)
        if rank is not None and rank not in ranks:
            ranks[rank] = events
    return dict(sorted(ranks.items()))


def find_all(ranks: dict[int, list[dict]], timeout: float = 0.0) -> list[Finding]:
    """Every detector, in the order a learner should fix what they find."""
    found = []
    for detect in (hang, mismatched_collectives, script_error, no_sampler, set_epoch_missing, padded_evaluation,
                   gradients_not_synchronized, accumulation_without_no_sync, every_rank_saves, module_prefix,
                   batchnorm_small_batch):
        found += detect(ranks, timeout) if detect is hang else detect(ranks)
    return found


def _of(events, kind):
    return [e for e in events if e.get("k") == kind]


def _grouped(kind, hits, message) -> list[Finding]:
    """One finding per learner line, naming every rank that hit it: hits are (rank, event, fields)."""
    by_line: dict = defaultdict(list)
    for rank, event, fields in hits:
        by_line[(event.get("file", ""), event.get("line"))].append((rank, fields))
    return [Finding(kind, line, tuple(sorted({r for r, _ in items})), message.format(**items[0][1]), file)
            for (file, line), items in by_line.items()]


def _trained(events) -> set:
    """The epochs during which this rank ran a backward pass: training, not evaluation."""
    return {ep for e in _of(events, "backward") for ep in e.get("eps", [])}


def _epochs(events) -> list[tuple[dict, dict | None]]:
    """Each epoch's start event with its end event (None if the rank stopped inside it)."""
    ends = {e["ep"]: e for e in _of(events, "epoch-end")}
    return [(e, ends.get(e["ep"])) for e in _of(events, "epoch")]


def no_sampler(ranks) -> list[Finding]:
    """The first trained epoch of each loader without a DistributedSampler, compared across ranks
    that hold the same data set: the same samples drawn on two ranks (more than a sampler's padding),
    or every rank drawing all of them."""
    world, first = len(ranks), defaultdict(dict)
    for rank, events in ranks.items():
        loaders, trained = {e["loader"]: e for e in _of(events, "loader")}, _trained(events)
        for start, end in _epochs(events):
            made = loaders.get(start.get("loader"))
            if made and end and not start["distributed"] and start["ep"] in trained:
                first[start["loader"]].setdefault(rank, (made, end))
    found = []
    for seen in first.values():
        data = {m["data"] for m, _ in seen.values()}
        if len(seen) < 2 or world < 2 or len(data) != 1 or None in data:
            continue
        sets = {r: set(end["indices"]) for r, (_, end) in seen.items()}
        overlap = len(set.intersection(*sets.values()))
        size = int(seen[min(seen)][0]["data"].split(":")[0])
        whole = all(end["drawn"] >= size for _, end in seen.values())
        if overlap > world or whole:
            made = seen[min(seen)][0]
            text = f"{overlap} of the first {min(map(len, sets.values()))} indices drawn on rank {min(seen)} " \
                   f"were drawn on every rank"
            found += _grouped("no-sampler", [(r, made, {"overlap": text, "world": world}) for r in seen], NO_SAMPLER)
    return found


def set_epoch_missing(ranks) -> list[Finding]:
    """Two trained epochs of one shuffling DistributedSampler with the same epoch number."""
    hits = []
    for rank, events in ranks.items():
        trained, last = _trained(events), {}
        for start, _ in _epochs(events):
            if not (start["distributed"] and start.get("shuffle") and start["ep"] in trained):
                continue
            loader = start.get("loader")
            before = last.get(loader)
            if before is not None and before["epoch"] == start["epoch"]:
                before["n"] = before.get("n", 1) + 1
                hits.append((rank, before["start"], {"n": before["n"], "epoch": start["epoch"]}))
            else:
                last[loader] = {"epoch": start["epoch"], "start": start}
    best = {}
    for rank, start, fields in hits:  # one hit per rank and line, with the most epochs seen
        best[(rank, start.get("file"), start.get("line"))] = (rank, start, fields)
    return _grouped("set-epoch-missing", best.values(), SET_EPOCH_MISSING)


def padded_evaluation(ranks) -> list[Finding]:
    """An epoch of a padding DistributedSampler with no backward pass in it (evaluation), on 2+ ranks."""
    if len(ranks) < 2:
        return []
    hits = []
    for rank, events in ranks.items():
        trained = _trained(events)
        for start, end in _epochs(events):
            if start["distributed"] and start.get("padded") and end and start["ep"] not in trained:
                total = end["drawn"] * len(ranks) - start["padded"]
                hits.append((rank, start, {"total": total, "padded": start["padded"], "world": len(ranks)}))
    return _grouped("padded-evaluation", hits, PADDED)


def every_rank_saves(ranks) -> list[Finding]:
    """One file written by two ranks or more."""
    writers: dict = defaultdict(dict)
    for rank, events in ranks.items():
        for e in _of(events, "save"):
            if e.get("path"):
                writers[e["path"]].setdefault(rank, e)
    found = []
    for path, by in writers.items():
        if len(by) > 1:
            first, name = by[min(by)], path.rsplit("/", 1)[-1]
            fields = {"ranks": ", ".join(map(str, sorted(by))), "name": name, "n": len(by)}
            found.append(Finding("every-rank-saves", first.get("line"), tuple(sorted(by)),
                                 EVERY_RANK_SAVES.format(**fields), first.get("file", "")))
    return found


def module_prefix(ranks) -> list[Finding]:
    """A ``torch.save`` of a state_dict that ``DistributedDataParallel.state_dict()`` returned."""
    hits = [(r, e, {}) for r, events in ranks.items() for e in _of(events, "save") if e.get("ddp_state")]
    return _grouped("module-prefix", hits, MODULE_PREFIX)


def accumulation_without_no_sync(ranks) -> list[Finding]:
    """Two or more backward passes between optimizer steps that each followed a synchronizing DDP forward."""
    hits = []
    for rank, events in ranks.items():
        pending, synced = {}, defaultdict(list)
        for e in events:
            if e["k"] == "forward":
                pending[e["model"]] = e["sync"]
            elif e["k"] == "backward":
                for model in [m for m, sync in pending.items() if sync]:
                    synced[model].append(e)
                pending.clear()
            elif e["k"] == "step":
                for passes in synced.values():
                    if len(passes) >= 2:
                        hits.append((rank, passes[0], {"n": len(passes), "wasted": len(passes) - 1}))
                synced.clear()
    return _grouped("accumulation-without-no-sync", _first_per_line(hits), ACCUMULATION)


def batchnorm_small_batch(ranks) -> list[Finding]:
    """A DDP model with plain BatchNorm layers trained with fewer than SMALL_BATCH samples a rank."""
    if len(ranks) < 2:
        return []
    hits = []
    for rank, events in ranks.items():
        made = {e["model"]: e for e in _of(events, "ddp") if e.get("batchnorm")}
        small = [e for e in _of(events, "forward") if e.get("model") in made and e.get("batch")]
        if small and min(e["batch"] for e in small) < SMALL_BATCH:
            batch, model = min((e["batch"], e["model"]) for e in small)
            fields = {"layers": made[model]["batchnorm"], "batch": batch, "total": batch * len(ranks),
                      "small": SMALL_BATCH}
            hits.append((rank, made[model], fields))
    return _grouped("batchnorm-small-batch", hits, BATCHNORM)


def _first_per_line(hits):
    seen = {}
    for rank, event, fields in hits:
        seen.setdefault((rank, event.get("file"), event.get("line")), (rank, event, fields))
    return list(seen.values())


def _differ(a: dict, b: dict) -> bool:
    return any(abs(x - y) > 1e-7 * max(s, 1e-12) for x, y, s in zip(a["sums"], b["sums"], a["scale"], strict=False))


def gradients_not_synchronized(ranks) -> list[Finding]:
    """An optimizer's parameters equal on every rank before its first step and different after one."""
    if len(ranks) < 2:
        return []
    params = {r: {(e["opt"], e["step"]): e for e in _of(events, "params")} for r, events in ranks.items()}
    steps = {r: {(e.get("opt"), e.get("step")): e for e in _of(events, "step")} for r, events in ranks.items()}
    found = []
    for opt in sorted({o for table in params.values() for o, s in table if s == 0}):
        before = [table.get((opt, 0), {}).get("p") for table in params.values()]
        if None in before or any(p["shapes"] != before[0]["shapes"] or _differ(p, before[0]) for p in before):
            continue
        for step in range(1, 1 + max(s for table in params.values() for _, s in table)):
            after = [table.get((opt, step), {}).get("p") for table in params.values()]
            if None in after or not any(_differ(p, after[0]) for p in after):
                continue
            where = steps[min(ranks)].get((opt, step), {})
            found.append(Finding("gradients-not-synchronized", where.get("line"), tuple(ranks),
                                 NOT_SYNCHRONIZED.format(step=step, world=len(ranks)), where.get("file", "")))
            break
    return found


def _signature(e: dict) -> tuple:
    return e["op"], str(e.get("tensors"))


def first_mismatch(ranks) -> dict[int, dict]:
    """Each rank's call at the first position where the ranks' collectives on the default group
    differ (op or tensors); empty when they agree."""
    calls = {r: [(n, e) for n, e in enumerate(events) if e.get("k") == "collective"] for r, events in ranks.items()}
    if len(calls) < 2:
        return {}
    for i in range(min(map(len, calls.values()))):
        at = {r: c[i] for r, c in calls.items()}
        if len({_signature(e) for _, e in at.values()}) > 1:
            return {r: dict(e, position=i, index=n) for r, (n, e) in at.items()}
    return {}


def mismatched_collectives(ranks) -> list[Finding]:
    """The first collective the ranks call differently, with each rank's line."""
    at = first_mismatch(ranks)
    if not at:
        return []
    text = "; ".join(f"rank {r} calls {e['op']}{_shapes(e)} at {_line(e)}" for r, e in at.items())
    first = at[min(at)]
    return [Finding("mismatched-collectives", first.get("line"), tuple(at),
                    MISMATCHED.format(i=first["position"] + 1, calls=text), first.get("file", ""),
                    {r: (e.get("file", ""), e.get("line")) for r, e in at.items()})]


def _shapes(e: dict) -> str:
    return "(" + ", ".join(f"{t[1]}{t[0]}" for t in e.get("tensors") or []) + ")"


def _line(e: dict) -> str:
    return (f"{e['file']} " if e.get("file") else "") + f"line {e.get('line')}"


def hang(ranks, timeout: float = 0.0) -> list[Finding]:
    """Where each rank was when the deadline passed: a hang if one waited in a collective or a
    backward pass (or had already left), else a run that was too long for the check."""
    where = {r: _of(events, "where")[-1] for r, events in ranks.items() if _of(events, "where")}
    if not where:
        return []
    parts, lines = [], {}
    for rank, events in ranks.items():
        w = where.get(rank)
        if w is None:
            parts.append(f"rank {rank} had " + ("finished" if _of(events, "end") else "stopped"))
            continue
        lines[rank] = (w.get("file", ""), w.get("line"))
        parts.append(f"rank {rank} " + (f"waits in {w['waiting']} at " if w.get("waiting") else "is at ") + _line(w))
    stuck = any(w.get("waiting") for w in where.values()) or len(where) < len(ranks)
    kind, text = ("hang", HANG) if stuck else ("timeout", TIMEOUT)
    first = where[min(where)]
    return [Finding(kind, first.get("line"), tuple(where), text.format(calls="; ".join(parts), timeout=timeout),
                    first.get("file", ""), lines)]


def script_error(ranks) -> list[Finding]:
    """An exception that ended a rank, at its innermost line in the learner's files; not one that
    follows a hang's deadline or a mismatched collective (those wake the other ranks with errors)."""
    mismatch, hits = first_mismatch(ranks), []
    for rank, events in ranks.items():
        after = mismatch[rank]["index"] if rank in mismatch else None
        for n, e in enumerate(events):
            if e.get("k") == "error" and not _of(events, "where") and (after is None or n < after):
                hits.append((rank, e, {"error": e["error"]}))
    return _grouped("script-error", hits, SCRIPT_ERROR)
