"""Mutation testing of distlab's pure modules (issues #21, #60). The full form is slow; CI runs a sampled one.

Runs mutmut 3: it copies the project into ``mutants/``, breaks the code one small change at a
time and runs the fast tests against each break. Which modules and which tests is configured in
``[tool.mutmut]`` of pyproject.toml (``only_mutate``: every module whose tests start no process;
tests that start processes are not selected). Then this script lists every surviving mutant that
is not accepted below as equivalent, the score of each module, and ends with

    score: X      (killed / (total - equivalent); timeouts, untested and not-run mutants are survivors)

    python bench/mutation.py                      # the full form, from scratch (deletes mutants/), in one mutmut run
    python bench/mutation.py --module nodes.plan  # one module (repeatable); reuses mutants/
    python bench/mutation.py --report-only        # score the last run again
    python bench/mutation.py --changed            # CI's form: the modules the change touched, within 5 minutes

"The change" (``--changed``): the files that differ between the first parent of HEAD and the working
tree. On main, HEAD is the lead's merge commit, so that is everything the merge brought; on a
branch, the last commit plus anything not committed. ``--base REF`` names another starting point.
Its mutants run fastest first (mutmut's order) until ``--budget`` seconds (default 300) are spent;
the ones not reached are counted as sampled out, not as survivors. It exits 1 when any mutant it ran
survived that is not listed below as equivalent.

An equivalent mutant changes the code but not what it does, so no test can kill it. Each one is
matched by the function it is in and a piece of its mutated line, with the reason it is harmless.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
GOAL = 0.95
# a mutant a test caught; "timeout", "suspicious", "survived", "no tests" and "not checked" are survivors
KILLED = {"killed", "segfault", "caught by type check"}
BUDGET_S = 300  # the sampled form's limit (CI)

# (module.function the mutant is in, text in its mutated line, why no test can tell it apart)
EQUIVALENT: list[tuple[str, str, str]] = [
    ("distlab.capture.collect.global_names", '"XX<distlab-capture>XX"',
     "the file name given to compile() only shows in a SyntaxError, and the text comes from code that compiled"),
    ("distlab.capture.collect.global_names", '"<DISTLAB-CAPTURE>"', "the same file name, upper-cased"),
    ("distlab.results.read_returns", "map_location=None",
     "only a return value saved on a GPU loads differently; the fast tests run without one"),
    ("distlab.results.read_returns", "torch.load(path, weights_only=False)", "map_location dropped: as above"),
    ("distlab.config.device", "local - 1)))",
     "choose_device asks for max(world_size, local_rank + 1) GPUs: a world size below local_rank + 1 changes nothing"),
    ("distlab.capture.source._around_methods", "_first_line(n) < code.co_firstlineno",
     "a method's def cannot begin on the first line of its class statement"),
    ("distlab.capture.source._written_in", "candidate.span[0] < code.co_firstlineno",
     "a method's def cannot begin on the first line of its class statement"),
    ("distlab.slurm.tail.Tail.flush", "self.partial.pop(path, None)",
     "None and b'' are both false: the unfinished line is dropped either way"),
    # /proc's files are ASCII: the codec they are read with, or its name's case, changes nothing
    ("distlab.folders.owner.machine", 'boot_id", encoding=None)', "/proc's boot id is ASCII"),
    ("distlab.folders.owner.machine", 'boot_id", )', "/proc's boot id is ASCII"),
    ("distlab.folders.owner.machine", 'encoding="ASCII"', "a codec name's case does not matter"),
    ("distlab.folders.owner.start_ticks", 'encoding=None, errors="replace"', "read as UTF-8 with replace: "
     "only the command name may hold other bytes, and it is cut off"),
    ("distlab.folders.owner.start_ticks", 'stat", errors="replace")', "as above (the default codec)"),
    ("distlab.folders.owner.start_ticks", 'encoding="ASCII"', "a codec name's case does not matter"),
    ("distlab.folders.owner.read", 'encoding="ASCII"', "a codec name's case does not matter"),
    ("distlab.folders.owner.reused", '"/proc/stat", encoding=None)', "/proc/stat is ASCII"),
    ("distlab.folders.owner.reused", '"/proc/stat", )', "/proc/stat is ASCII"),
    ("distlab.folders.owner.reused", 'encoding="ASCII"', "a codec name's case does not matter"),
    ("distlab.folders.owner.reused", "return True",
     "the except branch: Linux's /proc/stat always has its btime line (only that branch returns False twice)"),
    ("distlab.folders.owner.write", "getattr(None,", "O_CREAT|O_EXCL already refuses any existing name, a link "
     "included: O_NOFOLLOW adds nothing"),
    ("distlab.folders.owner.write", 'getattr(os, "O_NOFOLLOW", None)', "the name exists on Linux"),
    ("distlab.folders.owner.write", 'getattr(os, "O_NOFOLLOW", )', "the name exists on Linux"),
    ("distlab.folders.owner.write", 'getattr(os, "O_NOFOLLOW", 1)', "the name exists on Linux"),
    ("distlab.folders.owner.write", '"XXO_NOFOLLOWXX"', "O_CREAT|O_EXCL already refuses a link (see above)"),
    ("distlab.folders.owner.write", '"o_nofollow"', "O_CREAT|O_EXCL already refuses a link (see above)"),
    ("distlab.folders.owner.write", 'os.fdopen(fd, "w", encoding=None)', "a stamp is ASCII in any codec"),
    ("distlab.folders.owner.write", 'os.fdopen(fd, "w", )', "a stamp is ASCII in any codec"),
    ("distlab.folders.owner.write", 'encoding="ASCII"', "a codec name's case does not matter"),
    ("distlab.teach.ring.reduce_scatter_phase", "dtype=like.dtype, device=None)",
     "the scratch buffers' device: the fast tests have only a CPU"),
    ("distlab.teach.ring.reduce_scatter_phase", "dtype=like.dtype, ) for",
     "the scratch buffers' device: the fast tests have only a CPU"),
    ("distlab.teach.ring.reduce_scatter_phase", "range(2 if (n > 2) or True else 1)",
     "a second scratch buffer where one suffices only costs memory"),
    ("distlab.teach.ring.reduce_scatter_phase", "range(3 if n > 2 else 1)", "a third scratch buffer only costs memory"),
    ("distlab.teach.ring.reduce_scatter_phase", "range(2 if n >= 2 else 1)",
     "a second scratch buffer at 2 ranks (one step, nothing posted ahead) only costs memory"),
    ("distlab.teach.ring.reduce_scatter_phase", "range(2 if n > 2 else 2)",
     "a second scratch buffer at 2 ranks (one step, nothing posted ahead) only costs memory"),
    ("distlab.teach.sampler.global_order", "math.ceil(size * n)",
     "more rounds of the order than needed, then cut to the same size: only memory"),
    ("distlab.teach.ring.add_on_this_thread", "if dst.device.type",
     "which of two ways to add the same numbers (in slices or at once) is taken: the sum is the same"),
    ("distlab.teach.ring.add_on_this_thread", "src.split(SERIAL_NUMEL), strict=None)", "dst and src have one size"),
    ("distlab.teach.ring.add_on_this_thread", "src.split(SERIAL_NUMEL), )", "dst and src have one size"),
    ("distlab.teach.ring.add_on_this_thread", "src.split(SERIAL_NUMEL), strict=False)", "dst and src have one size"),
    ("distlab.slurm.jobenv.install", "os.makedirs(door / BIN, )", "chmod sets 0750 on env and env/bin right after"),
    ("distlab.slurm.jobenv.install", "os.makedirs(door / BIN, 489)", "chmod sets 0750 on env and env/bin right after"),
    ("distlab.slurm.jobenv._write", "os.O_NOFOLLOW, )", "chmod sets 0750 right after, inside the root's 0750 door"),
    ("distlab.slurm.jobenv._write", "os.O_NOFOLLOW, 449)", "chmod sets 0750 right after, inside the root's 0750 door"),
    ("distlab.teach.sampler.check_join_lr", "math.isclose(float(answer), want, )", "1e-9 is isclose's default"),
    ("distlab.teach.ring.prepare_ring", "step = max(2, chunk_bytes",
     "a chunk of 2 elements instead of 1 when chunk_bytes is below one element: other pieces, the same sum"),
    ("distlab.capture.source._from_inspect", "cls.__name__)[:2]",
     "a second candidate exists only for a class holding a nested class of its own name"),
    # --- mut-b ---
    # a captured constant is `name = repr(value)`: the text before its first " = " is an identifier
    ("distlab.warm.proto.captured_head", "line.split(None, 1)[0]", "an identifier has no whitespace"),
    ("distlab.warm.proto.captured_head", 'line.split(" = ", )[0]', "more splits leave the first piece as it is"),
    ("distlab.warm.proto.captured_head", 'line.split(" = ", 2)[0]', "more splits leave the first piece as it is"),
    ("distlab.warm.proto.shipped_rank_names", "line.split(None, 1)[0]", "an identifier has no whitespace"),
    ("distlab.warm.proto.shipped_rank_names", 'line.split(" = ", )[0]', "more splits leave the first piece as it is"),
    ("distlab.warm.proto.shipped_rank_names", 'line.split(" = ", 2)[0]', "more splits leave the first piece as it is"),
    ("distlab.warm.proto.locate", "range(len(have) - len(wanted) + 2)",
     "the extra start's slice is shorter than wanted, so never equal to it"),
    ("distlab.warm.proto.locate", "range(len(have) + len(wanted) + 1)",
     "the extra starts' slices are shorter than wanted, so never equal to it"),
    ("distlab.warm.proto.prefix_lines", 'or ["XXXX"]',
     'str.split("\\n") never returns an empty list: the fallback never runs'),
    ("distlab.warm.proto.LineJoiner.take_redrawn", 'self._partial.get(key, "XXXX")',
     "any default without a carriage return gives the same empty answer"),
    # Python >= 3.10: format_exception_only(exc) and (anything, value=exc) both read the type off the value
    ("distlab.warm.proto.user_traceback", "format_exception_only(None, exc)", "the type is read off exc"),
    ("distlab.warm.proto.user_traceback", "format_exception_only(exc)", "the type is read off exc"),
    ("distlab.warm.proto.user_traceback", "format_exception_only(type(None), exc)", "the type is read off exc"),
    # a call's phase is only tested for truth, its end only read as `self.ended or ...`: None is ""
    ("distlab.warm.status.CallStatus.__init__", "self.phase = None", "phase is only tested for truth"),
    ("distlab.warm.status.CallStatus.__init__", "self.ended = None", "ended is only read as `self.ended or ...`"),
    ("distlab.warm.status.CallStatus.end", "self.phase = None", "phase is only tested for truth"),
    ("distlab.warm.status.CallStatus.finished", 'self.states.get(rank, "XXXX")', "no state starts with XX"),
    ("distlab.warm.status.CallStatus.blocked", 'self.states.get(rank, "XXXX")', "no state starts with XX"),
    ("distlab.warm.status.CallStatus.waiting", 'self.states.get(rank, "XXXX")', "no state starts with XX"),
    ("distlab.warm.status.NoStatus.tick", "force: bool = True", "NoStatus.tick does nothing, whatever force is"),
    ("distlab.warm.data._pieces", "zip(selected, value, strict=None)", "the lengths were checked just above"),
    ("distlab.warm.data._pieces", "zip(selected, value, )", "the lengths were checked just above"),
    ("distlab.warm.data._pieces", "zip(selected, value, strict=False)", "the lengths were checked just above"),
    ("distlab.warm.data.notebook_function", 'getattr(value, "__module__", )',
     "read only of a function, and every function has a __module__"),
    ("distlab.warm.data._defined_in_notebook", 'getattr(value, "__module__", )',
     "read only of a function or class, and both always have a __module__"),
    # a Splitter's column is past the text's end until a '\r' sets it to 0: writing there appends, as at the end
    ("distlab.view.streams.Splitter.__init__", "self._col = 1", "a column past the end appends, as the end does"),
    ("distlab.view.streams.Splitter._end_line", '"", 1, False, False, None',
     "a column past the end appends, as the end does"),
    ("distlab.view.streams.Splitter.__init__", "self._after_cr = None", "only tested for truth"),
    ("distlab.view.streams.Splitter.__init__", "self._redrawn = None", "only tested for truth"),
    ("distlab.view.streams.Splitter._write", "self._redrawn, self._after_cr = True, True",
     "once redrawn, _after_cr only sets _redrawn again; the line's end resets both"),
    ("distlab.view.streams.Streams.feed", 'getincrementaldecoder("UTF-8")', "a codec name's case does not matter"),
    ("distlab.view.streams.Streams.flush", "events = splitter.feed(rest)", "events is still empty there"),
    ("distlab.view.bars.ProgressLines.show", "self._bars[key] = [None, text, None, 1.0]",
     "when a bar was shown is read only with a shower, and this is the entry of a bar without one"),
    # "ended" is the kind that nothing tests for: any other unknown kind reads the same
    ("distlab.view.record._is_open", 'else "XXendedXX"', "only failed and interrupted are told apart"),
    ("distlab.view.record._is_open", 'else "ENDED"', "only failed and interrupted are told apart"),
    ("distlab.view.record.record_html", "Outcome(None)", "an unknown kind's headline is ended, as ended's"),
    ("distlab.view.record.record_html", 'Outcome("XXendedXX")', "an unknown kind's headline is ended, as ended's"),
    ("distlab.view.record.record_html", 'Outcome("ENDED")', "an unknown kind's headline is ended, as ended's"),
    ("distlab.view.record.record_text", "Outcome(None)", "an unknown kind's headline is ended, as ended's"),
    ("distlab.view.record.record_text", 'Outcome("XXendedXX")', "an unknown kind's headline is ended, as ended's"),
    ("distlab.view.record.record_text", 'Outcome("ENDED")', "an unknown kind's headline is ended, as ended's"),
    ("distlab.view.record._short_repr", "limit: int = 401", "its one caller always passes the limit"),
    ("distlab.view.record.outcome_of", 'getattr(result, "run_dir", None) or ""', 'None or "" is ""'),
    ("distlab.view.record.Board.__init__", "self.names.get(r, None)", "a rank's name is only tested for truth"),
    ("distlab.view.record.Board.__init__", "self.names.get(r, )", "a rank's name is only tested for truth"),
    ("distlab.view.record.Board.__init__", 'self.outcome: Outcome | None = ""', "the outcome is only tested for truth"),
    ("distlab.view.record.Board.progress", "not 0 <= index <= len(state.lines)",
     "bar_at is below count while it is set: the index never reaches len(lines)"),
    ("distlab.view.record.returns_lines", "sort_dicts=None)", "pprint tests sort_dicts for truth: None is False"),
    # --- mut-a ---
    ("distlab.capture.origins.format_frames", '(f.line or "XXXX")',
     "a frame without a line: neither '' nor 'XXXX' starts with the script's call into distlab"),
    ("distlab.capture.origins.ipython_cell_label", "(shell is not None) or True",
     "without a shell, None.compile raises AttributeError, which the except turns into named = None as before"),
    ("distlab.capture.origins.ipython_cell_label", 'named = ""',
     "the except branch: '' and None are both false, so the label falls to the file check either way"),
    ("distlab.needs.recorded.claim", '(ast.get_source_segment(code, node.test) or "XXXX")',
     "the assert was parsed from this very code, so its test's segment is always found (never None)"),
    ("distlab.slurm.spec._in_background", "*lines[end + 2:]]",
     "the srun command is always the script's last line: nothing follows it to keep or drop"),
    ("distlab.slurm.spec.check_extra", '"XX\\nXX" in option',
     "OPTION alone refuses a newline (its . never matches one, and strip() removed the one $ would allow)"),
    ("distlab.teach.network.net_dev", 'line.rpartition(":")', "a line of /proc/net/dev has one colon, after its name"),
    ("distlab.teach.network.net_dev", "numbers.split()), strict=None))", "strict=None is strict=False"),
    ("distlab.teach.network.net_dev", "numbers.split()), ))", "strict=False is zip's default"),
    ("distlab.teach.network.paired_summary", "zip(mine, base, strict=None)", "strict=None is strict=False"),
    ("distlab.teach.network.paired_summary", "zip(mine, base, )", "strict=False is zip's default"),
    # --- mut-c ---
    ("distlab.errors.RunInterrupted._render_traceback_", "notebook_message(None, head)",
     "notebook_message only tests the name for truth: None and \"\" both give no name"),
    ("distlab.errors.NodeRunInterrupted._render_traceback_", "notebook_message(None, str(self))",
     "the same: None and \"\" both give no name"),
    ("distlab.results._folder", "isinstance(run_dir, RunFolder)) and False",
     "a RunFolder holds only its path, and RunFolder(a RunFolder) takes the same path through __fspath__"),
    # --- mut-e ---
    ("distlab.check.detect._differ", "strict=None", "strict=None is strict=False"),
    ("distlab.check.detect._differ", 'a["scale"], ))', "strict=False is zip's default"),
    ("distlab.check.detect.every_rank_saves", 'path.rsplit("/", )[-1]',
     "[-1] of rsplit is the last piece, split once or all"),
    ("distlab.check.detect.every_rank_saves", 'path.rsplit("/", 2)[-1]',
     "the same: the last piece, split once or twice"),
    ("distlab.check.detect.gradients_not_synchronized", "s != 0",
     "an opt with no step 0 is skipped (None in before), one with only step 0 has no after: the same opts report"),
    ("distlab.check.detect.gradients_not_synchronized", 'before[1]["shapes"]',
     "all shapes equal to rank 0's is all equal to rank 1's (2+ ranks here)"),
    ("distlab.check.detect.gradients_not_synchronized", "range(1 + max(",
     "step 0 is the before the loop already found equal: it never reports"),
    ("distlab.check.detect.gradients_not_synchronized", "2 + max(",
     "no rank recorded the step after the last: None in after, skipped"),
    ("distlab.check.detect.script_error", "n <= after", "the event at index after is the collective, never an error"),
    # --- mut-d ---
    # mkdir said a folder above the root is missing, so the last folder makedirs makes does not exist:
    # exist_ok could matter only if someone made it in between (and check_ancestors then judges it)
    ("distlab.folders.private._checked_root", "PRIVATE_DIR, exist_ok=None)", "exist_ok matters only in a race"),
    ("distlab.folders.private._checked_root", "PRIVATE_DIR, )", "exist_ok matters only in a race"),
    ("distlab.folders.private._checked_root", "PRIVATE_DIR, exist_ok=False)", "exist_ok matters only in a race"),
    # the second check, after makedirs: the root did not exist a moment ago, so it holds no mark and
    # vouched is False (the same text in the first check is killed by the user-namespace tests)
    ("distlab.folders.private._checked_root", "check_ancestors(path.parent, None)",
     "vouched is False there: None is too"),
    ("distlab.folders.private._checked_root", "check_ancestors(path.parent, )", "vouched is False there: the default"),
    ("distlab.folders.private.open_private", 'getattr(os, "O_NOFOLLOW", None)', "the name exists on Linux"),
    ("distlab.folders.private.open_private", 'getattr(os, "O_NOFOLLOW", )', "the name exists on Linux"),
    ("distlab.folders.private.open_private", 'getattr(os, "O_NOFOLLOW", 1)', "the name exists on Linux"),
    ("distlab.folders.private.open_private", 'getattr(os, "O_CLOEXEC", 1)', "the name exists on Linux"),
    ("distlab.folders.private.open_private", 'getattr(os, "O_CLOEXEC", )', "the name exists on Linux"),
    # without O_CLOEXEC: os.open makes every descriptor non-inheritable anyway (PEP 446)
    ("distlab.folders.private.open_private", 'getattr(None, "O_CLOEXEC", 0)', "os.open sets close-on-exec itself"),
    ("distlab.folders.private.open_private", 'getattr(os, "XXO_CLOEXECXX", 0)', "os.open sets close-on-exec itself"),
    ("distlab.folders.private.open_private", 'getattr(os, "o_cloexec", 0)', "os.open sets close-on-exec itself"),
    # owner.verdict reads owner.machine() itself when given None: only the number of reads changes
    ("distlab.folders.private.stale_dirs", "here = None", "verdict asks owner.machine() itself"),
    ("distlab.folders.private.stale_dirs", "who[1], None)", "verdict asks owner.machine() itself"),
    ("distlab.folders.private.stale_dirs", "who[1], )", "verdict asks owner.machine() itself"),
    # the entry is a real folder by then (is_dir(follow_symlinks=False) let it through): following changes nothing
    ("distlab.folders.private.stale_dirs", "entry.stat(follow_symlinks=None)", "a folder, not a link"),
    ("distlab.folders.private.stale_dirs", "entry.stat(follow_symlinks=True)", "a folder, not a link"),
    # --- runfolder (lead) ---
    # os.DirEntry's follow_symlinks is a flag: None reads as False, the value it replaces
    ("distlab.folders.runfolder.last_change", "stat(follow_symlinks=None)", "DirEntry reads None as False"),
    ("distlab.folders.runfolder.last_change", "is_dir(follow_symlinks=None)", "DirEntry reads None as False"),
    ("distlab.folders.runfolder.prune", "is_dir(follow_symlinks=None)", "DirEntry reads None as False"),
    # --- compat (lead) ---
    ("distlab.launch.compat.check_torch", 'or "XXXX"', "a store without a docstring lacks master_listen_fd either way"),
    # --- mut-coll ---
    # op_name upper-cases an op's name before it looks it up: "sum" is "SUM"
    ("distlab.teach.collective_results.combine", 'op="sum"', "op_name upper-cases it: the same op"),
    ("distlab.teach.collective_results.ref_reduce", 'op="sum"', "op_name upper-cases it: the same op"),
    ("distlab.teach.collective_results.ref_all_reduce", 'op="sum"', "op_name upper-cases it: the same op"),
    ("distlab.teach.collective_results.ref_reduce_scatter", 'op="sum"', "op_name upper-cases it: the same op"),
    ("distlab.teach.collective_results.ref_group_all_reduce", 'op="sum"', "op_name upper-cases it: the same op"),
    ("distlab.teach.collective_results.bench_expected", "n * (n - 1) / 2",
     "n(n-1) is even, so / gives the same number; a float32 tensor plus a Python float stays float32"),
    # zip(strict=True) where the lengths are equal already: strict can never raise there
    ("distlab.teach.collective_results.check_against_reference", "expected, strict=None)", "lengths asserted equal"),
    ("distlab.teach.collective_results.check_against_reference", "expected, strict=False)", "lengths asserted equal"),
    ("distlab.teach.collective_results.check_against_reference", "zip(after, expected, )", "lengths asserted equal"),
    ("distlab.teach.collective_results.check_reduce_scatter", "expected, strict=None)", "lengths checked equal above"),
    ("distlab.teach.collective_results.check_reduce_scatter", "expected, strict=False)", "lengths checked equal above"),
    ("distlab.teach.collective_results.check_reduce_scatter", "zip(answer, expected, )", "lengths checked equal above"),
    ("distlab.teach.collective_results.same", "zip(a, b, strict=None)", "len(a) == len(b) is checked first"),
    ("distlab.teach.collective_results.same", "zip(a, b, strict=False)", "len(a) == len(b) is checked first"),
    ("distlab.teach.collective_results.same", "zip(a, b, )", "len(a) == len(b) is checked first"),
    ("distlab.teach.collective_results.ring_segments", "ends[1:], strict=None)", "slices of one list: same length"),
    ("distlab.teach.collective_results.ring_segments", "ends[1:], strict=False)", "slices of one list: same length"),
    ("distlab.teach.collective_results.ring_segments", "ends[1:], )", "slices of one list: same length"),
    # same() casts both sides to float64 and compares with allclose: an answer cast to float32 first
    # (ints, floats, bools, as the exercise gets them) compares the same
    ("distlab.teach.collective_results.check_reduce_scatter", "torch.as_tensor(got, dtype=None)",
     "same() compares in float64 either way"),
    ("distlab.teach.collective_results.check_reduce_scatter", "torch.as_tensor(got, )",
     "same() compares in float64 either way"),
    ("distlab.teach.models.DummyDataset.__init__", "torch.randint(2, (size,)", "randint's low is 0 by default"),
    # --- mut-misc ---
    ("distlab.folders.private.open_private", 'getattr(os, "O_CLOEXEC", None)', "the name exists on Linux"),
    ("distlab.folders.private.stale_dirs", "entry.is_dir(follow_symlinks=None)", "None is false, as False is"),
    # a folder of yours that exists already: exist_ok=False raises FileExistsError, an OSError, which is suppressed
    ("distlab.folders.compile_cache.use_private_cache", "os.makedirs(chosen, PRIVATE_DIR, exist_ok=None)",
     "nothing to make: the error is suppressed"),
    ("distlab.folders.compile_cache.use_private_cache", "os.makedirs(chosen, PRIVATE_DIR, )",
     "nothing to make: the error is suppressed"),
    ("distlab.folders.compile_cache.use_private_cache", "os.makedirs(chosen, PRIVATE_DIR, exist_ok=False)",
     "nothing to make: the error is suppressed"),
    # a pidfd or a namespace file: os.open makes every descriptor non-inheritable anyway (PEP 446)
    ("distlab.nodes.held.hold", "os.O_RDONLY & os.O_CLOEXEC", "os.open sets close-on-exec itself"),
    ("distlab.nodes.held.Held.alive", "poller.poll(1)", "a 1 ms wait: the same answer, a millisecond later"),
    ("distlab.nodes.held.Held.alive", "poller.register(self.pidfd, )",
     "a pidfd signals only POLLIN (its process ended): the default mask asks the same"),
    # stderr is line-buffered (Python 3.9+) and the text ends with print's newline
    ("distlab.slurm.door._say", "flush=None", "the newline flushes stderr"),
    ("distlab.slurm.door._say", "flush=False", "the newline flushes stderr"),
    ("distlab.slurm.door._say", "file=sys.stderr, )", "the newline flushes stderr"),
    ("distlab.slurm.door.acl_value", 'struct.pack("<i", ACL_VERSION)', "version 2 packs to the same four bytes"),
    ("distlab.slurm.door.grant_only", "follow_symlinks=None", "None is false, as False is"),
    # os.chmod sets 0711 right after each os.mkdir, whatever mode mkdir made it with (inside the door: root's)
    ("distlab.slurm.door.make_door", 'os.mkdir(door / "spool", )', "the chmod after it sets the mode"),
    ("distlab.slurm.door.make_door", 'os.mkdir(door / "spool", 458)', "the chmod after it sets the mode"),
    ("distlab.slurm.door.make_door", 'os.mkdir(door / "spool" / host, )', "the chmod after it sets the mode"),
    ("distlab.slurm.door.make_door", 'os.mkdir(door / "spool" / host, 458)', "the chmod after it sets the mode"),
    ("distlab.slurm.door.make_door", 'os.mkdir(door / "jobs", )', "the chmod after it sets the mode"),
    ("distlab.slurm.door.make_door", 'os.mkdir(door / "jobs", 458)', "the chmod after it sets the mode"),
    # --- mut-teach ---
    ("distlab.teach.zero.deepspeed_fp32_bytes", "zero_bytes(psi, world_size, stage, )",
     "fp32 is zero_bytes's default precision"),
    ("distlab.teach.zero.check_adam_scale", "adam_update_ratio(3.0)",
     "Adam is scale-invariant to float32's precision: the measured ratio is exactly 1.0 for 3 as for 2"),
    ("distlab.teach.zero.adam_update_ratio", "for s in (2.0, scale)",
     "the same reason: the unscaled run's summed moves equal the run scaled by 2, to float32's precision"),
    ("distlab.teach.zero.adam_update_ratio", "torch.optim.Adam([p], )", "1e-3 is Adam's default learning rate"),
    ("distlab.teach.zero.adam_update_ratio", "lr=1.001)",
     "the learning rate scales both runs' moves alike: their ratio does not depend on it"),
    ("distlab.teach.zero.grad_bytes", "if (optimizer is not None) or True else []",
     "getattr(None, name, None) is None: without an optimizer there is no buffer either way"),
    ("distlab.teach.zero.grad_bytes", "if (p.grad is None) and False else _local(p.grad)",
     "_local(None) is None: a parameter without a gradient is skipped either way"),
    ("distlab.teach.practice.max_rel_gap", "zip(a, b, strict=None)", "the lengths were checked just above"),
    ("distlab.teach.practice.max_rel_gap", "zip(a, b, )", "the lengths were checked just above"),
    ("distlab.teach.practice.max_rel_gap", "zip(a, b, strict=False)", "the lengths were checked just above"),
    ("distlab.teach.p2p.simulate", "progress = None", "progress is only tested for truth: None is False"),
    ("distlab.teach.zero.reference_losses", "torch.set_num_threads(2)",
     "a tiny model's operations are not split over threads: the count only changes the speed"),
    ("distlab.teach.zero._simulate", "range(world_size + 1 if not average else 0)",
     "an extra copy that no rank (r % len(models)) trains changes no loss"),
    ("distlab.teach.zero._simulate", "rank=r, ) for r", "shuffle=True is DistributedSampler's default"),
    ("distlab.teach.zero._simulate", "zip(*loaders, strict=None)",
     "DistributedSampler pads every rank to the same number of samples: the loaders are equally long"),
    ("distlab.teach.zero._simulate", "zip(*loaders, )", "as above: the loaders are equally long"),
    ("distlab.teach.zero._simulate", "zip(*loaders, strict=False)", "as above: the loaders are equally long"),
]


def mutmut(*args: str, check: bool = True, timeout: float | None = None) -> str:
    """Run mutmut in the project root; its progress goes to our stdout when not captured. ``run``
    with a ``timeout``: stopped there (its whole process group), the mutants not reached stay unchecked."""
    command = [sys.executable, "-m", "mutmut", *args]
    if args[0] == "run":
        with scratch() as env, subprocess.Popen(command, cwd=ROOT, text=True, start_new_session=True,
                                                env=env) as proc:
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                print(f"mutation.py: the {timeout:.0f} s budget is spent; mutants not reached are sampled out")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return ""
        if check and code != 0:
            sys.exit(f"mutation.py: `mutmut {' '.join(args)}` failed ({code})")
        return ""
    done = subprocess.run(command, cwd=ROOT, text=True, capture_output=True)
    if check and done.returncode != 0:
        sys.exit(f"mutation.py: `mutmut {' '.join(args)}` failed ({done.returncode}):\n{done.stderr or ''}")
    return done.stdout or ""


@contextlib.contextmanager
def scratch():
    """The environment of one ``mutmut run``: ``TMPDIR`` and distlab's runs root in a folder of its own,
    removed afterwards with whatever is in it. A mutant can send a file to the default place instead of the
    test's (``dir=None`` for ``dir=root``); the test fails, as it should, but cannot clean up what the
    broken code put elsewhere: without this, run folders piled up in /tmp."""
    folder = tempfile.mkdtemp(prefix="distlab-mutation-")
    try:
        yield {**os.environ, "TMPDIR": folder, "DISTLAB_RUNS": os.path.join(folder, "runs")}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def statuses() -> dict[str, str]:
    """mutant name -> status, for every mutant of the last run."""
    found = {}
    for line in mutmut("results", "--all", "true").splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and name.startswith(("distlab.", "src.")):
            found[name] = status
    if not found:
        sys.exit("mutation.py: mutmut reported no mutants; did `mutmut run` finish?")
    return found


def mutated_lines(name: str) -> list[str]:
    """The lines a mutant added, from ``mutmut show`` (a unified diff)."""
    diff = mutmut("show", name)
    return [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]


def function_of(name: str) -> str:
    """``distlab.capture.collect.x_compact__mutmut_3`` -> ``distlab.capture.collect.compact`` (methods too)."""
    module, _, mangled = name.rpartition(".")
    mangled = re.sub(r"__mutmut_\d+$", "", mangled)
    mangled = re.sub(r"^x[_ǁ]", "", mangled)
    return f"{module}.{mangled.replace('ǁ', '.').lstrip('.')}"


def module_of(name: str) -> str:
    """``distlab.capture.collect.x_compact__mutmut_3`` -> ``distlab.capture.collect``."""
    return name.rpartition(".")[0]


def equivalence(name: str) -> str | None:
    """The reason a surviving mutant is accepted, or None when it is a gap in the tests."""
    where = function_of(name)
    lines = None
    for function, text, reason in EQUIVALENT:
        if function != where:
            continue
        lines = mutated_lines(name) if lines is None else lines
        if any(text in line for line in lines):
            return reason
    return None


def score_of(found: dict[str, str], accepted: dict[str, str]) -> tuple[int, int]:
    """(killed, counted): equivalent mutants count as neither."""
    killed = sum(s in KILLED for s in found.values())
    return killed, len(found) - sum(n in found for n in accepted)


def report(found: dict[str, str], sampled_out: int = 0) -> float:
    survivors = sorted(n for n, s in found.items() if s not in KILLED)
    accepted = {n: r for n in survivors if (r := equivalence(n)) is not None}
    killed, counted = score_of(found, accepted)
    print(f"\nmutants: {len(found)}, killed: {killed}, equivalent (accepted): {len(accepted)}, "
          f"not killed: {len(survivors) - len(accepted)}" + (f", sampled out: {sampled_out}" if sampled_out else ""))
    for name in survivors:
        if name not in accepted:
            print(f"  {found[name]:10} {name}: {' | '.join(mutated_lines(name))}")
    print("accepted as equivalent:")
    for name, reason in accepted.items():
        print(f"  {name}: {reason}")
    print("per module (killed / counted):")
    for module in sorted({module_of(n) for n in found}):
        mine = {n: s for n, s in found.items() if module_of(n) == module}
        k, c = score_of(mine, {n: r for n, r in accepted.items() if n in mine})
        print(f"  {module:36} {k:5} / {c:<5} {k / c if c else 1.0:.3f}")
    score = killed / counted if counted else 1.0
    print(f"goal: {GOAL}")
    print(f"score: {score:.3f}")
    return score


def mutmut_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]


def configured_modules() -> list[str]:
    return [m for m in mutmut_config()["only_mutate"] if (ROOT / m).exists()]


def dotted(path: str) -> str:
    """``src/distlab/nodes/plan.py`` -> ``distlab.nodes.plan``."""
    return path.removeprefix("src/").removesuffix(".py").replace("/", ".")


def changed_modules(base: str | None) -> list[str]:
    """The configured modules that differ between ``base`` (default: HEAD's first parent) and the
    working tree: what the change touched."""
    base = base or "HEAD^1"
    done = subprocess.run(["git", "diff", "--name-only", base, "--"], cwd=ROOT, text=True, capture_output=True)
    if done.returncode != 0:
        sys.exit(f"mutation.py: git cannot say what changed since {base}: {done.stderr.strip()}\n"
                 "(a clone with its history is needed; or name a starting point with --base)")
    touched = set(done.stdout.split())
    return [m for m in configured_modules() if m in touched]


# Fast test files that use a mutated module but stay out of the selection, and why.
NOT_SELECTED = {
    "tests/test_shared_machine.py": "creates a second Unix user and runs commands as it (root only, seconds each)",
    "tests/test_chapter_claims.py": "reads the chapters: book/ is not copied into mutants/",
    "tests/test_recordings.py": "reads the chapters and book/record.py: book/ is not copied into mutants/",
    "tests/test_recordings_fresh.py": "its fast tests use book/record.py: book/ is not copied into mutants/",
}


def uses_pattern(modules: list[str]) -> re.Pattern:
    """What a test file that uses one of ``modules`` (paths under src/) says: the module's dotted name,
    or ``from <its package> import ... <its name>`` (parenthesised over several lines too)."""
    alternatives = []
    for module in modules:
        package, _, name = dotted(module).rpartition(".")
        alternatives += [rf"\b{re.escape(dotted(module))}\b",
                         rf"from {re.escape(package)} import (?:\([^)]*|[^\n]*)\b{name}\b"]
    return re.compile("|".join(alternatives))


def unselected_tests() -> list[str]:
    """Fast test files that import a mutated module but are not in the selection (a gap in the score).
    The chapters' helper tests (test_teach_*) only borrow RunResult to fake a run."""
    selected = set(mutmut_config()["pytest_add_cli_args_test_selection"]) | set(NOT_SELECTED)
    uses = uses_pattern(configured_modules())
    return [f"tests/{p.name}" for p in sorted((ROOT / "tests").glob("test_*.py")) if not p.name.startswith("test_teach")
            if f"tests/{p.name}" not in selected and uses.search(p.read_text())
            and not re.search(r"^pytestmark = \[?pytest\.mark\.slow\b", p.read_text(), re.M)]


def run_modules(modules: list[str], max_children: int, budget: float | None, every: bool = False) -> None:
    """One ``mutmut run`` over ``modules`` (dotted names), stopped after ``budget`` seconds if given.
    ``every``: all configured modules, named by none (mutmut then skips mutants it has a result for).

    One run, not one per module: each run lists every selected test, runs the tests once without a
    mutant and checks a forced failure is seen, so per module that cost a minute of the full form."""
    names = [] if every else [f"{module}.*" for module in modules]
    print(f"mutation.py: {'every configured module' if every else ', '.join(modules)}", flush=True)
    mutmut("run", "--max-children", str(max_children), *names, timeout=budget)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="reuse mutants/ from the last run")
    parser.add_argument("--report-only", action="store_true", help="only score the last run")
    parser.add_argument("--module", action="append", default=[], help="only this module (e.g. nodes.plan)")
    parser.add_argument("--changed", action="store_true", help="CI's form: the modules the change touched")
    parser.add_argument("--base", help="with --changed: where the change starts (default HEAD^1)")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="with --changed: seconds (default 300)")
    parser.add_argument("--max-children", type=int, default=2, help="mutants tested at once (default 2)")
    options = parser.parse_args()
    for path in unselected_tests():
        print(f"mutation.py: {path} tests a mutated module but is not selected in [tool.mutmut]")
    every = [dotted(m) for m in configured_modules()]
    modules = every
    if options.module:
        modules = [m if m.startswith("distlab.") else f"distlab.{m}" for m in options.module]
        unknown = sorted(set(modules) - set(every))
        if unknown:
            sys.exit(f"mutation.py: not in [tool.mutmut] only_mutate: {', '.join(unknown)}")
    if options.changed:
        modules = [dotted(m) for m in changed_modules(options.base)]
        print(f"mutation.py: the change touched {', '.join(modules) or 'no mutated module'}")
        if not modules:
            return
    if not options.report_only:
        if not (options.keep or options.module or options.changed):
            shutil.rmtree(ROOT / "mutants", ignore_errors=True)
        every = not (options.module or options.changed)
        run_modules(modules, options.max_children, options.budget if options.changed else None, every)
    found = {n: s for n, s in statuses().items() if module_of(n) in modules}
    sampled_out = 0
    if options.changed:  # mutants the budget did not reach: a smaller sample, not survivors
        sampled_out = sum(s == "not checked" for s in found.values())
        found = {n: s for n, s in found.items() if s != "not checked"}
    score = report(found, sampled_out)
    if options.changed:
        sys.exit(0 if score == 1.0 else 1)
    sys.exit(0 if score >= GOAL else 1)


if __name__ == "__main__":
    main()
