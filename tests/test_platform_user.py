"""The book where its learners are: an ordinary Linux account (issue #44).

Each test makes a fresh account (:mod:`learner`: its own home, Debian's default ``PATH``, no
``/usr/sbin``) and runs, as that user, what a learner runs: ranks on :class:`distlab.Nodes`
through ``spawn`` and ``Ranks``, and chapters 7, 9 and 14 top to bottom in a kernel of its own.
The multi-machine cells must really run on nodes: a counter, added around ``distlab.Nodes`` by a
first cell the test inserts, says how many nodes each chapter started and how many commands it
ran on them. The account, its processes and its files go afterwards, also when a test fails.
"""
import json
import sys
import textwrap

import nbformat
import pytest
from book_copy import ROOT
from learner import fresh_learner, give, run_as
from test_notebooks import unexpected_tracebacks

pytestmark = pytest.mark.slow

PROBE = '''
import json, os, socket, subprocess, sys
import distlab
from distlab.folders import private

# in a user namespace like the nodes': the kernel's root is trusted, a root never checked outside is not
INSIDE = """if True:
    from pathlib import Path
    from distlab.errors import RunFolderError
    from distlab.folders import private
    print(private.private_root())
    try:
        private.private_root(Path.home() / "never-checked-outside")
        print("accepted")
    except RunFolderError as e:
        print("refused" if "inside this user namespace" in str(e) else e)
"""


def where(rank):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    dist.destroy_process_group()
    return {"host": socket.gethostname(), "sum": total.item()}


def host():
    return socket.gethostname()


def placed():
    return f"{socket.gethostname()} rank {os.environ['RANK']}"


nodes = distlab.Nodes(2)
spawned = distlab.spawn(where, nprocs=1, nodes=nodes, view=None, timeout=180).returns
launched = distlab.launch(placed, world_size=1, nodes=nodes, view=None, timeout=180).returns  # standby agents
with distlab.Ranks(1, nodes=nodes) as ranks:
    warm = dict(ranks.run(host))
nodes.close()
inside = subprocess.run(["unshare", "--user", "--map-root-user", sys.executable, "-c", INSIDE],
                        capture_output=True, text=True).stdout.split()
print("RESULT", json.dumps({"spawned": spawned, "launched": launched, "warm": warm, "uid": os.getuid(),
                            "path": os.environ["PATH"], "distlab": distlab.__file__,
                            "root": str(private.private_root()), "inside": inside}))
'''


@pytest.fixture
def learner():
    with fresh_learner() as made:
        yield made


def test_an_ordinary_user_runs_ranks_on_nodes(learner):
    copy = give(learner, {"src": ROOT / "src"})
    (copy / "probe.py").write_text(PROBE)
    done = run_as(learner, [sys.executable, str(copy / "probe.py")], timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    got = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert got["uid"] == learner.uid and "/usr/sbin" not in got["path"]
    assert got["distlab"].startswith(str(copy))  # its own copy, not the checkout
    assert got["spawned"] == {"0": {"host": "node0", "sum": 3.0}, "1": {"host": "node1", "sum": 3.0}}
    assert got["launched"] == {"0": "node0 rank 0", "1": "node1 rank 1"}
    assert got["warm"] == {"0": "node0", "1": "node1"}
    assert got["inside"] == [got["root"], "refused"]  # the same root in there; one nobody vouched for, refused
    assert done.left_behind == []  # nodes, standby agents and warm ranks all went with close()


CHAPTERS = ["07_two_gpu_training", "09_failure_lab", "14_network"]
#: the least each chapter starts on nodes: (Nodes made, commands run on them)
ON_NODES = {"07_two_gpu_training": (1, 2), "09_failure_lab": (1, 2), "14_network": (2, 4)}
COUNT_NODES = textwrap.dedent('''
    import distlab.nodes.cluster as _nodes_cluster   # added by tests/test_platform_user.py: counts what runs on nodes
    _on_nodes = {"made": 0, "commands": 0}
    _made_by, _command_of = _nodes_cluster.Nodes.__init__, _nodes_cluster.Nodes.command
    def _counted_init(self, *args, **kwargs):
        _made_by(self, *args, **kwargs)
        _on_nodes["made"] += 1
    def _counted_command(self, *args, **kwargs):
        _on_nodes["commands"] += 1
        return _command_of(self, *args, **kwargs)
    _nodes_cluster.Nodes.__init__, _nodes_cluster.Nodes.command = _counted_init, _counted_command
''')
REPORT_NODES = 'import json as _json; print("ON-NODES", _json.dumps(_on_nodes))'
EXECUTE = '''
import json, sys
from pathlib import Path
sys.path.insert(0, "tests")
from nbrun import execute
for name in sys.argv[1:]:
    path = Path("book") / f"{name}.ipynb"
    ex = execute(path, write_to=path)
    print("EXECUTED", json.dumps({"name": name, "seconds": round(ex.seconds, 1), "error": ex.error}), flush=True)
'''


def counted(path):
    """The chapter with the counting cell first and the report last."""
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(COUNT_NODES))
    nb.cells.append(nbformat.v4.new_code_cell(REPORT_NODES))
    return nb


def test_chapters_with_nodes_run_whole_for_an_ordinary_user(learner):
    copy = give(learner, {"src": ROOT / "src", "book": ROOT / "book", "tests/nbrun.py": ROOT / "tests" / "nbrun.py"})
    for name in CHAPTERS:
        nbformat.write(counted(ROOT / "book" / f"{name}.ipynb"), copy / "book" / f"{name}.ipynb")
    done = run_as(learner, [sys.executable, "-c", EXECUTE, *CHAPTERS], timeout=1200, cwd=copy)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    reports = [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines() if line.startswith("EXECUTED ")]
    assert [r["name"] for r in reports] == CHAPTERS, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.left_behind == []  # the kernels' exit took their nodes and ranks with them
    problems = []
    for report in reports:
        nb = nbformat.read(copy / "book" / f"{report['name']}.ipynb", as_version=4)
        problems += chapter_problems(report, nb)
    assert not problems, "\n\n".join(problems)


def chapter_problems(report: dict, nb) -> list[str]:
    """What went wrong in one executed chapter: an error, a cell that did not run, a traceback a
    cell did not expect, or fewer nodes and commands on them than the chapter starts."""
    name = report["name"]
    if report["error"]:
        return [f"{name} failed ({report['seconds']} s):\n{report['error']}"]
    problems = [f"{name}: " + p for p in unexpected_tracebacks(nb)]
    if not all(c.get("execution_count") for c in nb.cells if c.cell_type == "code"):
        problems.append(f"{name}: a code cell did not run")
    text = "".join(out.get("text", "") for out in nb.cells[-1].get("outputs", []))
    if "ON-NODES " not in text:
        return [*problems, f"{name}: no report of what ran on nodes"]
    counts = json.loads(text.split("ON-NODES ", 1)[1])
    least = ON_NODES[name]
    if counts["made"] < least[0] or counts["commands"] < least[1]:
        problems.append(f"{name}: only {counts} on nodes, expected at least {least} (were its sections skipped?)")
    return problems
