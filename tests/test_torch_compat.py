"""The torch features the chapters use beyond distlab's floor: detection and what a chapter prints.

Pure: fakes stand for DDP's signature and for the ranks' error messages, so these run on any torch."""
from __future__ import annotations

import inspect

import pytest

from distlab.launch import compat


def test_release_reads_every_kind_of_torch_version_string():
    assert compat.release("2.11.0+cu128") == (2, 11)
    assert compat.release("2.13.0+cpu") == (2, 13)
    assert compat.release("2.16.0.dev20261201") == (2, 16)
    assert compat.release("2.9") == (2, 9)
    with pytest.raises(ValueError, match="not a torch version: 'nightly'"):
        compat.release("nightly")


def test_features_arrive_in_the_releases_read_in_the_wheels():
    ddp, gloo = "DDP(forward_sync_buffers=...)", "gloo all_to_all"
    assert [compat.has_since(ddp, v) for v in ("2.11.0+cu128", "2.12.1", "2.13.0+cpu", "2.15.0")] == [
        False, False, True, True]
    assert [compat.has_since(gloo, v) for v in ("2.9.1", "2.11.0+cu128", "2.12.0", "2.14.1")] == [
        False, False, True, True]
    v_on_one_rank = "pipeline stages side by side on one rank"
    assert [compat.has_since(v_on_one_rank, v) for v in ("2.11.0+cu130", "2.12.0", "2.15.0")] == [False, True, True]
    # a later major release is later, whatever its minor number
    assert compat.has_since(gloo, "3.0.0")


def test_the_needs_line_names_the_release_this_torch_and_what_it_does_instead():
    line = compat.needs_line("gloo all_to_all", "2.11.0+cu128", "the same transpose from isend/irecv")
    assert line == ("gloo all_to_all needs torch 2.12 or later; this is torch 2.11.0+cu128: "
                    "the same transpose from isend/irecv")


def test_ddp_buffer_sync_arg_follows_ddps_signature_not_the_version():
    def new_ddp(self, module, broadcast_buffers=None, forward_sync_buffers=None):
        """torch 2.13 and later"""

    def old_ddp(self, module, broadcast_buffers=True):
        """torch 2.12 and earlier"""

    assert compat.ddp_buffer_sync_arg(inspect.signature(new_ddp).parameters) == "forward_sync_buffers"
    assert compat.ddp_buffer_sync_arg(inspect.signature(old_ddp).parameters) == "broadcast_buffers"


def test_ddp_buffer_sync_arg_of_this_torch_is_one_its_ddp_accepts():
    import torch
    from torch.nn.parallel import DistributedDataParallel

    name = compat.ddp_buffer_sync_arg()
    assert name in inspect.signature(DistributedDataParallel.__init__).parameters
    assert (name == "forward_sync_buffers") == compat.has_since("DDP(forward_sync_buffers=...)", torch.__version__)


def test_an_all_to_all_refusal_is_told_from_a_failed_collective():
    assert compat.is_all_to_all_refusal("RuntimeError: Backend gloo does not support alltoall")
    assert compat.is_all_to_all_refusal("RuntimeError: ProcessGroup gloo does not support alltoall")
    assert not compat.is_all_to_all_refusal("RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed")
    assert not compat.is_all_to_all_refusal("RuntimeError: Backend gloo does not support reduce_scatter")


def test_a_version_without_a_patch_number_and_a_dotted_local_label():
    """PEP 440 allows ``2.13+rocm6.2``: the label after ``+`` is not part of the release."""
    assert compat.release("2.13+rocm6.2") == (2, 13)


def test_a_module_that_does_not_import_lacks_every_name_asked_for():
    assert compat._absent("not_a_module_anywhere", ("A", "B")) == {"A", "B"}
    assert compat._absent("json", ("dumps", "not_in_json")) == {"not_in_json"}


@pytest.fixture
def unchecked(monkeypatch):
    monkeypatch.setattr(compat, "_checked", False)


def test_a_torch_that_lacks_features_is_refused_naming_each(unchecked, monkeypatch):
    import torch

    lacking = {"torch.distributed.elastic.multiprocessing": {"LogsSpecs", "LogsDest"},
               "torch.distributed.elastic.rendezvous": {"RendezvousStoreInfo"}}
    monkeypatch.setattr(compat, "_absent", lambda module, names: lacking.get(module, set()))
    with pytest.raises(compat.DistlabError) as info:
        compat.check_torch()
    text = str(info.value)
    assert ("torch.distributed.elastic.multiprocessing.LogsDest, torch.distributed.elastic.multiprocessing.LogsSpecs, "
            "torch.distributed.elastic.rendezvous.RendezvousStoreInfo") in text
    assert torch.__version__ in text and compat.TORCH_FLOOR in text
    assert compat._checked is False  # refused: asked again next time


def test_the_check_runs_once_per_process(unchecked, monkeypatch):
    asked = []
    real = compat.launch_config_fields
    monkeypatch.setattr(compat, "launch_config_fields", lambda: asked.append(1) or real())
    compat.check_torch()
    compat.check_torch()
    assert asked == [1] and compat._checked is True
