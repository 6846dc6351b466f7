"""benchmarks/gpu_check.py (``make gpu-check``): without a GPU it runs nothing and exits 0; with
the CPU standing in for the GPU its checks pass, so on a GPU machine a failure is the GPU path's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"


def _run(*args: str, timeout: float = 600) -> tuple[int, dict | None, str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # this test is about the CPU paths, GPU or not
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return proc.returncode, json.loads(lines[-1]) if lines else None, proc.stderr


def test_without_a_gpu_it_says_so_runs_nothing_and_exits_0():
    rc, out, err = _run()
    assert rc == 0, err
    assert out["gpu"] is False and out["passed"] == [] and out["failed"] == []
    assert "learner_appo" in out["skipped"] and "ddppo_gpu" in out["skipped"]
    assert "torch sees no CUDA device" in err


def test_with_the_cpu_standing_in_the_in_process_checks_pass():
    names = [
        "learner_ppo",
        "learner_dqn",
        "learner_appo",
        "multi_device_towers",
        "uint8_on_device",
        "checkpoint_to_cpu",
        "appo_pong",
    ]
    rc, out, err = _run("--device", "cpu", "--only", ",".join(names))
    assert out is not None, err[-3000:]
    assert out["failed"] == [], (out["errors"], err[-3000:])
    assert rc == 0
    assert out["passed"] == names[:-1] and out["skipped"] == ["appo_pong"]  # no Pong on the CPU by default
    assert out["gpu"] is False and out["multi_device_towers"] == 2
    assert out["uint8_bytes_per_frame_stack"] == 4 * 84 * 84


def test_an_unknown_check_is_named():
    rc, out, err = _run("--only", "learner_ppo,warp_drive")
    assert rc == 2 and out is None
    assert "unknown check(s) warp_drive" in err and "learner_apex" in err


@pytest.mark.parametrize("name", ["ddppo_gpu", "league_fractional_gpus", "learner_group"])
def test_the_ray_checks_pass_with_the_cpu_standing_in(name):
    rc, out, err = _run("--device", "cpu", "--only", name)
    assert out is not None and out["failed"] == [], ((out or {}).get("errors"), err[-3000:])
    assert rc == 0 and out["passed"] == [name]
