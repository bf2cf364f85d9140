"""A rank's progress bar end to end: two real ranks (gloo, CPU) redraw a tqdm-like bar on stderr; the
live view shows it moving, one line per rank, and the text view and the saved record keep one line
per bar, its final state."""
import io
import time

import pytest
from fake_kernel import run_cells
from test_record import FakeShower

import distlab
from distlab.view.display import LiveView, TextView
from distlab.view.streams import rendered_lines

pytestmark = pytest.mark.slow

CELLS = run_cells(
    """
    import sys
    import time
    """,
    """
    def with_a_bar(rank, steps):
        print(f"rank {rank} before the bar", flush=True)
        for i in range(steps + 1):
            sys.stderr.write(f"\\rrank {rank} {i}/{steps} |" + "#" * i + " " * (steps - i) + "|")
            sys.stderr.flush()
            time.sleep(0.2)
        sys.stderr.write("\\n")
        print(f"rank {rank} after the bar", flush=True)
        return rank
    """,
)


class Both:
    """The live view (its record is what a saved notebook keeps) and the text view, fed the same
    calls by the engine, each call noted with its time."""

    def __init__(self):
        self.shower, self.text = FakeShower(), io.StringIO()
        self.live, self.plain = LiveView(2, shower=self.shower), TextView(2, stream=self.text)
        self.calls = []

    def __getattr__(self, name):
        def call(*args):
            self.calls.append((time.monotonic(), name, *args))
            for view in (self.live, self.plain):
                if hasattr(view, name):
                    getattr(view, name)(*args)
        return call


def test_a_rank_progress_bar_moves_live_and_stays_as_one_line():
    view = Both()
    res = distlab.spawn(CELLS["with_a_bar"], args=(5,), nprocs=2, view=view)
    assert res.returns == {0: 0, 1: 1}
    for rank in (0, 1):
        final = f"rank {rank} 5/5 |#####|"
        bar = [c for c in view.calls if c[1] == "progress" and c[2] == rank]
        assert len([c for c in bar if not c[4]]) >= 2, bar  # it moved while the rank ran
        assert bar[-1][3:] == (final, True), bar
        after = next(c for c in view.calls if c[1] == "line" and c[2:] == (rank, f"rank {rank} after the bar"))
        assert bar[0][0] < after[0] - 0.5  # shown live, not when its line ended
        text = view.text.getvalue()
        assert f"[rank{rank}] {final}\n[rank{rank}] rank {rank} after the bar\n" in text, text
        assert text.count(f"[rank{rank}] rank {rank} ") == 3 and "\r" not in text
    bundle, _ = view.shower.replaced[-1]  # the record that replaced the live view
    for shown in bundle["text/plain"], bundle["text/html"]:
        assert "\r" not in shown and "0/5" not in shown and "rank 1 5/5 |#####|" in shown
    assert "rank 1 · done in" in bundle["text/plain"] and "--- rank 1 · done in" in bundle["text/plain"]
    assert "\r" in res.logs[1]  # everything the rank printed, as printed
    assert rendered_lines(res.logs[1]) == ["rank 1 before the bar", "rank 1 5/5 |#####|", "rank 1 after the bar"]
