"""Render a :class:`~distlab.capture.collect.Captured` as a worker script a person can read and run."""
from __future__ import annotations

from distlab.capture.collect import Captured, is_literal

HEADER = '''"""Worker script written by distlab for `{entry}` ({nprocs} ranks, {style} style).

Run it yourself, outside the notebook:
    {python}  # starts {nprocs} ranks with torch.multiprocessing.spawn
    {torchrun}  # torchrun starts the {nprocs} ranks
"""
'''


def header(entry: str, nprocs: int, style: str, filename: str) -> str:
    """The docstring that says how to run the script by hand (both commands, comments aligned)."""
    torchrun = f"torchrun --standalone --nproc-per-node {nprocs} {filename}"  # the longer of the two
    return HEADER.format(entry=entry, nprocs=nprocs, style=style, python=f"python {filename}".ljust(len(torchrun)),
                         torchrun=torchrun)


def render(cap: Captured, *, args: tuple, nprocs: int, style: str, backend: str, filename: str) -> str:
    """The script text. ``args`` appear inline when they are literals, else load from args.pt."""
    parts = [header(cap.entry, nprocs, style, filename)]
    if cap.future_annotations:  # as in the notebook: annotations stay unevaluated (they may name later classes)
        parts.append("from __future__ import annotations")
    parts.append("import distlab.worker as _distlab  # distlab's worker runtime: main(), load_data()")
    parts.extend(sorted(cap.imports, key=lambda line: (line.startswith("from"), line)))
    if cap.constants:
        parts.append("\n# Constants from the notebook")
        parts.extend(cap.constants)
    for source in cap.definitions:
        parts.append("\n\n" + source.rstrip())
    if cap.values:
        parts.append("\n\n# Values from the notebook that are not source code: saved next to this script")
        parts.append('globals().update(_distlab.load_data(__file__, "values"))')
    if cap.bind:
        parts.append("\n\n# fn was a functools.partial: the same one, rebuilt")
        parts.append(cap.bind)
    arg_source = '_distlab.load_data(__file__, "args")' if needs_args_file(args) else repr(args)
    parts.append(
        "\n\nif __name__ == \"__main__\":\n"
        f"    _distlab.main({cap.call or cap.entry}, args={arg_source}, nprocs={nprocs}, style={style!r}, "
        f"backend={backend!r})\n"
    )
    return "\n".join(parts)


def needs_args_file(args: tuple) -> bool:
    return not is_literal(args)
