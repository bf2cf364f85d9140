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
from distlab.nodes import plan

TOOLS = ("unshare", "nsenter", "ip", "tc", "mount", "hostname", "cat")
# The holder: say its pid, keep the namespaces until its input ends (close(), or the kernel's death,
# even by SIGKILL), then kill whatever still runs in its network namespace (a server a cell started
# there, say), which would otherwise keep the namespace alive; only then end, and the namespace with it.
HOLD = ('echo $$; cat >/dev/null; me=$(readlink /proc/$$/ns/net); for p in /proc/[0-9]*; do pid=${p#/proc/}; '
        '[ "$pid" = $$ ] || [ "$pid" = $PPID ] || [ "$(readlink $p/ns/net 2>/dev/null)" != "$me" ] '
        '|| kill -9 "$pid" 2>/dev/null; done')
SWITCH_SH = "ip link add {bridge} type bridge && ip link set {bridge} up && ip link set lo up && " + HOLD
NODE_SH = 'hostname "$1" && mount --bind "$2" /etc/hosts && ip link set lo up && ' + HOLD
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


def missing_tools(which=shutil.which) -> list[str]:
    return [tool for tool in TOOLS if which(tool) is None]


def check_possible() -> None:
    """Refuse, with the cause and the setting to change, where nodes cannot be made."""
    missing = missing_tools()
    if missing:
        hint = "Install iproute2 and util-linux (Debian: apt-get install iproute2 util-linux)."
        raise NodesError(NODES.format(problem=f"{', '.join(missing)} not found", hint=hint))
    user = ["--user", "--map-root-user"] if with_user_namespace() else []
    probe = subprocess.run(["unshare", *user, "--net", "true"], capture_output=True, text=True)
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


def enter(pid: int, *, uts_and_mounts: bool = False) -> list[str]:
    """The command prefix that runs a program in holder ``pid``'s namespaces (net, and for a
    node also its host name and /etc/hosts), in this process's working directory."""
    argv = ["nsenter", "-t", str(pid), "-n"]
    if with_user_namespace():
        argv += ["-U", "--preserve-credentials"]
    if uts_and_mounts:
        argv += ["-u", "-m", f"--wd={os.getcwd()}"]
    return argv


def start_holder(argv: list[str]) -> tuple[subprocess.Popen, int]:
    """Start a holder; its pid (the ``cat`` that keeps the namespaces) once it is ready."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = proc.stdout.readline()
    proc.stdout.close()
    if not line.strip().isdigit():
        err = proc.stderr.read().decode(errors="replace").strip()
        stop([proc])
        raise NodesError(NODES.format(problem=f"`{' '.join(argv[:12])} ...` failed: {err or 'no output'}",
                                      hint="Run that command in a terminal to see why."))
    return proc, int(line)


def start_switch() -> tuple[subprocess.Popen, int]:
    sh = SWITCH_SH.replace("{bridge}", plan.SWITCH_BRIDGE)
    user = ["--user", "--map-root-user"] if with_user_namespace() else []
    return start_holder(["unshare", *user, "--net", "--kill-child", "--fork", "sh", "-c", sh])


def start_node(switch_pid: int, node: int, hosts: Path) -> tuple[subprocess.Popen, int]:
    """A node's holder; made inside the switch's user namespace when there is one (so that the
    switch may move the node's end of its link into it)."""
    inside = ["nsenter", "-t", str(switch_pid), "-U", "--preserve-credentials"] if with_user_namespace() else []
    return start_holder([*inside, "unshare", "--net", "--uts", "--mount", "--kill-child", "--fork",
                         "sh", "-c", NODE_SH, "node", plan.host(node), str(hosts)])


def batch(pid: int, tool: str, lines: list[str], what: str) -> None:
    """Run ``tool -batch -`` (ip or tc) with ``lines`` in holder ``pid``'s network namespace."""
    done = subprocess.run([*enter(pid), tool, "-batch", "-"], input="\n".join(lines) + "\n",
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise NodesError(NODE_COMMAND.format(node=what, host=what, command=f"{tool} -batch", code=done.returncode,
                                             output=done.stderr.strip(), hint="This is a bug in distlab's nodes."))


def link_nodes(switch_pid: int, node_pids: list[int]) -> None:
    """One veth pair per node: ``eth0`` in the node, its port on the switch's bridge."""
    lines = []
    for k, pid in enumerate(node_pids):
        port = plan.switch_port(k)
        lines += [f"link add {port} type veth peer name {plan.NODE_IF} netns {pid}",
                  f"link set {port} master {plan.SWITCH_BRIDGE}", f"link set {port} up"]
    batch(switch_pid, "ip", lines, "switch")
    for k, pid in enumerate(node_pids):
        batch(pid, "ip", [f"addr add {plan.address(k)}/24 dev {plan.NODE_IF}", f"link set {plan.NODE_IF} up"],
              plan.host(k))


def shape(switch_pid: int, node_pid: int, node: int, bits: int | None) -> None:
    """Set node ``node``'s link rate on both ends (what it sends, what it receives); None: no limit."""
    for pid, dev in ((node_pid, plan.NODE_IF), (switch_pid, plan.switch_port(node))):
        cmd = plan.shape_command(dev, bits)
        done = subprocess.run([*enter(pid), "tc", *cmd], capture_output=True, text=True)
        if done.returncode != 0 and bits is not None:  # (removing a limit that was never set fails: fine)
            raise NodesError(NODE_COMMAND.format(node=node, host=plan.host(node), command="tc " + " ".join(cmd),
                                                 code=done.returncode, output=done.stderr.strip(),
                                                 hint="Check that the kernel has the tbf qdisc (sch_tbf)."))


def link_stats(switch_pid: int) -> str:
    return subprocess.run([*enter(switch_pid), "ip", "-j", "-s", "link", "show"], capture_output=True,
                          text=True, check=True).stdout


def kill_inside(holder_pid: int) -> list[int]:
    """SIGKILL every process in holder ``holder_pid``'s network namespace except the holder and the
    ``unshare`` that made it (which keep the namespace); their pids."""
    import signal

    try:
        net = os.readlink(f"/proc/{holder_pid}/ns/net")
        keep = {holder_pid, int(Path(f"/proc/{holder_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])}
    except OSError:
        return []
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in keep:
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/net") == net:
                os.kill(int(entry), signal.SIGKILL)
                killed.append(int(entry))
        except OSError:  # gone, or not ours to look at
            continue
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
