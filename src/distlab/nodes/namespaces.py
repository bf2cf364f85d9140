"""The processes that hold a set of nodes' namespaces, and the commands run inside them.

Nothing is named on the host: no ``ip netns`` entry, no bridge or veth in the host's network,
no mount outside the nodes' own mount namespaces. Each namespace lives exactly as long as a small
holder process (``cat``) that reads its standard input from a pipe this process holds: closing
the pipe, or this process dying even by SIGKILL, ends the holder and with it the namespace, its
interfaces and its mounts. That is how nodes leave nothing behind.

As root the namespaces are plain network (and UTS and mount) namespaces, so a node's processes are
who they are on the host (a daemon on a node can switch to another user, as ``slurmd`` must). As
an ordinary user one user namespace (``unshare --user --map-root-user``) owns them all, where the
kernel allows unprivileged user namespaces: inside it you are root of the nodes' network only,
and the switch can move links into the nodes, which all belong to it. The switch namespace holds a bridge;
each node namespace holds ``eth0``, its own host name (UTS namespace) and its own ``/etc/hosts``
(a bind mount in its mount namespace) that names every node.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from distlab.errors import NODE_COMMAND, NODES, NodesError
from distlab.nodes import held, plan

TOOLS = ("unshare", "nsenter", "ip", "tc", "mount", "hostname")
#: where Debian, Fedora and Arch keep iproute2 and util-linux's tools, which an ordinary user's PATH
#: often lacks (Debian's is /usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games)
SYSTEM_DIRS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
# The holder: say its pid, keep the namespaces until its input ends (close(), or the kernel's death,
# even by SIGKILL), then kill whatever still runs in its network namespace (a server a cell started
# there, say), which would otherwise keep the namespace alive; only then end, and the namespace with it.
# It waits with the shell's own `read`, not a child such as `cat`: killing every process on a node
# (Nodes.kill_processes) must leave the node standing.
# The scan uses the shell's builtins only (`test -ef` compares the namespaces' inodes): a `readlink` per
# process took 1.3 s for 190 processes, and a kernel's exit waits for its holders, longer than jupyter_client
# waits before it SIGTERMs the kernel (which then skips the rest of its cleanup).
HOLD = ('echo $$; while read -r _; do :; done; for p in /proc/[0-9]*; do '
        'pid=${p#/proc/}; [ "$pid" = $$ ] || [ "$pid" = $PPID ] || ! [ "$p/ns/net" -ef /proc/$$/ns/net ] '
        '|| kill -9 "$pid" 2>/dev/null; done')
SWITCH_SH = '"$1" link add {bridge} type bridge && "$1" link set {bridge} up && "$1" link set lo up && ' + HOLD
NODE_SH = ('"$3" "$1" && "$4" --bind "$2" /etc/hosts && "$5" link set lo up && ' + HOLD)
SYSCTLS = {  # the settings that refuse user namespaces, and what to do about each
    "/proc/sys/kernel/apparmor_restrict_unprivileged_userns":
        ("1", "AppArmor restricts unprivileged user namespaces (Ubuntu 23.10 and later)",
         "as root: sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or run the notebook as root"),
    "/proc/sys/kernel/unprivileged_userns_clone":
        ("0", "unprivileged user namespaces are switched off",
         "as root: sysctl -w kernel.unprivileged_userns_clone=1, or run the notebook as root"),
    "/proc/sys/user/max_user_namespaces":
        ("0", "user namespaces are switched off (max_user_namespaces is 0)",
         "as root: sysctl -w user.max_user_namespaces=10000"),
}


def with_user_namespace(euid: int | None = None) -> bool:
    """Whether the nodes need a user namespace of their own: for anyone but root."""
    return (os.geteuid() if euid is None else euid) != 0


def tool(name: str, which=shutil.which, path: str | None = None) -> str | None:
    """The absolute path of ``name``: on PATH, else in the system folders an ordinary user's PATH leaves
    out. Commands are run by absolute path, so a folder early on PATH cannot stand in for them."""
    search = os.environ.get("PATH", "") if path is None else path
    return which(name, path=os.pathsep.join([search, *SYSTEM_DIRS]))


def missing_tools(which=shutil.which, path: str | None = None) -> list[str]:
    return [name for name in TOOLS if tool(name, which, path) is None]


#: runs its arguments with the system folders appended to whatever PATH the caller gave (missing ones only),
#: as root's PATH has them: a learner types ``ip`` or ``tc`` on a node as on any machine of theirs
WITH_SYSTEM_DIRS = ("".join(f'case ":$PATH:" in *:{d}:*) ;; *) PATH="${{PATH:+$PATH:}}{d}";; esac; '
                            for d in SYSTEM_DIRS) + 'export PATH; exec "$@"')


def with_system_dirs(path: str) -> str:
    """What :data:`WITH_SYSTEM_DIRS` makes of ``path``, for a process that enters a node without a shell
    (forked from the forkserver: :mod:`distlab.forkserver.enter`)."""
    parts = [p for p in path.split(os.pathsep) if p]
    return os.pathsep.join([*parts, *(d for d in SYSTEM_DIRS if d not in parts)])


def check_possible() -> None:
    """Refuse, with the cause and the setting to change, where nodes cannot be made."""
    missing = missing_tools()
    if missing:
        hint = "Install iproute2 and util-linux (Debian: apt-get install iproute2 util-linux)."
        raise NodesError(NODES.format(problem=f"{', '.join(missing)} not found", hint=hint))
    user = ["--user", "--map-root-user"] if with_user_namespace() else []
    probe = subprocess.run([tool("unshare"), *user, "--net", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        what = "a user namespace" if user else "a network namespace"
        problem = f"this machine refuses {what} ({probe.stderr.strip()}); {refusal_cause()}"
        raise NodesError(NODES.format(problem=problem, hint="distlab never falls back to loopback and calls it nodes."))


def refusal_cause(read=lambda p: Path(p).read_text().strip()) -> str:
    """Which setting refuses user namespaces, read from /proc; what a container lacks otherwise."""
    for path, (bad, cause, fix) in SYSCTLS.items():
        try:
            if read(path) == bad:
                return f"{cause}; {fix}"
        except OSError:
            continue
    return ("no setting of the kernel forbids them, so the process lacks the privilege "
            "(a container started without CAP_SYS_ADMIN, or with a seccomp profile that blocks unshare); "
            "run it with --privileged or --cap-add SYS_ADMIN, or outside the container")


def kinds(node: bool) -> tuple[str, ...]:
    """The namespaces held for a switch or a node; the user namespace too where there is one."""
    own = held.KINDS["node" if node else "switch"]
    return (*own, "user") if with_user_namespace() else own


def enter(h: held.Held, *, uts_and_mounts: bool = False) -> list[str]:
    """The command prefix that runs a program in the namespaces ``h`` holds open (net, and for a node
    also its host name and /etc/hosts), in this process's working directory, with a node's PATH.
    Raises :class:`NodesError` if its holder died: nothing runs on a node that is gone."""
    h.check()
    which = ("net", "uts", "mnt") if uts_and_mounts else ("net",)
    argv = [tool("nsenter")]
    if with_user_namespace():
        argv += [*h.nsenter_options(("user",)), "--preserve-credentials"]
    argv += h.nsenter_options(which)
    if uts_and_mounts:
        argv += [f"--wd={os.getcwd()}"]
    return [*argv, "--", "/bin/sh", "-c", WITH_SYSTEM_DIRS, "node"]


def start_holder(name: str, argv: list[str], node: bool) -> tuple[subprocess.Popen, held.Held]:
    """Start a holder; its namespaces held open once it is ready (see :mod:`distlab.nodes.held`). In a
    session of its own: an interrupt (Jupyter's and a terminal's Ctrl-C signal the kernel's whole process
    group) must not end the nodes; the kernel's end still does (the holder's input closes)."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    line = proc.stdout.readline()
    proc.stdout.close()
    if not line.strip().isdigit():
        err = proc.stderr.read().decode(errors="replace").strip()
        stop([proc])
        raise NodesError(NODES.format(problem=f"`{' '.join(argv[:12])} ...` failed: {err or 'no output'}",
                                      hint="Run that command in a terminal to see why."))
    try:
        return proc, held.hold(name, int(line), proc.pid, kinds(node))
    except BaseException:
        stop([proc])
        raise


def start_switch() -> tuple[subprocess.Popen, held.Held]:
    sh = SWITCH_SH.replace("{bridge}", plan.SWITCH_BRIDGE)
    user = ["--user", "--map-root-user"] if with_user_namespace() else []
    return start_holder("the switch", [tool("unshare"), *user, "--net", "--kill-child", "--fork",
                                       "/bin/sh", "-c", sh, "switch", tool("ip")], node=False)


def start_node(switch: held.Held, node: int, hosts: Path) -> tuple[subprocess.Popen, held.Held]:
    """A node's holder; made inside the switch's user namespace when there is one (so that the
    switch may move the node's end of its link into it)."""
    inside = ([tool("nsenter"), *switch.nsenter_options(("user",)), "--preserve-credentials", "--"]
              if with_user_namespace() else [])
    return start_holder(f"node {node}", [*inside, tool("unshare"), "--net", "--uts", "--mount", "--kill-child",
                                         "--fork", "/bin/sh", "-c", NODE_SH, "node", plan.host(node), str(hosts),
                                         tool("hostname"), tool("mount"), tool("ip")], node=True)


def batch(h: held.Held, name: str, lines: list[str], what: str, pass_fds: tuple[int, ...] = ()) -> None:
    """Run ``name -batch -`` (ip or tc) with ``lines`` in the network namespace ``h`` holds."""
    done = subprocess.run([*enter(h), tool(name), "-batch", "-"], input="\n".join(lines) + "\n",
                          capture_output=True, text=True, pass_fds=pass_fds)
    if done.returncode != 0:
        raise NodesError(NODE_COMMAND.format(node=what, host=what, command=f"{name} -batch", code=done.returncode,
                                             output=done.stderr.strip(), hint="This is a bug in distlab's nodes."))


def link_nodes(switch: held.Held, nodes: list[held.Held]) -> None:
    """One veth pair per node: ``eth0`` in the node (moved there through its held namespace file), its
    port on the switch's bridge."""
    lines = []
    for k, node in enumerate(nodes):
        port = plan.switch_port(k)
        lines += [f"link add {port} type veth peer name {plan.NODE_IF} netns {node.inherited('net')}",
                  f"link set {port} master {plan.SWITCH_BRIDGE}", f"link set {port} up"]
    batch(switch, "ip", lines, "switch", pass_fds=tuple(node.fds["net"] for node in nodes))
    for k, node in enumerate(nodes):
        batch(node, "ip", [f"addr add {plan.address(k)}/24 dev {plan.NODE_IF}", f"link set {plan.NODE_IF} up"],
              plan.host(k))


def shape(switch: held.Held, node_h: held.Held, node: int, bits: int | None) -> None:
    """Set node ``node``'s link rate on both ends (what it sends, what it receives); None: no limit."""
    for h, dev in ((node_h, plan.NODE_IF), (switch, plan.switch_port(node))):
        cmd = plan.shape_command(dev, bits)
        done = subprocess.run([*enter(h), tool("tc"), *cmd], capture_output=True, text=True)
        if done.returncode != 0 and bits is not None:  # (removing a limit that was never set fails: fine)
            raise NodesError(NODE_COMMAND.format(node=node, host=plan.host(node), command="tc " + " ".join(cmd),
                                                 code=done.returncode, output=done.stderr.strip(),
                                                 hint="Check that the kernel has the tbf qdisc (sch_tbf)."))


def link_stats(switch: held.Held) -> str:
    return subprocess.run([*enter(switch), tool("ip"), "-j", "-s", "link", "show"], capture_output=True,
                          text=True, check=True).stdout


def kill_inside(h: held.Held, passes: int = 20, mark: str | None = None) -> list[int]:
    """SIGKILL every process in the network namespace ``h`` holds, found by the namespace's inode (never
    by a pid's link text), except its holder and the ``unshare`` that made it, which keep the node;
    with ``mark`` (``NAME=VALUE``) only the processes started with it in their environment.
    Repeats until a pass finds nothing, so a process forking while it runs does not outlive it. Refuses
    this process's own namespace (it would kill everything on the host). Their pids."""
    import signal

    net = h.inode("net")
    if net == held.own_inode("net"):
        raise NodesError(f"distlab: refusing to kill the processes of {h.name}: its network namespace is this "
                         "process's own (the host's). This is a bug in distlab's nodes.")
    keep, killed = {h.pid, h.starter_pid, os.getpid()}, []
    for _ in range(passes):
        found = held.members(net, keep, mark)
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
    return killed


def stop(procs: list[subprocess.Popen], timeout: float = 5.0) -> None:
    """End holders: close their input (they exit at end of file), kill any that lingers."""
    for proc in procs:
        if proc.stdin is not None and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def wait_entered(proc: subprocess.Popen, net: tuple[int, int], within: float = 60.0) -> bool:
    """Wait until ``proc`` runs in the network namespace ``net`` (device, inode), or has ended.

    ``nsenter`` joins a node's namespaces only after it has started: until then it runs in this
    process's network, where closing the nodes (or their holders, after the kernel's SIGKILL), which
    find what runs on a node by its namespace, would miss it, and it would go on to run on a node
    nobody ends. On a busy machine that window lasted seconds. ``proc`` is this process's own child,
    not yet reaped, so its pid names it. Whether it entered."""
    import time

    deadline, delay = time.monotonic() + within, 0.001
    while True:
        try:
            st = os.stat(f"/proc/{proc.pid}/ns/net")
            if (st.st_dev, st.st_ino) == net:
                return True
        except OSError:  # (ended, or not ours to look at)
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(delay)
        delay = min(2 * delay, 0.05)
