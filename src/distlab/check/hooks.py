"""Inside each rank: the hooks that turn what a script does into events, installed without editing it.

Each wraps one public torch name and records, then calls the original unchanged: ``DataLoader``
(made), ``BatchSampler.__iter__`` (an epoch of a loader: its sampler, the indices drawn),
``torch.autograd.backward``, ``DistributedDataParallel`` (made, ``forward``, ``no_sync``,
``state_dict``), the optimizer step hooks (``torch.optim.optimizer.register_optimizer_step_*_hook``),
``torch.save``, the collectives of ``torch.distributed``, ``init_process_group``, and
``torch.multiprocessing.spawn``/``start_processes`` (so the processes a script starts record too).
Runs in the ranks: imports nothing from distlab's front end.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib

INDICES_KEPT = 4096  # indices of an epoch written per rank: enough to see two ranks draw the same samples
PARAM_STEPS = 3  # steps after which the parameters are compared across ranks (and once before the first)
COLLECTIVES = (
    "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "reduce", "gather", "scatter", "barrier", "all_to_all", "all_to_all_single", "all_gather_object",
    "broadcast_object_list", "gather_object", "scatter_object_list",
)
POINT_TO_POINT = ("send", "recv")  # not paired by position (not recorded), but a rank can wait in them


def install(rec) -> None:
    """Every hook, once per process."""
    for hook in (_loaders, _epochs, _backward, _ddp, _optimizers, _save, _collectives, _spawn):
        hook(rec)


def _wrap(owner, name: str, make) -> None:
    original = getattr(owner, name)
    setattr(owner, name, functools.wraps(original)(make(original)))


def fingerprint(value, depth: int = 0):
    """A short hash of a sample's tensors and numbers, or None where it has none we can read."""
    import torch

    if isinstance(value, torch.Tensor):
        return hashlib.sha1(value.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:12]
    if isinstance(value, (int, float, str, bool)):
        return repr(value)
    if isinstance(value, (tuple, list)) and depth < 3:
        parts = [fingerprint(v, depth + 1) for v in value]
        return None if None in parts else "(" + ",".join(parts) + ")"
    if isinstance(value, dict) and depth < 3:
        return fingerprint([value[k] for k in sorted(value, key=str)], depth + 1)
    return None


def dataset_fingerprint(dataset) -> str | None:
    """Its length and two samples: equal on two ranks when they hold the same data set."""
    try:
        n = len(dataset)
        parts = [fingerprint(dataset[i]) for i in sorted({0, n // 2})] if n else []
    except Exception:
        return None
    return None if None in parts else f"{n}:" + ";".join(parts)


def _loaders(rec) -> None:
    from torch.utils.data import DataLoader, DistributedSampler

    def make(original):
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            n = rec.number("loader")
            if self.batch_sampler is not None:
                rec.loaders[id(self.batch_sampler)] = n
            rec.emit("loader", loader=n, sampler=type(self.sampler).__name__,
                     distributed=isinstance(self.sampler, DistributedSampler),
                     data=dataset_fingerprint(self.dataset))
        return __init__

    rec.loaders = {}
    _wrap(DataLoader, "__init__", make)


class Epoch:
    """One pass over a loader's batch sampler, as it is drawn."""

    def __init__(self, number: int):
        self.number, self.drawn, self.indices = number, 0, []

    def take(self, batch) -> None:
        self.drawn += len(batch)
        room = INDICES_KEPT - len(self.indices)
        if room > 0:
            self.indices.extend(int(i) for i in list(batch)[:room])


def _epochs(rec) -> None:
    from torch.utils.data import BatchSampler, DistributedSampler

    def begin(sampler) -> Epoch:
        epoch, inner = Epoch(rec.number("epoch")), sampler.sampler
        info = {"distributed": isinstance(inner, DistributedSampler)}
        if info["distributed"]:
            padded = 0 if inner.drop_last else inner.total_size - len(inner.dataset)
            info.update(shuffle=bool(inner.shuffle), epoch=int(inner.epoch), padded=padded)
        rec.emit("epoch", ep=epoch.number, loader=rec.loaders.get(id(sampler)), **info)
        rec.active.add(epoch)
        return epoch

    def make(original):
        def __iter__(self):
            epoch = begin(self)
            try:
                for batch in original(self):
                    epoch.take(batch)
                    yield batch
            finally:
                rec.active.discard(epoch)
                rec.emit("epoch-end", ep=epoch.number, drawn=epoch.drawn, indices=epoch.indices)
        return __iter__

    rec.active = set()
    _wrap(BatchSampler, "__iter__", make)


def _backward(rec) -> None:
    import torch

    def make(original):
        def backward(*args, **kwargs):
            rec.emit("backward", eps=sorted(e.number for e in rec.active))
            rec.waiting = "backward"
            try:
                return original(*args, **kwargs)
            finally:
                rec.waiting = None
        return backward

    _wrap(torch.autograd, "backward", make)


def _ddp(rec) -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    rec.models, rec.no_sync, rec.ddp_states = {}, {}, []

    def made(original):
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            rec.models[id(self)] = n = rec.number("model")
            norms = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)  # not SyncBatchNorm
            rec.emit("ddp", model=n, batchnorm=sum(isinstance(m, norms) for m in self.module.modules()))
        return __init__

    def forward(original):
        def forward(self, *args, **kwargs):
            if torch.is_grad_enabled():
                first = args[0] if args else None
                batch = len(first) if isinstance(first, torch.Tensor) and first.dim() and self.training else None
                rec.emit("forward", model=rec.models.get(id(self)), sync=not rec.no_sync.get(id(self)), batch=batch)
            return original(self, *args, **kwargs)
        return forward

    def no_sync(original):
        @contextlib.contextmanager
        def no_sync(self):
            with original(self):
                rec.no_sync[id(self)] = rec.no_sync.get(id(self), 0) + 1
                try:
                    yield
                finally:
                    rec.no_sync[id(self)] -= 1
        return no_sync

    def state_dict(original):
        def state_dict(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            rec.ddp_states[:] = [*rec.ddp_states[-15:], result]  # kept alive, so their ids stay theirs
            return result
        return state_dict

    for name, make in (("__init__", made), ("forward", forward), ("no_sync", no_sync), ("state_dict", state_dict)):
        _wrap(DDP, name, make)


def param_summary(optimizer) -> dict | None:
    """Shapes and float64 sums of an optimizer's parameters; None for sharded ones (DTensor), which
    differ across ranks by design."""
    import torch

    params = [p for group in optimizer.param_groups for p in group["params"]]
    if any(type(p.data) is not torch.Tensor for p in params):
        return None
    with torch.no_grad():
        sums = [float(p.detach().double().sum()) for p in params]
        scale = [float(p.detach().double().abs().sum()) for p in params]
    return {"shapes": [list(p.shape) for p in params], "sums": sums, "scale": scale}


def _optimizers(rec) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    rec.optimizers = {}

    def pre(optimizer, args, kwargs):
        if id(optimizer) not in rec.optimizers:
            rec.optimizers[id(optimizer)] = [rec.number("optimizer"), 0]
            rec.emit("params", opt=rec.optimizers[id(optimizer)][0], step=0, p=param_summary(optimizer))

    def post(optimizer, args, kwargs):
        entry = rec.optimizers.get(id(optimizer))
        if entry is None:
            return
        entry[1] += 1
        rec.emit("step", opt=entry[0], step=entry[1])
        if entry[1] <= PARAM_STEPS:
            rec.emit("params", opt=entry[0], step=entry[1], p=param_summary(optimizer))
        if rec.config.get("steps") and entry[0] == 0 and entry[1] >= rec.config["steps"]:
            rec.emit("step-limit", step=entry[1])
            raise SystemExit(0)  # every rank stops after the same step: nobody is left waiting

    register_optimizer_step_pre_hook(pre)
    register_optimizer_step_post_hook(post)


def saved_path(f) -> str | None:
    import os

    name = f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None)
    return os.path.realpath(os.fspath(name)) if isinstance(name, (str, os.PathLike)) else None


def _save(rec) -> None:
    import torch

    def make(original):
        def save(obj, f, *args, **kwargs):
            inside = list(obj.values()) if isinstance(obj, dict) else []
            ddp_state = any(any(v is s for s in rec.ddp_states) for v in [obj, *inside])
            rec.emit("save", path=saved_path(f), ddp_state=ddp_state)
            return original(obj, f, *args, **kwargs)
        return save

    _wrap(torch, "save", make)


def describe(args, kwargs) -> list:
    """The shapes and dtypes of a collective's tensors (or of the list of them it was given)."""
    import torch

    first = args[0] if args else next(iter(kwargs.values()), None)
    items = first if isinstance(first, (list, tuple)) else [first]
    return [[list(t.shape), str(t.dtype).replace("torch.", "")] for t in items if isinstance(t, torch.Tensor)]


def _collectives(rec) -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return

    def make_collective(name):
        def make(original):
            def collective(*args, **kwargs):
                group = kwargs.get("group")
                if name in COLLECTIVES and (group is None or group is dist.group.WORLD):
                    rec.emit("collective", op=name, tensors=describe(args, kwargs))
                rec.waiting = name
                try:
                    return original(*args, **kwargs)
                finally:
                    rec.waiting = None
            return collective
        return make

    def init(original):
        def init_process_group(*args, **kwargs):
            result = original(*args, **kwargs)
            rec.rank = dist.get_rank()
            rec.emit("init", world=dist.get_world_size(), backend=str(dist.get_backend()))
            return result
        return init_process_group

    for name in COLLECTIVES + POINT_TO_POINT:
        if hasattr(dist, name):
            _wrap(dist, name, make_collective(name))
    _wrap(dist, "init_process_group", init)


def _spawn(rec) -> None:
    import torch.multiprocessing as mp

    def make(original):
        def spawn(fn, *args, **kwargs):
            rec.emit("spawn")
            return original(rec.traced(fn), *args, **kwargs)
        return spawn

    for name in ("spawn", "start_processes"):
        _wrap(mp, name, make)
