"""Another local user on the ports a learner's own code chooses (issue 33), with a real second
account (see ``second_user.py``). Each test here failed against distlab before the fix.
"""
import os
import socket
import subprocess
import textwrap
import time

import pytest
from fake_kernel import run_cells
from second_user import OTHER, other_python, start_as_other, stop_other, write_readable

import distlab
from distlab import worker
from distlab.errors import RendezvousError
from distlab.rendezvous import loopback as rendezvous

CELLS = run_cells(
    """
    import time
    import torch.distributed as dist
    """,
    """
    def own_port(rank, port):
        import os
        if rank == 0:
            time.sleep(1)  # rank 1 looks at the port first
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "localhost", str(port)
        dist.init_process_group("gloo", rank=rank, world_size=2)
        dist.barrier()
        dist.destroy_process_group()
        return rank
    """,
    """
    def hosts(rank, port):
        import os
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "localhost", str(port)
        dist.init_process_group("gloo", rank=0, world_size=1)
        dist.destroy_process_group()
        return "hosted"
    """,
)

LISTENER = """
import socket, sys, time
s = socket.socket()
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen()
s.settimeout(0.2)
print("READY", flush=True)
end, held = time.time() + float(sys.argv[3]), []
while time.time() < end:
    try:
        held.append(s.accept()[0])  # kept open, to read what arrives
        print("CONNECTED", flush=True)
    except OSError:
        pass
"""


@pytest.fixture
def listener(readable_src):
    """Start a listener of the other user on ``address:port``; stopped after the test."""
    program = write_readable(readable_src, "listener.py", textwrap.dedent(LISTENER))
    started = []

    def start(address: str, port: int, seconds: float = 60) -> subprocess.Popen:
        proc = start_as_other(f"{other_python()} {program} {address} {port} {seconds}")
        started.append(proc)
        line = proc.stdout.readline()
        assert line.startswith("READY"), proc.stderr.read()
        return proc

    yield start
    for proc in started:
        stop_other(proc)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_listener_on_another_loopback_address_does_not_stop_a_run(other_user, shared_tmp, listener):
    """Before: rank 1 saw the other user's listener on 127.0.0.2:P and refused 127.0.0.1:P."""
    port = free_port()
    listener("127.0.0.2", port)
    res = distlab.spawn(CELLS["own_port"], args=(port,), nprocs=2, view=None, timeout=60)
    assert res.returns == {0: 0, 1: 1}


def test_a_squatter_the_table_did_not_show_is_refused_after_connecting(other_user, listener, monkeypatch):
    """The look at the listeners says "yours" (a moment ago it was); the process that accepts the
    connection is the other user's: refused, naming them."""
    port = free_port()
    listener("127.0.0.1", port)
    monkeypatch.setattr(rendezvous, "listener_uid", lambda port: os.geteuid())
    with pytest.raises(RendezvousError, match=rf"rank 1 will not join the store on 127.0.0.1:{port}: another user "
                                              rf"\(uid {other_user.pw_uid}\)"):
        worker._check_listener_is_ours(port, 1)


def test_your_own_listener_passes_both_checks():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        start = time.monotonic()
        worker._check_listener_is_ours(port, 1)
        assert time.monotonic() - start < 5


@pytest.mark.slow
def test_a_fixed_port_another_user_holds_is_named_with_its_holder_and_what_to_do(other_user, shared_tmp, listener):
    """Before: rank 0 failed with a bare ``OSError: [Errno 98] Address already in use`` from distlab's
    own ``bind_loopback``: no port, no holder, no way out."""
    from distlab.errors import PORT_IN_USE

    port = free_port()
    listener("0.0.0.0", port)  # every interface: a bind to 127.0.0.1 collides
    with pytest.raises(distlab.WorkerFailedError) as failed:
        distlab.spawn(CELLS["hosts"], args=(port,), nprocs=1, view=None, timeout=60)
    said = failed.value.remote_traceback.strip().splitlines()[-1]
    assert said == "distlab.errors.PortInUseError: " + PORT_IN_USE.format(
        rank=0, port=port, holder=f"held by another user, {OTHER} (uid {other_user.pw_uid})")


@pytest.mark.slow
def test_a_fixed_port_a_process_of_yours_holds_names_that_process():
    with socket.socket(socket.AF_INET6) as held:  # `::`, as torch's own TCPStore listens
        held.bind(("::", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(distlab.WorkerFailedError) as failed:
            distlab.spawn(CELLS["hosts"], args=(port,), nprocs=1, view=None, timeout=60)
    said = failed.value.remote_traceback.strip().splitlines()[-1]
    assert f"127.0.0.1:{port}, the MASTER_PORT your code set: the port is already in use (EADDRINUSE), held by a " \
           f"process of yours: pid {os.getpid()} (" in said, said
