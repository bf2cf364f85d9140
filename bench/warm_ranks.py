"""Warm ranks: start time, `Ranks.exec` round trip and a `%%ranks` cell, on 2 gloo ranks.

    start     distlab.Ranks(2) until both ranks joined the process group
    exec      ranks.exec("t = torch.ones(1); dist.all_reduce(t); t.item()")      (median of --repeats)
    data      the same all-reduce with data travelling: ranks.push(x=<256 floats>), then
              ranks.exec("dist.all_reduce(x)"), then ranks.pull("x") (three round trips)
    floor     the same source sent over a multiprocessing pipe to two bare spawned gloo processes
              that exec it and send the value back: the least any design can cost here
    cell      a `%%ranks` cell with that source, timed from the client as nbclient sees it
              (execute_request until the kernel is idle again) through a real kernel
    plain     a plain `1 + 1` cell through the same kernel (what any cell costs)

Goals (DESIGN.md): exec <= 2 ms, cell <= 10 ms. nbdistributed 0.1.0 measured 131 ms per cell here.
ipyparallel 9.2's `execute` + `pull` of a trivial all-reduce on two engines measured 19.6 ms here
(2026-12-01, a past measurement: ipyparallel is not installed); the `data` row is compared with it.
Last line: `ratio: X` = exec / 131 ms. Usage: python bench/warm_ranks.py [--repeats 50] [--no-kernel]
"""
import argparse
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing import Pipe
from pathlib import Path

import distlab

SOURCE = "t = torch.ones(1); dist.all_reduce(t); t.item()"
NBDISTRIBUTED_CELL_S = 0.131
IPYPARALLEL_EXECUTE_PULL_S = 0.0196  # past measurement, see the docstring

FLOOR_WORKER = """
import os, pickle, sys
from multiprocessing.connection import Connection
import torch, torch.distributed as dist
rank, world, fd, store = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
conn, ns = Connection(fd), {"torch": torch, "dist": dist}
while True:
    source = conn.recv_bytes().decode()
    if not source:
        break
    exec(source.replace("t.item()", "value = t.item()"), ns)
    conn.send_bytes(pickle.dumps(ns["value"]))
dist.destroy_process_group()
"""


def timed(fn, repeats: int, warm_up: int = 5) -> list[float]:
    for _ in range(warm_up):
        fn()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def measure_floor(repeats: int, folder: Path) -> list[float]:
    script = folder / "floor.py"
    script.write_text(FLOOR_WORKER)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    conns, procs = [], []
    for rank in range(2):
        ours, theirs = Pipe()
        procs.append(subprocess.Popen([sys.executable, str(script), str(rank), "2", str(theirs.fileno()),
                                       str(folder / "store")], pass_fds=[theirs.fileno()], env=env))
        theirs.close()
        conns.append(ours)

    def round_trip():
        for c in conns:
            c.send_bytes(SOURCE.encode())
        assert [pickle.loads(c.recv_bytes()) for c in conns] == [2.0, 2.0]

    try:
        return timed(round_trip, repeats)
    finally:
        for c in conns:
            c.send_bytes(b"")
        for p in procs:
            p.wait(timeout=30)


def measure_ranks(repeats: int) -> tuple[float, list[float]]:
    start = time.perf_counter()
    with distlab.Ranks(2, backend="gloo") as ranks:
        started = time.perf_counter() - start

        def round_trip():
            assert ranks.exec(SOURCE) == {0: 2.0, 1: 2.0}

        def with_data():
            import torch

            ranks.push(x=torch.ones(256))
            ranks.exec("dist.all_reduce(x)")
            pulled = ranks.pull("x")
            assert all(float(v.sum()) == 512.0 for v in pulled.values()), pulled

        # alternated, so both see the same load
        rows = {"exec": [], "data": []}
        for _ in range(repeats):
            rows["exec"] += timed(round_trip, 1, warm_up=0 if rows["exec"] else 5)
            rows["data"] += timed(with_data, 1, warm_up=0 if rows["data"] else 5)
        return started, rows


def run_cell(kc, code: str, timeout: float = 300) -> tuple[float, str]:
    """Send one cell and wait as nbclient does: for its reply and for the kernel to be idle again."""
    start = time.perf_counter()
    msg_id = kc.execute(code)
    text = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind in ("stream", "execute_result", "error"):
            text.append(content.get("text") or content.get("data", {}).get("text/plain") or content.get("evalue", ""))
        if kind == "status" and content["execution_state"] == "idle":
            break
    while kc.get_shell_msg(timeout=timeout)["parent_header"].get("msg_id") != msg_id:
        pass
    return time.perf_counter() - start, "".join(text)


def measure_cells(repeats: int) -> dict[str, list[float]]:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=120)
    try:
        setup = "%load_ext distlab\nimport distlab\nranks = distlab.Ranks(2, backend='gloo')\nprint(ranks.state)"
        _, out = run_cell(kc, setup)
        assert "ready" in out, out
        cell = "%%ranks\n" + SOURCE
        _, out = run_cell(kc, cell)
        assert "[rank0] 2.0" in out and "[rank1] 2.0" in out, out
        times = {"cell": timed(lambda: run_cell(kc, cell), repeats),
                 "plain": timed(lambda: run_cell(kc, "1 + 1"), repeats)}
        run_cell(kc, "ranks.close()")
        return times
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--no-kernel", action="store_true", help="skip the %%ranks cell through a real kernel")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        floor = measure_floor(args.repeats, Path(folder))
    started, ranks_rows = measure_ranks(args.repeats)
    exec_times = ranks_rows["exec"]
    rows = {"floor": floor, **ranks_rows}
    if not args.no_kernel:
        rows.update(measure_cells(args.repeats))
    print(f"start: {started:.2f} s (distlab.Ranks(2), both ranks in the group)")
    print(f"{'what':<8}{'median ms':>11}{'min ms':>9}{'runs':>6}{'vs floor':>10}")
    base = statistics.median(floor)
    for name, values in rows.items():
        med = statistics.median(values)
        print(f"{name:<8}{med * 1e3:>11.2f}{min(values) * 1e3:>9.2f}{len(values):>6}{med / base:>10.1f}")
    data = statistics.median(rows["data"])
    print(f"push + exec + pull: {data * 1e3:.2f} ms = {data / statistics.median(exec_times):.1f}x exec; "
          f"{data / IPYPARALLEL_EXECUTE_PULL_S:.3f}x ipyparallel's execute + pull (19.6 ms, past measurement)")
    if "cell" in rows:
        extra = statistics.median(rows["cell"]) - statistics.median(rows["plain"])
        print(f"%%ranks over a plain cell: {extra * 1e3:.2f} ms (what the magic and the ranks add to any cell)")
    print(f"ratio: {statistics.median(exec_times) / NBDISTRIBUTED_CELL_S:.4f}")


if __name__ == "__main__":
    main()
