"""Chapter 12, beyond data parallel: measuring what each way of splitting a model communicates and
holds, while the chapter's ranks run (counting their collectives, watching FSDP2 gather its blocks).

The cost model the chapter's closing map is computed from, and the exercises' self-checks, are
pure and live in :mod:`distlab.teach.splitcost` (tested by mutation without a process group);
they are imported here, so the chapter reads all of them as ``beyond.<name>``. The models, the
splits and the training loops are in the chapter's cells.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .splitcost import (  # noqa: F401  (the pure part, re-exported: the chapter reads them as beyond.<name>)
    BYTES_PER_PARAM,
    RING_FACTOR,
    Cost,
    bubble_fraction,
    check_bubble,
    check_fsdp_bytes,
    check_tp_message,
    costs_table,
    strategy_costs,
    wire_bytes,
)

# --------------------------------------------------------------------------- counting collectives

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
