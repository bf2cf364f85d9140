"""What a run brings back, read from a run folder laid out as the engine writes it. No processes.

Folders 0700 and files 0600, as a real run makes them (distlab refuses to unpickle anything else).
"""
import json
import os
from pathlib import Path

import torch

from distlab.results import RunResult, collect, read_logs, read_metrics, read_returns


def _write(path: Path, text: str = "", data=None) -> Path:
    for parent in reversed(path.parents):
        if not parent.exists():
            parent.mkdir(mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        if data is None:
            f.write(text.encode())
        else:
            torch.save(data, f)
    return path


def _run_folder(tmp_path) -> Path:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    for sub in ("logs", "returns", "metrics"):
        (run / sub).mkdir(mode=0o700)
    return run


def test_one_attempt_reads_output_then_errors_without_a_header(tmp_path):
    run = _run_folder(tmp_path)
    _write(run / "logs" / "attempt0" / "rank1.out", "hello\n")
    _write(run / "logs" / "attempt0" / "rank1.err", "warning\n")
    assert read_logs(run, 1) == "hello\nwarning\n"
    assert read_logs(run, 0) == ""


def test_restarted_run_heads_each_attempt_in_numeric_order(tmp_path):
    run = _run_folder(tmp_path)
    for k in (10, 2, 1):
        _write(run / "logs" / f"attempt{k}" / "rank0.out", f"out {k}\n")
    _write(run / "logs" / "attempt2" / "rank0.err", "err 2\n")
    assert read_logs(run, 0) == ("--- attempt 1 ---\nout 1\n--- attempt 2 ---\nout 2\nerr 2\n"
                                 "--- attempt 10 ---\nout 10\n")


def test_metrics_are_rows_in_order_and_blank_lines_are_skipped(tmp_path):
    run = _run_folder(tmp_path)
    rows = [{"rank": 0, "loss": 2.0, "step": 1}, {"rank": 0, "note": "x"}, {"rank": 0, "loss": 1.5, "step": 2}]
    _write(run / "metrics" / "rank0.jsonl", json.dumps(rows[0]) + "\n\n" + "\n".join(map(json.dumps, rows[1:])))
    assert read_metrics(run, 0) == rows
    assert read_metrics(run, 1) == []


def test_returns_are_loaded_and_missing_ones_are_none(tmp_path):
    run = _run_folder(tmp_path)
    _write(run / "returns" / "rank1.pt", data={"loss": torch.tensor(0.5)})
    got = read_returns(run, 3)
    assert list(got) == [0, 1, 2] and got[0] is None and got[2] is None
    assert torch.equal(got[1]["loss"], torch.tensor(0.5))


def test_collect_includes_ranks_a_script_started_itself(tmp_path):
    run = _run_folder(tmp_path)
    _write(run / "logs" / "attempt0" / "rank0.out", "only rank\n")
    _write(run / "metrics" / "rank0.jsonl", json.dumps({"rank": 0, "loss": 1.0}) + "\n")
    _write(run / "metrics" / "rank3.jsonl", json.dumps({"rank": 3, "loss": 4.0}) + "\n")
    _write(run / "returns" / "rank0.pt", data=7)
    result = collect(run, run / "job.py", 1, 2.5)
    assert result.returns == {0: 7} and result.logs == {0: "only rank\n"} and result.wall_s == 2.5
    assert list(result.metrics) == [0, 3] and result.series("loss", 3) == [4.0]
    assert result.world_size == 1 and result.script == run / "job.py" and result.run_dir == run
    assert collect(run, None, 1, 2.5, returns=False).returns == {}


def test_series_skips_rows_without_the_key_and_unknown_ranks():
    result = RunResult(run_dir=Path("r"), script=None, world_size=2,
                       metrics={0: [{"loss": 3}, {"acc": 1}, {"loss": 2}], 1: []})
    assert result.series("loss") == [3, 2]
    assert result.series("loss", rank=1) == [] and result.series("loss", rank=5) == []


def test_repr_is_short_and_names_the_run_folder():
    result = RunResult(run_dir=Path("/runs/x"), script=None, world_size=2, returns={0: 1, 1: None},
                       logs={0: "long\n" * 100}, wall_s=1.234)
    assert repr(result) == "RunResult(world_size=2, wall_s=1.23, returns={0: 1, 1: None}, run_dir='/runs/x')"


def test_two_attempts_are_headed_too(tmp_path):
    run = _run_folder(tmp_path)
    _write(run / "logs" / "attempt0" / "rank0.out", "first\n")
    _write(run / "logs" / "attempt1" / "rank0.out", "second\n")
    assert read_logs(run, 0) == "--- attempt 0 ---\nfirst\n--- attempt 1 ---\nsecond\n"


def test_a_log_with_bytes_that_are_not_utf8_is_still_read(tmp_path):
    run = _run_folder(tmp_path)
    path = _write(run / "logs" / "attempt0" / "rank0.out")
    path.write_bytes(b"loss \xff\xfe 0.5\n")
    assert read_logs(run, 0) == "loss \ufffd\ufffd 0.5\n"


def test_any_picklable_return_value_comes_back(tmp_path):
    from fractions import Fraction  # not in torch's weights_only allow-list: returns are not only tensors

    run = _run_folder(tmp_path)
    _write(run / "returns" / "rank0.pt", data={"ratio": Fraction(1, 3)})
    assert read_returns(run, 1) == {0: {"ratio": Fraction(1, 3)}}


def test_a_progress_bars_carriage_returns_are_kept_as_written(tmp_path):
    """newline="": a bar redrawn with '\\r' stays one line, and '\\r\\n' is not turned into '\\n'."""
    run = _run_folder(tmp_path)
    _write(run / "logs" / "attempt0" / "rank0.out", "10%\r50%\r100%\ndone\r\n")
    assert read_logs(run, 0) == "10%\r50%\r100%\ndone\r\n"
