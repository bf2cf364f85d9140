"""Chapter 5's references, ring, bandwidth math, checks and plots.

Pure tests need no processes; the ``slow`` ones launch real ranks (once per world size, kept few).
"""
import pytest
import torch

import distlab
from distlab.plots.collectives import plot_bandwidth, plot_collective, plot_states, plot_timeline
from distlab.teach import collectives as C

T = torch.tensor


def ranks(*rows):
    return [T(r, dtype=torch.float32) for r in rows]


# --- references -----------------------------------------------------------------------------------------

def test_combine_every_op():
    xs = ranks([1, 4], [2, 1], [3, 2])
    assert C.combine(xs, "SUM").tolist() == [6, 7]
    assert C.combine(xs, "product").tolist() == [6, 8]
    assert C.combine(xs, "MIN").tolist() == [1, 1]
    assert C.combine(xs, "MAX").tolist() == [3, 4]
    assert C.combine(xs, "AVG").tolist() == pytest.approx([2, 7 / 3])
    ints = [T([1, 1]), T([2, 2]), T([3, 4]), T([4, 8])]
    assert C.combine(ints, "BAND").tolist() == [0, 0]
    assert C.combine(ints, "BOR").tolist() == [7, 15]
    assert C.combine(ints, "BXOR").tolist() == [4, 15]


def test_op_name_accepts_reduce_ops_and_rejects_unknown_ones():
    import torch.distributed as dist

    assert C.op_name(dist.ReduceOp.PRODUCT) == "PRODUCT" and C.op_name("avg") == "AVG"
    assert C.op_name(dist.ReduceOp.BXOR) == "BXOR"
    with pytest.raises(ValueError, match="unknown reduce op"):
        C.op_name("PREMUL_SUM")


def test_sum_is_the_default_op_and_the_unknown_op_error_lists_the_known_ones():
    assert C.combine(ranks([1, 4], [2, 1])).tolist() == [3, 5]
    with pytest.raises(ValueError, match="the references know SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR, BXOR$"):
        C.op_name("mean")


def test_rooted_references_default_to_rank_0_and_sum():
    xs = ranks([1, 2], [11, 12], [21, 22])
    assert [t.tolist() for t in C.ref_broadcast(xs)] == [[1, 2]] * 3
    gathered = C.ref_gather(xs)
    assert [t.tolist() for t in gathered[0]] == [[1, 2], [11, 12], [21, 22]] and gathered[1:] == [None, None]
    reduced = C.ref_reduce(xs)
    assert reduced[0].tolist() == [33, 36] and reduced[1:] == [None, None]
    scattered = C.ref_scatter([list(ranks([0], [1])), list(ranks([10], [11]))])
    assert [t.tolist() for t in scattered] == [[0], [1]]
    assert [t.tolist() for t in C.ref_all_reduce(xs)] == [[33, 36]] * 3


def test_reduce_and_reduce_scatter_use_the_op_they_are_given():
    xs = ranks([1, 5], [4, 2])
    reduced = C.ref_reduce(xs, dst=1, op="MAX")
    assert reduced[0] is None and reduced[1].tolist() == [4, 5]
    pieces = [ranks([0], [12]), ranks([10], [2])]
    assert [t.tolist() for t in C.ref_reduce_scatter(pieces, op="MIN")] == [[0], [2]]

def test_rooted_references_give_results_only_on_the_root():
    xs = ranks([1, 2], [11, 12], [21, 22])
    assert [t.tolist() for t in C.ref_broadcast(xs, src=1)] == [[11, 12]] * 3
    gathered = C.ref_gather(xs, dst=2)
    assert gathered[0] is None and gathered[1] is None and [t.tolist() for t in gathered[2]] == [[1, 2], [11, 12],
                                                                                                   [21, 22]]
    reduced = C.ref_reduce(xs, dst=0)
    assert reduced[0].tolist() == [33, 36] and reduced[1] is None and reduced[2] is None
    scattered = C.ref_scatter([list(ranks([0], [1], [2])), None, None], src=0)
    assert [t.tolist() for t in scattered] == [[0], [1], [2]]


def test_all_references_and_transposes():
    xs = ranks([1, 2], [10, 20])
    assert [t.tolist() for t in C.ref_all_reduce(xs, "MAX")] == [[10, 20], [10, 20]]
    assert [[p.tolist() for p in r] for r in C.ref_all_gather(xs)] == [[[1, 2], [10, 20]]] * 2
    pieces = [ranks([0], [1], [2]), ranks([10], [11], [12]), ranks([20], [21], [22])]
    assert [t.tolist() for t in C.ref_reduce_scatter(pieces)] == [[30], [33], [36]]
    assert [[p.item() for p in r] for r in C.ref_all_to_all(pieces)] == [[0, 10, 20], [1, 11, 21], [2, 12, 22]]
    assert [t.tolist() for t in C.ref_barrier(xs)] == [[1, 2], [10, 20]]


def test_group_reference_leaves_outsiders_alone():
    xs = ranks([1], [2], [3], [4])
    assert [t.item() for t in C.ref_group_all_reduce(xs, ranks=[0, 2])] == [4, 2, 4, 4]


def test_references_do_not_alias_their_inputs():
    xs = ranks([1, 2], [3, 4])
    out = C.ref_broadcast(xs)
    out[1].fill_(0)
    assert xs[0].tolist() == [1, 2]


def test_check_against_reference_passes_skips_undefined_and_names_the_wrong_rank():
    xs = ranks([1], [2])
    C.check_against_reference("reduce", xs, [T([3.0]), T([99.0])], dst=0)  # rank 1 is undefined: not compared
    with pytest.raises(AssertionError, match="all_reduce: rank 1 ended with"):
        C.check_against_reference("all_reduce", xs, [T([3.0]), T([2.0])])
    with pytest.raises(AssertionError, match="ranks reported"):
        C.check_against_reference("all_reduce", xs, [T([3.0])])


def test_same_compares_structure():
    assert C.same([T([1.0])], [T([1.0])]) and C.same(None, None)
    assert not C.same(T([1.0]), None) and not C.same([T([1.0])], T([1.0])) and not C.same(T([1.0, 2.0]), T([1.0]))
    assert not C.same([T([1.0])], [T([1.0]), T([2.0])])  # lists of different lengths
    assert not C.same([T(1.0), T(2.0)], T([1.0, 2.0]))  # a list is not a tensor, even with the same values


def test_per_rank_and_defined_only():
    returns = {1: {"x": ("b1", "a1")}, 0: {"x": ("b0", "a0")}}
    assert C.per_rank(returns, "x") == (["b0", "b1"], ["a0", "a1"])
    assert C.defined_only(["a0", "a1"], [T([1.0]), None]) == ["a0", None]
    with pytest.raises(ValueError):  # one result per rank on both sides, or it is a mistake
        C.defined_only(["a0", "a1"], [T([1.0])])


# --- ring geometry, bandwidth, inputs --------------------------------------------------------------------

def test_ring_segments_match_tensor_split():
    assert C.ring_segments(8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert C.ring_segments(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert C.ring_segments(1, 2) == [(0, 1), (1, 1)]


def test_add_on_this_thread_adds_every_element():
    dst, src = torch.zeros(C.SERIAL_NUMEL * 3 + 5), torch.arange(C.SERIAL_NUMEL * 3 + 5.0)
    C.add_on_this_thread(dst, src)
    assert torch.equal(dst, src)


def test_count_sent_bytes_counts_what_goes_through_isend_and_restores_it(monkeypatch):
    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(dist, "isend", lambda tensor, dst, **kw: calls.append((tensor.numel(), dst)) or "work")

    def two_sends():
        assert dist.isend(torch.zeros(3), 1) == "work"
        dist.isend(torch.zeros(5, dtype=torch.float64), 2)

    fake = dist.isend
    assert C.count_sent_bytes(two_sends) == 3 * 4 + 5 * 8
    assert calls == [(3, 1), (5, 2)] and dist.isend is fake
    with pytest.raises(ZeroDivisionError):
        C.count_sent_bytes(lambda: 1 / 0)
    assert dist.isend is fake


def test_bandwidth_definitions():
    assert C.algbw(1e9, 0.5) == 2e9
    assert C.busbw(1e9, 0.5, 2) == 2e9  # n=2: 2(n-1)/n = 1
    assert C.busbw(1e9, 0.5, 4) == pytest.approx(3e9)
    assert C.busbw(1e9, 1.0, 8) == pytest.approx(1.75e9)


def test_bench_expected_is_the_sum_of_bench_inputs():
    for n in (2, 3, 4):
        assert torch.equal(sum(C.bench_input(1000, r) for r in range(n)), C.bench_expected(1000, n))


def test_memcpy_bandwidth_is_positive_and_restores_threads():
    threads = torch.get_num_threads()
    assert C.memcpy_bandwidth(1 << 16, repeats=2) > 0
    assert torch.get_num_threads() == threads


# --- tables and exercise checks ------------------------------------------------------------------------------

def test_support_tables_show_measurements_and_docs():
    table = C.support_table({name: None for name in C.TABLE_ROWS[:-2]} | {"all_to_all": "RuntimeError: no"}, "gloo")
    assert "<tr><td><code>broadcast</code></td><td>✓</td><td>✓</td><td>✓</td></tr>" in table
    assert "<td><code>all_to_all</code></td><td>✘ <code>RuntimeError: no</code></td>" in table
    assert table.startswith("<table>") and "<th>measured here (gloo)</th>" in table
    ops = C.ops_table({"SUM": None, "AVG": None}, "nccl")
    assert "<td><code>AVG</code></td><td>✓</td><td>✘ (NCCL only)</td><td>✓ (NCCL ≥ 2.10)</td>" in ops
    assert "<td><code>MIN</code></td><td>✘ <code>not run</code></td>" in ops
    assert "&lt;" in C.support_table({"gather": "bad <op>"}, "gloo")  # errors are escaped
    assert "<td><code>barrier</code></td><td>✘ <code>not run</code></td>" in table
    assert ("<thead><tr><th>collective</th><th>measured here (gloo)</th><th>gloo, CPU (docs)</th>"
            "<th>NCCL, GPU (docs)</th></tr></thead>") in C.support_table({}, "gloo")
    assert ("<thead><tr><th>ReduceOp</th><th>measured here (nccl)</th><th>gloo (docstring)</th>"
            "<th>NCCL (docstring)</th></tr></thead>") in ops


def test_html_table_and_long_errors_cut_to_60_characters():
    assert C.html_table(["a", "b"], [[1, 2], [3, 4]]) == (
        "<table><thead><tr><th>a</th><th>b</th></tr></thead>"
        "<tbody><tr><td>1</td><td>2</td></tr><tr><td>3</td><td>4</td></tr></tbody></table>")
    table = C.ops_table({"SUM": "E" * 100}, "gloo")
    assert f"<td>✘ <code>{'E' * 60}</code></td>" in table


def test_exercise_checks_accept_right_answers(capsys):
    C.check_reduce_scatter([111, 222, 333])
    C.check_ring_bytes(2 * 7 / 8 * 64 * 2**20)
    C.check_bandwidth(6.71, 11.74)
    C.check_which_collective(dict(C.SCENARIOS))
    before = ranks([1], [2], [3], [4])
    C.check_group_all_reduce({r: {"result": (before[r], T([4.0]) if r else before[r])} for r in range(4)},
                             ranks=[1, 2, 3], op="MAX")
    out = capsys.readouterr().out
    assert out.count("correct") == 5
    assert "correct: [111.0, 222.0, 333.0]\n" in out and "correct: all 5 scenarios\n" in out


def test_exercise_checks_reject_wrong_answers_with_hints():
    with pytest.raises(AssertionError, match="piece i"):
        C.check_reduce_scatter([6, 60, 600])
    with pytest.raises(AssertionError, match="one value per rank"):
        C.check_reduce_scatter([111])
    with pytest.raises(AssertionError, match="Count the steps"):
        C.check_ring_bytes(64 * 2**20)
    with pytest.raises(AssertionError, match="busbw"):
        C.check_bandwidth(6.71, 6.71)
    with pytest.raises(AssertionError, match="Rank 0: not \\[111, 0\\]"):  # one value per rank, not a list
        C.check_reduce_scatter([[111, 0], 222, 333])
    with pytest.raises(AssertionError, match="summed over the ranks.$"):
        C.check_reduce_scatter([111, 222, 0])
    with pytest.raises(AssertionError, match="all-gather, each sending one segment of nbytes/n.$"):
        C.check_ring_bytes(0)
    with pytest.raises(AssertionError, match="algbw: not 6.9"):
        C.check_bandwidth(6.9, 11.74)
    with pytest.raises(AssertionError, match="Who has the data"):
        C.check_which_collective({})
    before = ranks([1], [2], [3], [4])
    with pytest.raises(AssertionError, match="rank 0 ended with"):  # rank 0 is outside the group
        C.check_group_all_reduce({r: {"result": (before[r], T([4.0]))} for r in range(4)}, ranks=[1, 2, 3], op="MAX")


def test_exercise_answers_are_checked_within_their_tolerance(capsys):
    """Bytes within a millionth, bandwidths within 2% (both inclusive), with the defaults of the exercise:
    8 ranks, 64 MiB, 10 ms."""
    C.check_ring_bytes(2 * 7 / 8 * 64 * 2**20 + 100)
    C.check_ring_bytes(1e6 + 1, n=2, nbytes=1e6)  # 1e-6 x 1e6 is exactly 1 byte
    with pytest.raises(AssertionError):
        C.check_ring_bytes(1e6 + 1.01, n=2, nbytes=1e6)
    alg, bus = 64 * 2**20 / 0.01 / 1e9, 64 * 2**20 / 0.01 / 1e9 * 2 * 7 / 8
    C.check_bandwidth(alg * 1.01, bus * 0.985)
    for wrong in ((alg * 1.03, bus), (alg * 0.97, bus), (alg, bus * 1.025), (alg, bus * 0.975)):
        with pytest.raises(AssertionError):
            C.check_bandwidth(*wrong)
    C.check_bandwidth(51.0, 51.0, n=2, nbytes=50e9, seconds=1.0)  # exactly 2% off: 50 GB/s both
    assert capsys.readouterr().out.count("correct") == 4

# --- plots ---------------------------------------------------------------------------------------------------

def _boxes(ax):
    from matplotlib.patches import Rectangle

    return [p for p in ax.patches if isinstance(p, Rectangle)]


def test_plot_collective_draws_one_box_per_value_and_hatches_missing_ranks():
    before = ranks([1, 2], [11, 12], [21, 22])
    fig = plot_collective(before, C.ref_gather(before), title="gather")
    left, right = fig.axes[:2]
    assert len(_boxes(left)) == 6
    assert len(_boxes(right)) == 6 + 2  # rank 0's list of three tensors, two hatched ranks
    assert sum(bool(p.get_hatch()) for p in _boxes(right)) == 2
    assert fig._suptitle.get_text() == "gather"


def test_plot_states_outlines_highlighted_ranges():
    xs = ranks([1, 2, 3, 4], [5, 6, 7, 8])
    fig = plot_states({"a": xs, "b": xs}, highlight={"b": [(0, 1, 3)]})
    assert len(fig.axes) == 2 and len(_boxes(fig.axes[1])) == len(_boxes(fig.axes[0])) + 1


def test_timeline_and_bandwidth_plots():
    fig = plot_timeline({0: [("work", 0.0, 0.1), ("wait in recv", 0.1, 0.2)], 1: [("wait in recv", 0.0, 0.2)]})
    assert fig.axes[0].get_xlabel().startswith("time")
    rows = [{"impl": i, "ranks": 2, "bytes": b, "busbw": 1e8 * b / 4096}
            for i in ("gloo", "ring") for b in (4096, 8192)]
    fig = plot_bandwidth(rows, {4096: 1e10})
    assert len(fig.axes[0].lines) == 3


# --- the chapter's ring and its reference copy are the same code -------------------------------------------

def _definitions(source: str) -> dict:
    """Top-level functions, classes and assignments of some source, by name, as syntax trees. A
    docstring counts by its words: the book wraps its lines at 76 columns (book/fit_code.py), the
    package at 120; a string cut in two is one constant in the tree already."""
    import ast

    out = {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and ast.get_docstring(node):
            node.body[0].value.value = " ".join(node.body[0].value.value.split())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = ast.dump(node)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = ast.dump(node)
    return out


def test_the_chapters_ring_is_the_reference_copy_definition_by_definition():
    import inspect
    import json
    from pathlib import Path

    from IPython.core.inputtransformer2 import TransformerManager

    from distlab.teach import ring

    nb = json.loads((Path(__file__).parents[1] / "book" / "05_collectives.ipynb").read_text())
    chapter = {}
    for cell in nb["cells"]:
        # the install cell's %pip and the %% magics are IPython, not Python: what the kernel runs is compared
        if cell["cell_type"] == "code" and not "".join(cell["source"]).lstrip().startswith(("%%", "!")):
            chapter.update(_definitions(TransformerManager().transform_cell("".join(cell["source"]))))
    reference = {k: v for k, v in _definitions(inspect.getsource(ring)).items()}
    assert set(reference) == {"CHUNK_BYTES", "Ring", "SERIAL_NUMEL", "add_on_this_thread", "reduce_scatter_phase",
                              "all_gather_phase", "prepare_ring", "ring_all_reduce", "ring_reduce_scatter"}
    for name, tree in reference.items():
        assert name in chapter, f"chapter 5 does not define {name}"
        assert chapter[name] == tree, f"chapter 5's {name} differs from distlab.teach.ring.{name}"


# --- on real ranks (slow): the ring equals dist.all_reduce --------------------------------------------------------

def ring_versus_all_reduce(rank, world_size):
    import torch.distributed as dist

    from distlab.teach.collectives import measure_all_reduce
    from distlab.teach.ring import ring_all_reduce

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    equal = []
    for numel, chunk_bytes in ((1, 8), (5, 8), (1003, 64), (70_001, 4096), (70_001, 1 << 20)):
        x = torch.randint(-1000, 1000, (numel,), generator=torch.Generator().manual_seed(rank)).float()
        ours, theirs = x.clone(), x.clone()
        ring_all_reduce(ours, chunk_bytes=chunk_bytes)  # small chunks: uneven segments, many pieces
        dist.all_reduce(theirs)
        equal.append(torch.equal(ours, theirs))
    rows = measure_all_reduce({"ring": ring_all_reduce}, [4096], target_s=0.01, reps=1) if world_size == 2 else []
    dist.destroy_process_group()
    return {"equal": equal, "rows": rows}


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_all_reduce_equals_dist_all_reduce(world_size):
    res = distlab.spawn(ring_versus_all_reduce, args=(world_size,), nprocs=world_size, timeout=120, view=None)
    for rank in range(world_size):
        assert all(res.returns[rank]["equal"]), f"rank {rank}: {res.returns[rank]['equal']}"
    if world_size == 2:
        (row,) = res.returns[0]["rows"]
        assert row["impl"] == "ring" and row["bytes"] == 4096 and row["checked"] and row["busbw"] > 0


# --- chapter 5's ring on threads (issue #60): what it computes, without a process group ---------------------------

class ThreadWorld:
    """torch.distributed's point-to-point calls between threads, one thread per rank. A message lands
    in its receive's tensor as soon as both are posted, as on a network (so a buffer reused too early
    is overwritten); it is kept under (source, destination, tag), and a tag used twice between two
    ranks is an error (gloo would pair the wrong messages)."""

    def __init__(self, n: int, group=None):
        import threading

        self.n, self.group, self.local = n, group, threading.local()
        self.boxes: dict = {}  # sent, no receive posted yet
        self.waiting: dict = {}  # receives posted, nothing sent yet: key -> its tensor
        self.delivered: set = set()  # landed, not yet waited for
        self.posted: set = set()  # receives posted, not yet waited for
        self.cond = threading.Condition()

    def get_world_size(self, group=None):
        assert group is self.group
        return self.n

    def get_rank(self, group=None):
        assert group is self.group
        return self.local.rank

    def get_global_rank(self, group, i):
        return group[i]

    def me(self):
        return self.local.rank if self.group is None else self.group[self.local.rank]

    def isend(self, tensor, dst, group=None, tag=0):
        assert group is self.group
        with self.cond:
            key = (self.me(), dst, tag)
            assert key not in self.boxes and key not in self.delivered, f"tag {tag} sent twice from {key[0]} to {dst}"
            if key in self.waiting:
                self.waiting.pop(key).copy_(tensor)
                self.delivered.add(key)
            else:
                self.boxes[key] = tensor.clone()
            self.cond.notify_all()
        return self.done()

    def irecv(self, tensor, src, group=None, tag=0):
        assert group is self.group
        world, key = self, (src, self.me(), tag)
        with self.cond:
            assert key not in self.posted, f"a second receive posted for {key}"
            self.posted.add(key)
            if key in self.boxes:
                tensor.copy_(self.boxes.pop(key))
                self.delivered.add(key)
            else:
                self.waiting[key] = tensor

        class Receive:
            def wait(self):
                with world.cond:
                    assert world.cond.wait_for(lambda: key in world.delivered, timeout=10), f"nothing came for {key}"
                    world.delivered.discard(key)
                    world.posted.discard(key)
        return Receive()

    @staticmethod
    def done():
        class Done:
            def wait(self):
                pass
        return Done()

    def run(self, fn):
        """fn(rank) on n threads; their results by rank."""
        import threading

        results, errors = {}, []

        def body(rank):
            self.local.rank = rank
            try:
                results[rank] = fn(rank)
            except BaseException as e:  # noqa: BLE001  (re-raised below, in the test's thread)
                errors.append(e)
        threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        if errors:
            raise errors[0]
        # gloo pairs every send with a receive: one left over would hang the ranks' next wait
        assert self.boxes == {}, f"sent and never received: {sorted(self.boxes)}"
        assert self.posted == set(), f"receives posted and never waited for: {sorted(self.posted)}"
        return results


@pytest.mark.parametrize("n, numel, chunk_bytes", [(2, 10, 8), (3, 11, 8), (4, 40, 4), (3, 7, 1 << 20), (5, 3, 4),
                                                    (3, 30, 16)])
def test_the_ring_sums_every_element_on_every_rank(monkeypatch, n, numel, chunk_bytes):
    from distlab.teach import ring

    world = ThreadWorld(n)
    monkeypatch.setattr(ring, "dist", world)
    # float64 values float32 cannot hold: a scratch buffer of another dtype would round them
    inputs = [torch.arange(numel, dtype=torch.float64) * (r + 1) / 3 + r for r in range(n)]
    out = world.run(lambda r: ring.ring_all_reduce(inputs[r].clone(), chunk_bytes=chunk_bytes))
    expected = sum(inputs)
    for r in range(n):  # the same bits on every rank; as the sum to float64's precision (not float32's)
        assert torch.equal(out[r], out[0]) and torch.allclose(out[r], expected, rtol=1e-12, atol=0), (r, out[r])


def test_the_ring_on_a_group_talks_to_the_groups_global_ranks(monkeypatch):
    from distlab.teach import ring

    world = ThreadWorld(3, group=[4, 7, 9])
    monkeypatch.setattr(ring, "dist", world)
    out = world.run(lambda r: ring.ring_all_reduce(torch.full((6,), float(r + 1)), group=world.group, chunk_bytes=8))
    assert all(torch.equal(t, torch.full((6,), 6.0)) for t in out.values())
    places = world.run(lambda r: ring.prepare_ring(torch.zeros(6), world.group, 8)[0])
    assert [(p.rank, p.left, p.right, p.step, p.chunks, p.n) for _, p in sorted(places.items())] == [
        (0, 9, 7, 2, 1, 3), (1, 4, 9, 2, 1, 3), (2, 7, 4, 2, 1, 3)]


def test_the_reduce_scatter_leaves_each_rank_the_segment_it_owns_summed(monkeypatch):
    from distlab.teach import ring

    world = ThreadWorld(3)
    monkeypatch.setattr(ring, "dist", world)
    tensors = {r: torch.arange(9, dtype=torch.float32) + 10 * r for r in range(3)}
    owned = world.run(lambda r: ring.ring_reduce_scatter(tensors[r], chunk_bytes=4))
    assert owned == {0: 1, 1: 2, 2: 0}
    total = sum(torch.arange(9, dtype=torch.float32) + 10 * r for r in range(3))
    for r, k in owned.items():
        assert torch.equal(tensors[r][3 * k:3 * k + 3], total[3 * k:3 * k + 3])


def test_the_rings_reduce_scatter_on_a_group(monkeypatch):
    from distlab.teach import ring

    world = ThreadWorld(2, group=[3, 5])
    monkeypatch.setattr(ring, "dist", world)
    tensors = {r: torch.full((4,), float(r + 1)) for r in range(2)}
    assert world.run(lambda r: ring.ring_reduce_scatter(tensors[r], group=world.group, chunk_bytes=4)) == {0: 1, 1: 0}
    assert torch.equal(tensors[0][2:], torch.full((2,), 3.0)) and torch.equal(tensors[1][:2], torch.full((2,), 3.0))


def test_a_ring_of_one_and_a_tensor_that_is_not_contiguous(monkeypatch):
    from distlab.teach import ring

    one = ThreadWorld(1)
    monkeypatch.setattr(ring, "dist", one)
    t = torch.ones(4)
    assert one.run(lambda r: ring.ring_all_reduce(t))[0] is t and one.boxes == {}
    assert one.run(lambda r: ring.ring_reduce_scatter(t)) == {0: 0}
    two = ThreadWorld(2)
    monkeypatch.setattr(ring, "dist", two)
    needs = r"^ring_all_reduce needs a contiguous tensor \(call \.contiguous\(\) first\)$"
    with pytest.raises(ValueError, match=needs):
        two.run(lambda r: ring.prepare_ring(torch.ones(4, 4).t(), None, 8))


def test_the_ring_tags_every_message_of_a_call_apart():
    from distlab.teach.ring import Ring

    place = Ring(None, 0, 3, 1, 4)
    tags = {place.tag(phase, step, chunk) for phase in (0, 1) for step in range(3) for chunk in range(4)}
    assert tags == set(range(2 * 3 * 4))


def test_add_on_this_thread_adds_in_slices_above_the_serial_size(monkeypatch):
    from distlab.teach import ring

    big = ring.SERIAL_NUMEL * 2 + 5
    dst, src = torch.zeros(big), torch.arange(big, dtype=torch.float32)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    ring.add_on_this_thread(dst, src)
    assert torch.equal(dst, src)
    small = torch.ones(3)
    ring.add_on_this_thread(small, torch.ones(3))
    assert torch.equal(small, torch.full((3,), 2.0))
