"""Issue #52 item 3: chapter 7's node cells, run a second time, train again; and their check fails when
nothing was trained (a run that resumed from the finished checkpoint of the first one).

The cells are taken from the chapter and run here with stand-ins for the nodes: what is tested is what
the cells do with a checkpoint and with what the run printed, not the run itself (tests/test_two_node.py).
"""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from distlab.teach import training

NOTEBOOK = Path(__file__).resolve().parents[1] / "book" / training.CHAPTER
SIZE, BATCH = 1024, 32


def statements(code: str) -> list[str]:
    """The code's lines without comments or blank lines: a comment may sit above or beside a line
    (book/fit_code.py moves one above when the two do not fit the page)."""
    return [kept for line in code.splitlines() if (kept := line.split("#")[0].strip())]


def node_cell(first_line: str) -> str:
    """The code of the chapter's ``%%needs nodes`` cell whose first two statements include
    ``first_line`` (its comment ignored)."""
    wanted = statements(first_line)[0]
    for cell in json.loads(NOTEBOOK.read_text())["cells"]:
        source = "".join(cell["source"])
        magic, _, code = source.partition("\n")
        if cell["cell_type"] == "code" and magic == "%%needs nodes" and wanted in statements(code)[:2]:
            return code
    raise AssertionError(f"no %%needs nodes cell starting with {first_line!r} in {NOTEBOOK.name}")


def tee(rank: int, text: str) -> str:
    return f"[default{rank % 2}]:Rank {rank}, {text}"


def agent_log(group_rank: int, started: str) -> list[str]:
    """torchrun's INFO lines the chapter reads: when its agent started and began the rendezvous, its node rank."""
    api = "1 torch/distributed/elastic/agent/server/api.py:"
    return [f"I1205 {started}.000000 {api}912] [default] starting workers for entrypoint: python",
            f"I1205 {started}.100000 {api}707] [default] Rendezvous'ing worker group",
            f"I1205 {started}.900000 {api}553]   group_rank={group_rank}"]


def outputs(trained: bool, checkpoint: Path) -> list[str]:
    """What each node printed: a run that trained both epochs, or one that resumed after them; node1's agent
    started 2 s before node0's."""
    def node(ranks, started):
        lines = [tee(r, f"Epoch {e}, Batch 0, Loss: 0.69") for e in (0, 1) for r in ranks] if trained else \
                [tee(r, f"resumed from {checkpoint} at epoch 2 of 2") for r in ranks]
        return "\n".join([*agent_log(ranks[0] // 2, started), *lines, *(tee(r, "samples/s: 0") for r in ranks),
                          *(tee(r, "parameter checksum: 1.0000000000") for r in ranks)])
    return [node((0, 1), "10:00:02"), node((2, 3), "10:00:00")]


def fake_nodes():
    """Two stand-in nodes whose socket.getfqdn() is their host name."""
    hosts = ["node0", "node1"]
    return SimpleNamespace(hosts=hosts, close=lambda: None,
                           run=lambda k, command: SimpleNamespace(stdout=hosts[k] + "\n"))


def test_running_the_cell_again_trains_from_the_start(tmp_path):
    (tmp_path / "nodes.pt").write_bytes(b"the first run's finished checkpoint")
    seen = []

    def run_on_nodes(nodes, commands, timeout, **how):
        seen.append((tmp_path / "nodes.pt").exists())
        return outputs(True, tmp_path / "nodes.pt")

    nodes = SimpleNamespace(traffic=lambda: {k: {"sent_bytes": 0} for k in range(2)})
    exec(node_cell("before = nodes.traffic()"),
         {"WORK": tmp_path, "nodes": nodes, "commands": [], "training": SimpleNamespace(run_on_nodes=run_on_nodes)})
    assert seen == [False]  # the script found no checkpoint to resume from


@pytest.mark.parametrize("trained", [True, False])
def test_the_check_fails_when_nothing_was_trained(tmp_path, trained):
    reference = training.reference_train(SIZE, BATCH, world_size=4, epochs=2, seed=0)
    torch.save({"epoch": 2, "model": reference["model"]}, tmp_path / "nodes.pt")  # the first run's
    nodes = fake_nodes()
    names = {"WORK": tmp_path, "nodes": nodes, "outputs": outputs(trained, tmp_path / "nodes.pt"), "torch": torch,
             "training": training, "SIZE": SIZE, "BATCH": BATCH, "TOL": 1e-5,
             "sent": {0: 70_000, 1: 70_000}}  # what the rendezvous alone sends (seen: 0.07 MB)
    if trained:
        exec(node_cell("import sys   # this kernel's Python, on each node: what torch asks for"), names)
    else:
        with pytest.raises(AssertionError):
            exec(node_cell("import sys   # this kernel's Python, on each node: what torch asks for"), names)


def test_epochs_in_reads_what_each_rank_trained():
    log = "\n".join(outputs(True, Path("x.pt")))
    assert training.epochs_in(log) == {r: [0, 1] for r in range(4)}
    assert training.epochs_in("\n".join(outputs(False, Path("x.pt")))) == {}


def test_the_check_fails_when_the_ranks_followed_the_join_order(tmp_path):
    """Issue #47 item 4: node1 joined first; had its node got rank 0 (join order), the cell must fail."""
    reference = training.reference_train(SIZE, BATCH, world_size=4, epochs=2, seed=0)
    torch.save({"epoch": 2, "model": reference["model"]}, tmp_path / "nodes.pt")
    joined = outputs(True, tmp_path / "nodes.pt")
    joined = [joined[0].replace("group_rank=0", "group_rank=1"), joined[1].replace("group_rank=1", "group_rank=0")]
    names = {"WORK": tmp_path, "nodes": fake_nodes(), "outputs": joined, "torch": torch, "training": training,
             "SIZE": SIZE, "BATCH": BATCH, "TOL": 1e-5, "sent": {0: 70_000, 1: 70_000}}
    with pytest.raises(AssertionError):
        exec(node_cell("import sys   # this kernel's Python, on each node: what torch asks for"), names)
    names["outputs"] = outputs(True, tmp_path / "nodes.pt")
    exec(node_cell("import sys   # this kernel's Python, on each node: what torch asks for"), names)
