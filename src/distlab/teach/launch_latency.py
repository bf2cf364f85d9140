"""Launch latency: a trivial 2-rank gloo job (init, one all_reduce, destroy) started from a process
that has already imported torch, as a kernel has.

    distlab               distlab.spawn(job, nprocs=2): ranks forked from distlab's forkserver (warm)
    distlab first         the first such launch in this process: it also starts the forkserver
    distlab start=spawn   distlab.spawn(..., start="spawn"): fresh interpreters, as torchrun starts them
    mp forkserver         the same job in two processes of multiprocessing's own forkserver, preloaded
                          with torch (no torchelastic, no script, no logs; its heap is not in huge pages)
    bare                  two subprocess.Popen workers running the same job from a script file
    mp.spawn script       `python job_mp.py` (whole process: interpreter + torch import + mp.spawn)
    torchrun              `torchrun --nproc-per-node 2 job_env.py` (whole process)
    accelerate            accelerate's notebook_launcher (forks this process), only when installed

distlab and bare alternate, and medians are reported. Last line: `ratio: X` = distlab / bare.
Usage: python bench/launch_latency.py [--repeats 7] [--no-scripts] [--quick]
(--quick: one run each of distlab, bare, mp.spawn script and torchrun, as chapter 10 shows them.)

The benchmark lives in the package, not only in the repository's bench/, because chapter 10 runs it
(``python -m distlab.teach.launch_latency --quick``) where a chapter opened alone has no bench/ beside it;
``bench/launch_latency.py`` runs this module.
"""
import argparse
import importlib.util
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch  # noqa: F401  (imported first, like a kernel that has used torch already)
import torch.distributed as dist

import distlab

JOB_ENV = """import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
assert t[0].item() == dist.get_world_size()
dist.destroy_process_group()
"""
JOB_MP = """import os, socket, torch, torch.distributed as dist, torch.multiprocessing as mp
def job(rank, world):
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.destroy_process_group()
if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); os.environ["MASTER_PORT"] = str(s.getsockname()[1]); s.close()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    mp.spawn(job, args=(2,), nprocs=2)
"""


def job(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t[0].item() == world_size
    dist.destroy_process_group()


def job_on_port(rank, world_size, port):
    """The job for multiprocessing's forkserver: rank 0 hosts the store, as under mp.spawn."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    job(rank, world_size)


def job_from_env():
    """The same job for launchers that set RANK/WORLD_SIZE/MASTER_* (accelerate's)."""
    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def time_bare(script: Path, world: int = 2) -> float:
    start = time.perf_counter()
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(script)],
                              env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1"})
             for r in range(world)]
    assert all(p.wait() == 0 for p in procs), "a bare worker failed"
    return time.perf_counter() - start


def time_distlab(start_method: str = "forkserver") -> float:
    start = time.perf_counter()
    distlab.spawn(job, args=(2,), nprocs=2, view=None, start=start_method)
    return time.perf_counter() - start


def time_mp_forkserver() -> float:
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    start = time.perf_counter()
    port = free_port()
    procs = [ctx.Process(target=job_on_port, args=(r, 2, port)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert all(p.exitcode == 0 for p in procs), "a multiprocessing forkserver worker failed"
    return time.perf_counter() - start


def time_command(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return time.perf_counter() - start


def time_accelerate() -> float:
    from accelerate import notebook_launcher

    start = time.perf_counter()
    notebook_launcher(job_from_env, num_processes=2, use_port=str(free_port()))
    return time.perf_counter() - start


def measure(repeats: int, scripts: bool, folder: Path, quick: bool = False) -> dict[str, list[float]]:
    env_script, mp_script = folder / "job_env.py", folder / "job_mp.py"
    env_script.write_text(JOB_ENV)
    mp_script.write_text(JOB_MP)
    first = time_distlab()  # starts distlab's forkserver
    times: dict[str, list[float]] = {"distlab": [], "bare": []}
    if not quick:
        times["distlab first"] = [first]
        time_bare(env_script)  # file caches, first-run costs
    for i in range(repeats):
        order = [("distlab", time_distlab), ("bare", lambda: time_bare(env_script))]
        for name, fn in order if i % 2 == 0 else order[::-1]:
            times[name].append(fn())
    few = max(1, repeats // 3)
    if not quick:
        times["distlab start=spawn"] = [time_distlab("spawn") for _ in range(few)]
        time_mp_forkserver()  # starts multiprocessing's forkserver
        times["mp forkserver"] = [time_mp_forkserver() for _ in range(repeats)]
    if scripts:
        torchrun = str(Path(sys.executable).with_name("torchrun"))
        times["mp.spawn script"] = [time_command([sys.executable, str(mp_script)]) for _ in range(few)]
        times["torchrun"] = [time_command([torchrun, "--nproc-per-node", "2", str(env_script)]) for _ in range(few)]
    if not quick and importlib.util.find_spec("accelerate") is not None:
        times["accelerate"] = [time_accelerate() for _ in range(few)]
    return times


def main() -> None:
    import multiprocessing

    # multiprocessing's forkserver children re-import the main module as __mp_main__: preload its imports
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "distlab"])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-scripts", action="store_true", help="skip the mp.spawn and torchrun whole-process runs")
    parser.add_argument("--quick", action="store_true", help="one run of each launcher, no warm-up (for the book)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        times = measure(1 if args.quick else args.repeats, not args.no_scripts, Path(folder), quick=args.quick)
    bare = statistics.median(times["bare"])
    print(f"{'launcher':<22}{'median s':>10}{'min s':>8}{'runs':>6}{'vs bare':>9}")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:<22}{med:>10.3f}{min(values):>8.3f}{len(values):>6}{med / bare:>9.3f}")
    print(f"ratio: {statistics.median(times['distlab']) / bare:.3f}")


if __name__ == "__main__":
    main()
