"""A Ray cluster of separate ``ray start --block`` processes on this machine, owned by PID.

Used by ``tests/test_real_cluster.py``. Each node is one ``ray start ... --block`` child
process; what it spawns (gcs_server, raylet, agents, workers) is found through its process
tree, and every process ever seen is remembered so that teardown kills exactly those, by
PID, and never anyone else's Ray (no ``ray stop``). Every process also carries a marker
variable in its environment, so teardown finds workers whose raylet died and left them
orphaned outside the tree.

Two nodes on one machine must not share ports: each gets its own GCS/node-manager/
object-manager/agent/metrics ports and a worker port range of its own. The cluster uses
token authentication with a fresh token (passed in the environment), so it is not open to
other users of the machine and does not depend on ``~/.ray/auth_token``.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import psutil

RAY = (
    str(Path(sys.executable).with_name("ray"))
    if Path(sys.executable).with_name("ray").exists()
    else (shutil.which("ray") or "ray")
)
MARKER = "SHOAL_TEST_CLUSTER"
PER_NODE_PORTS = (
    "--node-manager-port",
    "--object-manager-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--runtime-env-agent-port",
    "--metrics-export-port",
)


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free right now (held open together, so they differ)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def free_port_range(size: int, low: int = 20000, high: int = 32000) -> tuple[int, int]:
    """A block of ``size`` ports, all free now, below Linux's ephemeral range and above Ray's default worker range."""
    for _ in range(100):
        base = random.randrange(low, high - size)
        try:
            with ExitStack() as stack:
                for port in range(base, base + size):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
            return base, base + size - 1
        except OSError:
            continue
    raise RuntimeError(f"no block of {size} free ports between {low} and {high}")


class RayNode:
    """One ``ray start --block`` process and everything it spawned."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name, self.log_path = name, log_path
        lo, hi = free_port_range(200)
        ports = [f"{flag}={port}" for flag, port in zip(PER_NODE_PORTS, free_ports(len(PER_NODE_PORTS)))]
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(
                [
                    RAY,
                    "start",
                    *args,
                    *ports,
                    f"--min-worker-port={lo}",
                    f"--max-worker-port={hi}",
                    "--disable-usage-stats",
                    "--block",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.seen: dict[int, psutil.Process] = {}

    def processes(self) -> list[psutil.Process]:
        """The node's live processes now (remembered for teardown)."""
        try:
            root = psutil.Process(self.proc.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        for p in tree:
            self.seen.setdefault(p.pid, p)
        return [p for p in self.seen.values() if p.is_running() and _alive(p)]

    def actor_processes(self, class_name: str) -> list[psutil.Process]:
        """This node's worker processes running an actor of ``class_name`` (Ray titles them ``ray::Class...``)."""
        out = []
        for p in self.processes():
            try:
                if p.name().startswith(f"ray::{class_name}"):
                    out.append(p)
            except psutil.NoSuchProcess:
                pass
        return out

    def wait_started(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if "Ray runtime started" in self.log_path.read_text():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} node did not start:\n{self.log_path.read_text()[-3000:]}")

    def kill(self) -> list[int]:
        """SIGKILL every process of the node at once, as when its machine is lost; returns their PIDs."""
        procs = self.processes()
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=10)
        self.proc.wait(timeout=10)
        return [p.pid for p in procs]


class RealCluster:
    """A head node plus added nodes, all on this machine; ``close()`` kills every process it started."""

    def __init__(self) -> None:
        self.dir = Path(
            tempfile.mkdtemp(prefix="shoal-ray-", dir="/tmp")
        )  # short: Ray's socket paths must fit 107 chars
        self.marker = secrets.token_hex(8)
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # only the addresses given here
        self.env = {
            **env,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32),
            "RAY_USAGE_STATS_ENABLED": "0",
            MARKER: self.marker,
            # notice a lost node in 5-15 s instead of Ray's default 15-30 s, with room for a loaded machine
            "RAY_health_check_period_ms": "1000",
            "RAY_health_check_failure_threshold": "5",
            "RAY_health_check_timeout_ms": "2000",
        }
        self.nodes: list[RayNode] = []
        self.address: str | None = None
        self.other: list[subprocess.Popen] = []

    def start_head(self, num_cpus: int, resources: str) -> RayNode:
        port, client_port = free_ports(2)
        self.address = f"127.0.0.1:{port}"
        node = RayNode(
            "head",
            [
                "--head",
                f"--port={port}",
                f"--ray-client-server-port={client_port}",
                f"--num-cpus={num_cpus}",
                f"--resources={resources}",
                f"--temp-dir={self.dir / 'ray'}",
                "--include-dashboard=false",
            ],
            self.env,
            self.dir / "head.log",
        )
        self.nodes.append(node)
        node.wait_started(90)
        return node

    def add_node(self, name: str, num_cpus: int, resources: str) -> RayNode:
        node = RayNode(
            name,
            [f"--address={self.address}", f"--num-cpus={num_cpus}", f"--resources={resources}"],
            self.env,
            self.dir / f"{name}.log",
        )
        self.nodes.append(node)
        node.wait_started(90)
        return node

    def popen(self, args: list[str], **kwargs) -> subprocess.Popen:
        """A process of the test's own (a driver) with the cluster's environment; killed by ``close()`` too."""
        proc = subprocess.Popen(args, env={**self.env, **kwargs.pop("env", {})}, **kwargs)
        self.other.append(proc)
        return proc

    def marked(self) -> list[psutil.Process]:
        """Live processes of this user carrying this cluster's marker (orphans included)."""
        out = []
        for p in psutil.process_iter():
            try:
                if p.pid != os.getpid() and p.environ().get(MARKER) == self.marker:
                    out.append(p)
            except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
        return out

    def close(self) -> list[psutil.Process]:
        """Kill every process started (drivers, node trees, marked orphans) by PID; returns any still alive."""
        procs: dict[int, psutil.Process] = {}
        for proc in self.other:
            if proc.poll() is None:
                procs[proc.pid] = psutil.Process(proc.pid)
        for node in self.nodes:
            procs.update({p.pid: p for p in node.processes()})
        procs.update({p.pid: p for p in self.marked()})
        for p in procs.values():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(list(procs.values()), timeout=15)
        for proc in [*self.other, *(n.proc for n in self.nodes)]:
            proc.poll()  # reap our direct children
        shutil.rmtree(self.dir, ignore_errors=True)
        return alive + [p for p in self.marked() if _alive(p)]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
