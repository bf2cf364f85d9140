"""The ``%%needs`` magic: a multi-machine cell runs where the machine allows it, and elsewhere says once
why not and shows its recording (never a fake node, no file, no assert).

The decision is pure (:mod:`distlab.needs.verdict`), tested here for every setting of issue 44: a
default container as root, an ordinary user, no Slurm. The magic itself runs in a real IPython shell
with the probe's facts set by the test.
"""
from __future__ import annotations

import functools
import json
import re

import pytest

from distlab.needs import magic, probe, recorded, verdict
from distlab.needs.verdict import Facts

CONTAINER = ("distlab: cannot start nodes: this machine refuses a network namespace (unshare: unshare failed: "
             "Operation not permitted); no setting of the kernel forbids them, so the process lacks the privilege "
             "(a container started without CAP_SYS_ADMIN, or with a seccomp profile that blocks unshare); run it "
             "with --privileged or --cap-add SYS_ADMIN, or outside the container. distlab never falls back to "
             "loopback and calls it nodes.")
NO_SLURM = ("distlab.slurm: cannot start a one-machine cluster: these programs are missing: sbatch, slurmctld. "
            "Install them: apt-get install slurm-wlm (Debian/Ubuntu; slurm-wlm brings slurmctld, slurmd and "
            "slurm-client), or use a real cluster.")
NO_DBD = "job accounting needs mariadbd, slurmdbd: apt-get install mariadb-server slurmdbd"
NOT_ROOT = ("distlab.slurm: cannot start a one-machine cluster: it needs root (slurmd starts every job step as "
            "the job's user, which only root may do). Run as root (as CI does, or in a container), or use a real "
            "cluster's login node.")


@pytest.mark.parametrize("facts, holds", [
    (Facts(None, None), {"nodes", "slurm", "slurm-nodes", "slurm-accounting"}),   # Linux as root, Slurm installed
    (Facts(CONTAINER, None), {"slurm", "slurm-accounting"}),             # a default container as root, with Slurm
    (Facts(None, None, NO_DBD), {"nodes", "slurm", "slurm-nodes"}),      # Slurm without slurmdbd or MariaDB
    (Facts(CONTAINER, NO_SLURM), set()),                                 # Kaggle, Colab
    (Facts(None, NOT_ROOT), {"nodes"}),                                  # an ordinary Linux user
    (Facts(None, NO_SLURM), {"nodes"}),                                  # root without Slurm's packages
])
def test_what_holds_in_each_setting(facts, holds):
    assert {r for r in verdict.WHAT if verdict.verdict(r, facts) is None} == holds


def test_the_line_leads_with_what_this_platform_refuses_and_where_the_section_runs_live():
    why = verdict.verdict("slurm-nodes", Facts(CONTAINER, NO_SLURM))
    assert why.full == ("Not run here: Slurm is not installed here; and this platform does not allow network "
                        "namespaces, which this section's machines are made of. This section runs live as root on a "
                        "Linux machine or VM with Slurm's packages installed; below, each cell shows what it printed "
                        "when the book was built.")
    assert why.cause == NO_SLURM + " " + CONTAINER           # the technical cause, kept apart
    assert why.short == ("Not run here, as said above: " + why.plain + ". Each cell shows what it printed when the "
                         "book was built.")
    container = verdict.verdict("nodes", Facts(CONTAINER, None))
    # a Kaggle or Colab learner cannot act on Docker's flags: they stay out of the lines a learner reads first
    assert "--privileged" not in container.full + container.short and len(container.full) < 300
    assert "Debian, Fedora, Arch" in container.full                           # where it runs live
    assert "\n" not in verdict.verdict("nodes", Facts("a\nb", None)).cause   # one line, whatever the error's layout
    accounting = verdict.verdict("slurm-accounting", Facts(None, None, NO_DBD))
    assert accounting.plain == "Slurm's job accounting (slurmdbd and MariaDB) is not installed here"
    assert accounting.cause == f"distlab.slurm: {NO_DBD}."
    assert verdict.verdict("slurm", Facts(None, NOT_ROOT)).plain.startswith("a Slurm cluster needs root")


def test_each_problem_is_named_by_its_kind_slurms_first():
    assert verdict.problems("slurm-nodes", Facts(CONTAINER, NO_SLURM)) == [("slurm", NO_SLURM), ("nodes", CONTAINER)]
    assert verdict.problems("slurm", Facts(CONTAINER, NOT_ROOT)) == [("slurm", NOT_ROOT)]
    assert verdict.problems("nodes", Facts(None, NO_SLURM)) == []


def test_a_problem_no_known_phrase_explains_still_says_what_cannot_start():
    unknown = "an error nobody has seen yet"
    assert verdict.plain("nodes", unknown) == "this machine cannot make the machines of this section"
    assert verdict.plain("slurm", unknown) == "a Slurm cluster cannot start here"


def test_a_chapter_gives_the_full_line_once_and_again_only_in_the_same_cell():
    why = verdict.verdict("nodes", Facts(CONTAINER, None))
    explained = {}
    assert magic.in_full(why, "cell a", explained)
    assert not magic.in_full(why, "cell b", explained)     # a later section: the short form
    assert magic.in_full(why, "cell a", explained)         # Run All again: its first section in full again
    assert magic.in_full(verdict.verdict("slurm", Facts(None, NO_SLURM)), "cell b", explained)   # another reason


def test_a_requirement_not_known_is_a_usage_error_naming_the_choices():
    with pytest.raises(ValueError, match=r"'gpus' is not a requirement\. usage: %%needs nodes \| slurm"):
        verdict.parse("gpus")
    assert verdict.parse(" slurm-nodes ") == "slurm-nodes"


def test_a_section_is_a_run_of_skipped_cells_with_one_requirement():
    last = {"count": 7, "requirement": "nodes"}
    assert not magic.new_section(8, "nodes", last)
    assert magic.new_section(9, "nodes", last)            # a cell ran for real in between
    assert magic.new_section(8, "slurm", last)
    assert magic.new_section(None, "nodes", last)


def test_the_key_follows_the_code_and_the_requirement_not_trailing_blanks():
    key = recorded.cell_key("nodes", "x = 1\nprint(x)\n")
    assert key == recorded.cell_key("nodes", "x = 1   \nprint(x)\n\n")
    assert key != recorded.cell_key("nodes", "x = 2\nprint(x)\n")
    assert key != recorded.cell_key("slurm", "x = 1\nprint(x)\n")
    assert recorded.split("%%needs nodes\nx = 1\n") == ("nodes", "x = 1\n")
    assert recorded.split("%%ranks\nx = 1") is None and recorded.split("x = 1") is None


def test_the_probes_agree_with_the_checks_nodes_and_the_cluster_make():
    """Cheap, real, once per kernel; here as on CI (root, namespaces allowed) or not, they say the same as
    the checks distlab.Nodes and slurm.local_cluster make before they start."""
    from distlab.errors import NodesError
    from distlab.nodes import namespaces

    facts = probe.facts(fresh=True)
    try:
        namespaces.check_possible()
        assert facts.nodes_problem is None
    except NodesError as e:
        assert facts.nodes_problem == str(e)
    assert probe.facts() is facts


# --- the magic in an IPython shell ---------------------------------------------------------------

@pytest.fixture
def shell(tmp_path, monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    folder = tmp_path / "recorded"
    folder.mkdir()
    monkeypatch.setattr(recorded, "FOLDER", folder)
    # (a partial, not find's __defaults__: under mutation testing find is a wrapper without them)
    monkeypatch.setattr(recorded, "find", functools.partial(recorded.find, folder=folder))
    recorded.everything.cache_clear()
    monkeypatch.setattr(magic, "_EXPLAINED", {})               # each test a fresh chapter
    saved = probe._FACTS
    ip.run_cell("%load_ext distlab.needs")
    yield ip
    probe._FACTS = saved
    recorded.everything.cache_clear()
    for name in ("made", "value", "Widget"):
        ip.user_ns.pop(name, None)
    # no shell outlives the test: later tests' get_ipython() would find it, and distlab would read the
    # notebook's names from this shell instead of __main__ (test_ranks' NameError hint failed after it)
    InteractiveShell.clear_instance()


def run(ip, source: str):
    result = ip.run_cell(source, store_history=True)
    return result


def record(folder, cells: dict) -> None:
    entries = {recorded.cell_key(req, body): {"requirement": req, "cell": i, "outputs": outputs}
               for i, (req, body, outputs) in enumerate(cells.values())}
    (folder / "ch.json").write_text(json.dumps({"chapter": "ch.ipynb", "cells": entries,
                                                "recorded": {"date": "2026-12-05", "setting": "Linux as root"}}))


def test_where_it_holds_the_cell_runs_as_a_plain_cell(shell, capsys, tmp_path):
    probe._FACTS = Facts(None, None)
    result = run(shell, "%%needs nodes\nclass Widget:\n    def size(self):\n        return 3\n"
                        "made = Widget().size()\nprint('printed', made)\nmade * 2\n")
    assert result.success and result.result == 6                 # its last expression is the cell's value
    assert "printed 3" in capsys.readouterr().out
    assert shell.user_ns["made"] == 3                           # its names land in the notebook
    from distlab.capture.source import class_source

    text, _ = class_source(shell.user_ns["Widget"], shell.user_ns)
    assert "return 3" in text                                   # capturable for the ranks
    assert run(shell, "%%needs nodes\nvalue = 1;\nvalue;\n").result is None      # a ; hides the value
    failed = run(shell, "%%needs nodes\nassert made == 4, 'the claim'\n")
    assert isinstance(failed.error_in_exec, AssertionError)      # an exception is the cell's


def test_where_it_does_not_hold_nothing_runs_and_the_recording_shows(shell, capsys, tmp_path):
    probe._FACTS = Facts(CONTAINER, None)
    body = f"open({str(tmp_path / 'made.txt')!r}, 'w').write('x')\nassert False\nmade = 1\n"
    record(tmp_path / "recorded", {"a": ("nodes", body, [{"output_type": "stream", "name": "stdout",
                                                          "text": "what it printed\n"}])})
    result = run(shell, "%%needs nodes\n" + body)
    out = capsys.readouterr().out
    assert result.success and "made" not in shell.user_ns and not (tmp_path / "made.txt").exists()
    assert out.count("Not run here: this platform does not allow network namespaces") == 1
    assert f"{recorded.DETAIL}: {CONTAINER}" in out                       # the cause, after the line
    assert "Recorded when the book was built (2026-12-05; Linux as root). Not run here." in out
    assert "what it printed\nThis cell checked, when the book was built: False." in out
    run(shell, "%%needs nodes\n" + body)                        # the same section goes on: no second reason
    assert "Not run here:" not in capsys.readouterr().out
    run(shell, "x = 1")
    run(shell, "%%needs nodes\nprint('another')\n")           # a later section: the short form, no cause
    out = capsys.readouterr().out
    assert "Not run here, as said above: this platform does not allow" in out and CONTAINER not in out


def test_a_recorded_cell_says_what_its_asserts_checked():
    body = ("%time x = 1\n"
            "def f():\n    assert False  # inside a function: runs where it is called\n"
            "# the law, within a margin\n# for a busy machine\nassert x == 1\n"
            "for r in range(2):\n    assert r < 2  # every row\n"
            "assert x + 1 == 2\nassert x < 2, 'x'\n")
    assert recorded.checked(body) == ("This cell checked, when the book was built: the law, within a margin for a "
                                      "busy machine; every row; x + 1 == 2; x < 2.")
    assert recorded.checked("print(1)\n") is None and recorded.checked("def (:\n") is None
    assert recorded.checked("assert " + "x" * 200).endswith("xxx....")     # one line: a long claim is cut


def test_the_checked_line_follows_the_recording(shell, capsys, tmp_path):
    probe._FACTS = Facts(CONTAINER, None)
    body = "# the claim\nassert False\n"
    record(tmp_path / "recorded", {"a": ("nodes", body, [{"output_type": "stream", "name": "stdout",
                                                          "text": "what it printed\n"}])})
    assert run(shell, "%%needs nodes\n" + body).success
    out = capsys.readouterr().out
    assert out.rstrip().endswith("what it printed\nThis cell checked, when the book was built: the claim.")


def test_a_changed_cell_shows_no_stale_recording(shell, capsys):
    probe._FACTS = Facts(CONTAINER, None)
    assert run(shell, "%%needs nodes\nprint('a cell never recorded')\n").success
    out = capsys.readouterr().out
    assert "No recording of this cell: its code differs from the book's." in out
    assert "a cell never recorded" not in out


def test_a_bad_requirement_stops_the_cell_with_the_usage(shell, capsys):
    result = run(shell, "%%needs gpus\nprint('ran')\n")
    assert not result.success and "ran" not in capsys.readouterr().out


# --- mutation second pass (#60): the parts the shell tests do not look at ------------------------

def test_a_cells_key_is_the_one_the_shipped_recordings_were_made_with():
    """The recordings in the package are found by this key: another form of it orphans every one of them."""
    assert recorded.cell_key("slurm", "a = 1\nb = 2\n") == "adc3ae3e456ef9133e1f"


@pytest.fixture
def shown(monkeypatch):
    """What :func:`recorded.show` and :func:`recorded.note` hand to IPython's display: (object, keywords)."""
    import IPython.display

    calls = []
    monkeypatch.setattr(IPython.display, "display", lambda *args, **kw: calls.append((args, kw)))
    return calls


def test_a_recordings_streams_and_displays_come_back_as_they_were(shown, capsys):
    png = {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"}
    recording = {"recorded": {"date": "2026-12-05", "setting": "Linux as root"}, "outputs": [
        {"output_type": "stream", "name": "stdout", "text": "to stdout\n"},
        {"output_type": "stream", "name": "stderr", "text": "to stderr\n"},
        {"output_type": "display_data", "data": png, "metadata": {"image/png": {"width": 300}}},
        {"output_type": "execute_result", "data": {"text/plain": "6"}, "execution_count": 3},
        {"output_type": "error", "ename": "E", "evalue": "", "traceback": []}]}
    recorded.show(recording)
    out = capsys.readouterr()
    assert (out.out, out.err) == ("to stdout\n", "to stderr\n")
    assert shown[1:] == [((png,), {"raw": True, "metadata": {"image/png": {"width": 300}}}),
                         (({"text/plain": "6"},), {"raw": True, "metadata": {}})]  # (shown[0]: the label)


def test_the_note_is_a_box_in_html_and_one_line_in_plain_text(shown):
    recorded.note("Not run <here>")
    recorded.note("Not run", "a <cause>")
    style = "border-left:4px solid #c90;padding:2px 8px;margin:2px 0;font-style:italic"
    assert shown == [
        (({"text/plain": "Not run <here>", "text/html": f'<div style="{style}">Not run &lt;here&gt;</div>'},),
         {"raw": True}),
        (({"text/plain": f"Not run {recorded.DETAIL}: a <cause>",
           "text/html": f'<div style="{style}">Not run<details><summary style="font-style:normal">'
                        f'{recorded.DETAIL}</summary>a &lt;cause&gt;</details></div>'},), {"raw": True})]


@pytest.mark.parametrize("body, claim", [
    ("#Xs mark the spot\nassert x\n", "Xs mark the spot"),                    # only the comment's # goes
    ("# the sum is right.\nassert x\n", "the sum is right"),                  # its end's punctuation goes
    ("# the last is X\nassert x\n", "the last is X"),
    ("# .5 is half\nassert x\n", ".5 is half"),                                # not its start's
    ("assert (x ==  # not this comment\n        1)\n", "x == # not this comment 1"),  # a longer assert: its code
    ("# " + "a" * 90 + "\nassert x\n", "a" * 90),                                # the limit itself is not cut
    ("# " + "a" * 86 + " " + "b" * 10 + "\nassert x\n", "a" * 86 + "..."),       # cut, its blanks dropped
    ("# " + "a" * 85 + " " + "b" * 10 + "\nassert x\n", "a" * 85 + " b..."),
])
def test_each_claim_is_its_comment_or_its_code_cut_at_the_limit(body, claim):
    assert recorded.checked(body) == recorded.CHECKED.format(claims=claim)


# --- the probes, with the checks they make stubbed (#60: probe.py mutated; no process started) ----------------

@pytest.fixture
def checks(monkeypatch):
    """What the probes' checks say: an exception to raise (or None) each, and how often they ran."""
    from distlab.needs import probe as probe_module

    state = {"nodes": None, "slurm": None, "accounting": None, "runs": 0, "on_nodes": []}

    def check_possible():
        state["runs"] += 1
        if state["nodes"] is not None:
            raise state["nodes"]

    def check_can_start():
        if state["slurm"] is not None:
            raise state["slurm"]

    def accounting(on_nodes=False):
        state["on_nodes"].append(on_nodes)
        return state["accounting"]

    monkeypatch.setattr(probe_module.namespaces, "check_possible", check_possible)
    monkeypatch.setattr(probe_module, "check_can_start", check_can_start)
    monkeypatch.setattr(probe_module.accounting, "problem", accounting)
    monkeypatch.setattr(probe_module, "_FACTS", None)
    return state


def test_each_probe_keeps_the_text_of_the_error_its_check_raises(checks):
    from distlab.errors import NodesError
    from distlab.slurm.errors import ClusterError

    assert probe.nodes_problem() is None and probe.slurm_problem() is None
    checks["nodes"], checks["slurm"] = NodesError(CONTAINER), ClusterError("it needs root", "Run as root.")
    assert probe.nodes_problem() == CONTAINER
    assert probe.slurm_problem() == str(ClusterError("it needs root", "Run as root."))
    checks["nodes"] = FileNotFoundError(2, "No such file or directory", "unshare")
    assert probe.nodes_problem() == ("distlab: cannot start nodes: [Errno 2] No such file or directory: 'unshare'. "
                                     "Install util-linux (Debian: apt-get install util-linux).")


def test_the_facts_are_probed_once_per_kernel_unless_asked_again(checks):
    from distlab.errors import NodesError
    from distlab.slurm.errors import ClusterError

    facts = probe.facts()
    assert facts == Facts(None, None, None) and probe.facts() is facts and checks["runs"] == 1
    checks["nodes"], checks["accounting"] = NodesError(CONTAINER), NO_DBD
    assert probe.facts() is facts and checks["runs"] == 1
    checks["slurm"] = ClusterError("it needs root", "Run as root.")
    fresh = probe.facts(fresh=True)
    assert fresh == Facts(CONTAINER, str(checks["slurm"]), NO_DBD) and checks["runs"] == 2
    assert probe.facts() is fresh
    assert checks["on_nodes"] == [True, False]  # accounting asks whether the cluster will have nodes


@pytest.mark.parametrize("facts, holding", [
    (Facts(None, None), ["nodes", "slurm", "slurm-nodes"]),
    (Facts(CONTAINER, None), ["slurm"]),
    (Facts(None, NOT_ROOT), ["nodes"]),
])
def test_holds_answers_for_this_machine(checks, monkeypatch, facts, holding):
    monkeypatch.setattr(probe, "_FACTS", facts)
    assert [r for r in ("nodes", "slurm", "slurm-nodes") if probe.holds(r)] == holding
    with pytest.raises(ValueError):
        probe.holds("gpus")


def test_a_failing_cell_s_traceback_shows_the_cell_not_the_magic(shell, capsys):
    """The magic's own frames are hidden (__tracebackhide__): the learner sees the cell's line that failed."""
    probe._FACTS = Facts(None, None)
    assert not run(shell, "%%needs nodes\nx = 1\n1 / 0\n").success
    out = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)  # IPython's colours
    assert "ZeroDivisionError" in out and "1 / 0" in out and not re.search(r"in \w*(run_here|needs_magic)", out), out


# --- the magic's parts with a stand-in shell (#60: mutation) ----------------------------------------------------

class CellShell:
    """What run_here asks of IPython: the cell's transformed code, and a name for it in linecache."""

    execution_count = 7

    def __init__(self):
        self.user_ns: dict = {}
        self.cached: list = []
        self.compile = self

    def transform_cell(self, cell):
        return cell.replace("%time ", "")

    def cache(self, code, number, raw_code=None):
        self.cached.append((code, number, raw_code))
        return f"<cell {number}>"


def test_a_cell_is_registered_under_its_number_with_its_own_text():
    shell = CellShell()
    assert magic.run_here(shell, "%time x = 1\nx + 1\n") == 2 and shell.user_ns["x"] == 1
    assert shell.cached == [("x = 1\nx + 1\n", 7, "%time x = 1\nx + 1\n")]
    assert magic.run_here(shell, "y = 2\n") is None and shell.user_ns["y"] == 2  # no last expression: no value
    assert magic.run_here(shell, "y;") is None                                   # a ; hides it
    with pytest.raises(SyntaxError) as bad:
        magic.run_here(shell, "z = (\n")
    assert bad.value.filename == "<cell 7>"  # where IPython's traceback finds the cell's lines


def test_a_requirement_not_known_is_said_as_parse_says_it(shell):
    result = run(shell, "%%needs gpus\nprint('ran')\n")
    with pytest.raises(ValueError) as parsed:
        verdict.parse("gpus")
    assert str(result.error_in_exec) == str(parsed.value)


def test_reloading_the_extension_stays_possible_after_each_cell(shell, monkeypatch):
    assert "distlab.needs" not in shell.extension_manager.loaded  # the cell that loaded it has run
    run(shell, "x = 1")
    assert "distlab.needs" not in shell.extension_manager.loaded
    shell.extension_manager.loaded.add("distlab.needs")
    magic.forget_loaded(object())
    assert "distlab.needs" not in shell.extension_manager.loaded
    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    magic.forget_loaded()  # outside IPython: nothing to forget


def test_outside_ipython_a_skipped_cell_still_says_why_and_what_is_missing(shown, monkeypatch, tmp_path):
    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    monkeypatch.setattr(magic, "_EXPLAINED", {})
    monkeypatch.setattr(magic, "_LAST_SKIPPED", {"count": None, "requirement": None})
    monkeypatch.setattr(recorded, "find", lambda requirement, cell: None)
    monkeypatch.setattr(probe, "_FACTS", Facts(CONTAINER, None))
    assert magic.needs_magic("nodes", "print('never recorded')\n") is None
    said = [args[0]["text/plain"] for args, _ in shown]
    assert said[-1] == recorded.NO_RECORDING.format(what=verdict.WHAT["nodes"]) and len(said) == 2
    assert magic._LAST_SKIPPED == {"count": None, "requirement": "nodes"}
