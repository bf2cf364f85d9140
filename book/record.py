"""Record what each ``%%needs`` cell prints, for the platforms that cannot run it (distlab.needs).

    .venv/bin/python book/record.py book/07_two_gpu_training.ipynb ...      execute each chapter, then record
    .venv/bin/python book/record.py --executed run.ipynb --as 07_two_gpu_training.ipynb   record a run you have

Run it as root on Linux with Slurm's packages installed, where every section runs for real: a cell
that did not run (its output says so), an error, or a traceback in a cell not tagged
``prints-traceback`` stops it. Writes ``src/distlab/needs/recorded/<chapter>.json``; long outputs
keep their first and last lines, and paths of this machine are replaced by placeholders.
``tests/test_recordings.py`` fails when a ``%%needs`` cell's code no longer matches its recording, and
``tests/test_recordings_fresh.py`` where the suite ran the cell and what it prints no longer has its recording's
:func:`shape`.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

import nbformat

from distlab.needs import recorded
from distlab.needs.verdict import START

BOOK = Path(__file__).resolve().parent
REPO = BOOK.parent
KEEP = ("image/png", "text/plain", "text/html")
HEAD, TAIL = 80, 30          # lines kept of a long output (the middle of a long log goes)
HTML_LIMIT = 20_000          # characters of text/html kept (a live rank view's last state is small)
# a knob lab's note (distlab.teach.knobs) promises controls; a recording shows none, wherever it is read
KNOB_NOTE = (re.compile(r"; in JupyterLab, controls change these$", re.M),
             "; recorded at these settings: the controls appear where the cell runs")


def setting() -> str:
    """The machine a recording comes from, in words."""
    import torch

    who = "as root" if os.geteuid() == 0 else "as an ordinary user"
    gpus = f", {torch.cuda.device_count()} CUDA GPUs" if torch.cuda.is_available() else ""
    return f"{platform.system()} {who}, {os.cpu_count()} CPU cores{gpus}, torch {torch.__version__}"


def scrub(text: str) -> str:
    """This machine's paths out: the repository, the Python environment, the home folder; and what only a live
    run can keep (a knob lab's promise of controls)."""
    import torch

    text = KNOB_NOTE[0].sub(KNOB_NOTE[1], text)
    for path, placeholder in ((Path(torch.__file__).parents[1], "<site-packages>"), (REPO, "<book>"),
                              (Path(sys.prefix), "<python>"), (Path.home(), "~")):
        text = text.replace(str(path), placeholder)
    return text


def shorten(text: str) -> str:
    lines = text.splitlines(True)
    if len(lines) <= HEAD + TAIL + 5:
        return text
    left = len(lines) - HEAD - TAIL
    return "".join(lines[:HEAD]) + f"... ({left} lines left out of the recording) ...\n" + "".join(lines[-TAIL:])


def coalesced(outputs: list) -> list:
    """Consecutive stream outputs of one stream joined (a live view writes many), so shortening sees them whole."""
    joined = []
    for out in outputs:
        if joined and out["output_type"] == "stream" == joined[-1]["output_type"] and out["name"] == joined[-1]["name"]:
            joined[-1] = {**joined[-1], "text": joined[-1]["text"] + out["text"]}
        else:
            joined.append(dict(out))
    return joined


def kept_output(out: dict) -> dict | None:
    """One output as recorded: streams shortened, displays reduced to text, HTML and PNG."""
    kind = out["output_type"]
    if kind == "stream":
        return {"output_type": "stream", "name": out["name"], "text": shorten(scrub(out["text"]))}
    data = {m: v for m, v in out.get("data", {}).items() if m in KEEP}
    if "text/html" in data and len(data["text/html"]) > HTML_LIMIT:
        del data["text/html"]
    data = {m: scrub(v) if m != "image/png" else v for m, v in data.items()}
    if not data:
        return None
    return {"output_type": "display_data", "data": data, "metadata": dict(out.get("metadata") or {})}


def kept_outputs(outputs: list) -> list:
    """A cell's outputs as a recording keeps them (joined, this machine's paths out, long ones shortened): what
    :func:`recording` writes, and what a fresh run is compared with its recording as."""
    return [kept for out in coalesced(outputs) if (kept := kept_output(out)) is not None]


# what varies from run to run in a recorded line: numbers, and names with digits in them (run folders, hashes);
# a name has a letter or _ (else the 6 digits after 0.005087's point would be one, and 0.01832's 5 not)
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")
NAME_WITH_DIGITS = re.compile(r"\b(?=[A-Za-z0-9_]*[A-Za-z_])(?=[A-Za-z_]*\d)[A-Za-z0-9_]{6,}\b")
TEMPORARY = re.compile(r"/tmp/[^\s\"',:)]*")          # a run's folders: mkdtemp's names may have no digit


def shape(outputs: list) -> set[str]:
    """What a cell printed, less what varies between two runs: each line with its numbers, its names with
    digits and its temporary paths masked, blanks collapsed, lines without a letter dropped. A recording is
    keyed by its cell's code only; comparing its shape with a fresh run's finds the output that library code
    prints and that changed since (a message, a repr, a table's columns), which the key cannot see. Each output
    starts a line of its own (a display's text has no newline at its end: the next output's first line would be
    glued to it, and to a different line in another run), a stream's chunks run on. Pure."""
    text = "\n".join(scrub_text(o.get("text", "")) if o["output_type"] == "stream" else
                     scrub_text(o.get("data", {}).get("text/plain", "")) for o in coalesced(outputs))
    lines = (" ".join(NUMBER.sub("#", NAME_WITH_DIGITS.sub("#", TEMPORARY.sub("<tmp>", line))).split())
             for line in text.splitlines())
    return {line for line in lines if re.search(r"[A-Za-z]", line)}


def scrub_text(text: str) -> str:
    """:func:`scrub` without torch's path (a test compares shapes where torch may not be importable cheaply)."""
    return KNOB_NOTE[0].sub(KNOB_NOTE[1], text.replace(str(REPO), "<book>"))


def check_ran(cell, index: int, chapter: str) -> None:
    """A recording is of a real run: no error, no skipped section, no traceback nobody meant."""
    text = json.dumps(cell.get("outputs", []))
    problem = None
    if any(o["output_type"] == "error" for o in cell.get("outputs", [])):
        problem = "it raised"
    elif START.split(":")[0] in text:
        problem = "it was not run (this machine cannot run its section)"
    elif "Traceback (most recent call last)" in text and "prints-traceback" not in cell.metadata.get("tags", []):
        problem = "it printed a traceback"
    if problem:
        sys.exit(f"record.py: {chapter} cell {index}: {problem}; record on a machine where it runs.")


def recording(nb, chapter: str) -> dict:
    """The recording of every ``%%needs`` cell of an executed notebook."""
    cells = {}
    for index, cell in enumerate(nb.cells):
        found = recorded.split(cell.source) if cell.cell_type == "code" else None
        if found is None:
            continue
        check_ran(cell, index, chapter)
        cells[recorded.cell_key(*found)] = {"requirement": found[0], "cell": index,
                                            "outputs": kept_outputs(cell.outputs)}
    return {"chapter": chapter, "recorded": {"date": time.strftime("%Y-%m-%d", time.gmtime()),
                                             "setting": setting()}, "cells": cells}


def execute(path: Path):
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb


def write(data: dict) -> Path:
    out = recorded.FOLDER / (Path(data["chapter"]).stem + ".json")
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("chapters", nargs="*", type=Path)
    p.add_argument("--executed", type=Path, help="an executed copy of a chapter, instead of running it")
    p.add_argument("--as", dest="chapter", help="the chapter --executed is a run of (its file name)")
    args = p.parse_args(argv)
    runs = [(nbformat.read(args.executed, as_version=4), args.chapter)] if args.executed else []
    runs += [(execute(path), path.name) for path in args.chapters]
    for nb, chapter in runs:
        data = recording(nb, chapter)
        size = len(json.dumps(data))
        print(f"{write(data).relative_to(REPO)}: {len(data['cells'])} cells, {size / 1024:.0f} KiB")
        if re.search(r"/(?:work|home|root)/", json.dumps(data)):
            print("  note: a path of this machine may be left in it: check before committing")


if __name__ == "__main__":
    main()
