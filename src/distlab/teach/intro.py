"""Helpers for the introduction."""
import contextlib
import os
import tempfile


@contextlib.contextmanager
def child_stderr():
    """Collect what child processes write to stderr (file descriptor 2) into ``lines``.

    ``mp.spawn``'s children report their unpickling error on fd 2, which a notebook frontend
    may or may not show; collecting it makes the error something a cell can print and assert.
    """
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+") as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().splitlines())
