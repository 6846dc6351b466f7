"""benchmarks/frame_cost.py prices each part of the Atari path per frame: on a short run every
part it names is measured (positive), the op count of a learner update is a count, and the
derived rates follow from the parts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "frame_cost.py"


def _run(*args: str) -> tuple[int, dict | None, str]:
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return proc.returncode, json.loads(lines[-1]) if lines else None, proc.stderr


@pytest.mark.parametrize("algo", ["impala", "apex"])
def test_every_part_is_measured_and_the_rates_follow(algo):
    rc, out, err = _run("--algos", algo, "--seconds", "1")
    assert rc == 0 and out is not None, err[-3000:]
    r = out["algos"][algo]
    for part in ("env_us", "inference_us", "transport_us", "driver_us", "learner_host_us_per_op"):
        assert r[part] > 0, part
    assert r["frames_measured"] > 0
    assert isinstance(r["learner_ops_per_update"], int) and r["learner_ops_per_update"] > 50
    assert r["actor_us"] == pytest.approx(r["env_us"] + r["inference_us"] + r["fragment_us"], abs=0.05)
    assert r["actor_frames_per_core_s"] == pytest.approx(1e6 / r["actor_us"], rel=0.01)
    frames_per_row = 4 / (4.0 if algo == "apex" else 1)  # Ape-X learns 4 rows per sampled one
    assert r["learner_host_us"] == pytest.approx(
        r["learner_host_us_per_update"] / r["rows_per_update"] / frames_per_row, rel=0.01
    )
    if algo == "apex":  # its learning thread and loader, per update
        assert r["learning_thread_us_per_update"] > 0 and r["loader_us_per_update"] >= 0


def test_an_unknown_algorithm_is_named():
    rc, out, err = _run("--algos", "ppo")
    assert rc != 0 and out is None
    assert "appo, impala, apex" in err and "'ppo'" in err
