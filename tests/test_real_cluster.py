"""A real two-node Ray cluster started with ``ray start``, and a run that loses one node.

The head (4 CPUs) and a side node (2 CPUs) are separate ``ray start --block`` processes with
their own ports and a custom resource each; ``shoal train appo --address <head>`` runs in a
process of its own with two rollout actors spread over the nodes
(``resources.worker_placement=SPREAD``). The side node's processes are then SIGKILLed
together, as when a machine disappears: the run must go on, count the restart, recreate the
rollout actor on the head and finish with exit 0 and its checkpoints. Every process the test
started is killed by PID at teardown (tests/real_cluster.py), never with ``ray stop``.

Marked ``cluster`` (``-m "not cluster"`` deselects it where Ray cannot start several nodes).
The simulated ``ray.cluster_utils.Cluster`` tests in test_apex.py and
test_distributed_learners.py cover the fast cases.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
from real_cluster import RealCluster

pytestmark = [pytest.mark.cluster, pytest.mark.ray, pytest.mark.timeout(300)]
HERE = Path(__file__).parent
STOP_ITERS = 30  # an APPO iteration lasts at least min_time_s_per_iteration (1 s): the run outlives the node


@pytest.fixture
def cluster():
    c = RealCluster()
    try:
        yield c
    finally:
        left = c.close()
        assert not left, f"processes of the test cluster still alive after teardown: {left}"


def read_results(out: Path) -> list[dict]:
    files = list(out.glob("*/results.jsonl"))
    if not files:
        return []
    return [json.loads(line) for line in files[0].read_text().splitlines() if line.strip()]


def wait_for(what: str, cond, timeout_s: float, logs) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}\n{logs()}")


def test_a_run_survives_losing_a_node(cluster, tmp_path):
    head = cluster.start_head(num_cpus=4, resources='{"head_node": 1}')
    side = cluster.add_node("side", num_cpus=2, resources='{"side_node": 1}')
    out, log_path = tmp_path / "runs", tmp_path / "train.log"
    with open(log_path, "w") as log:
        run = cluster.popen(
            [
                sys.executable,
                "-m",
                "shoal",
                "train",
                "appo",
                "--env",
                "CartPole-v1",
                "--workers",
                "2",
                "--envs-per-worker",
                "2",
                "--address",
                cluster.address,
                "--set",
                "resources.worker_placement=SPREAD",
                "--stop-iters",
                str(STOP_ITERS),
                "--no-stop-reward",
                "--checkpoint-every",
                "10",
                "--quiet",
                "--out",
                str(out),
            ],
            stdout=log,
            stderr=log,
            cwd=tmp_path,
            env={"PYTHONPATH": str(HERE.parent)},
        )

    def logs() -> str:
        return f"--- train.log ---\n{log_path.read_text()[-4000:]}\n--- head ---\n{head.log_path.read_text()[-1500:]}"

    # One rollout actor on each node (SPREAD), and the run reporting.
    wait_for(
        "a rollout actor on each node",
        lambda: (
            run.poll() is None
            and len(head.actor_processes("EnvRunner")) == 1
            and len(side.actor_processes("EnvRunner")) == 1
            and len(read_results(out)) >= 2
        ),
        120,
        logs,
    )
    before = read_results(out)
    assert before[-1]["num_worker_restarts"] == 0

    killed = side.kill()
    assert len(killed) >= 3, killed  # ray start, raylet, the actor's worker (and the node's agents)

    wait_for(
        "the restart counted and the actor recreated on the head",
        lambda: (
            read_results(out)
            and read_results(out)[-1]["num_worker_restarts"] >= 1
            and len(head.actor_processes("EnvRunner")) == 2
        ),
        90,
        logs,
    )
    n_after = len(read_results(out))
    wait_for(
        "the run to go on after the restart",
        lambda: len(read_results(out)) >= n_after + 3 or run.poll() is not None,
        60,
        logs,
    )

    assert run.wait(timeout=150) == 0, logs()
    results = read_results(out)
    assert [r["iteration"] for r in results] == list(range(1, STOP_ITERS + 1))
    assert results[-1]["num_worker_restarts"] >= 1
    assert results[-1]["env_steps_sampled"] > before[-1]["env_steps_sampled"]
    run_dir = next(out.iterdir())
    assert (run_dir / "checkpoints" / "best").is_dir() and (
        run_dir / "checkpoints" / f"checkpoint_{STOP_ITERS:06d}"
    ).is_dir(), sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    text = log_path.read_text()
    assert re.search(r"rollout actor [12] .*; recreating it", text), logs()  # one line from shoal saying what happened
    assert "Traceback" not in text, logs()
