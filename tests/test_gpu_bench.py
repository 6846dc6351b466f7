"""The GPU Pong presets and benchmarks/gpu_bench.py (``make gpu-bench``), on the CPU.

Each ``examples/<algo>_pong_gpu.yaml`` loads as written and trains one iteration with its
learner devices faked (the preset shrunk to the driver's own envs: only the keys a machine
without a GPU cannot honour change). ``gpu_bench.py`` without a GPU says so, runs nothing and
exits 0; with the CPU standing in it measures a preset and runs the Pong step, so on a GPU
machine a failure is the GPU path's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.algorithms import get_config_class
from shoal.config import load_yaml

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "gpu_bench.py"
ALGOS = ("ppo", "appo", "impala", "apex")


def _bench_module():
    spec = importlib.util.spec_from_file_location("gpu_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("algo", ALGOS)
def test_gpu_preset_loads_as_written(algo):
    data = load_yaml(str(REPO / "examples" / f"{algo}_pong_gpu.yaml"))
    assert data.pop("algo") == algo
    data.pop("stop")
    config = get_config_class(algo)(**data)
    assert config.resources.num_gpus == 1
    assert config.resources.num_workers >= 8  # sized for 16 cores, not for 2
    assert config.env_preprocessing.repeat_action_probability == 0.0
    # The recipe that learned on 2 cores travels with the GPU preset (Ape-X's batch is its own).
    small = load_yaml(str(REPO / "examples" / f"{algo}_pong.yaml"))
    same = ("gamma", "grad_clip", "model", "env_preprocessing", "entropy_coeff", "vf_loss_coeff")
    for key in same:
        if key in small:
            assert data.get(key) == small[key], key
    if algo != "apex":
        assert data["lr"] == small["lr"] and data["train_batch_size"] == small["train_batch_size"]


@pytest.mark.parametrize("algo", ALGOS)
def test_gpu_preset_trains_one_iteration_with_fake_devices(algo):
    import torch

    torch.set_num_threads(1)
    bench = _bench_module()
    data = load_yaml(str(REPO / "examples" / f"{algo}_pong_gpu.yaml"))
    data.pop("algo")
    data.pop("stop")
    data = bench.cpu_overrides(algo, data, workers=0)
    data["min_time_s_per_iteration"] = 0
    if algo == "apex":
        data["learning_starts"] = 64
        data["train_batch_size"] = 32
    algo_obj = get_config_class(algo)(**data).build()
    try:
        result = {}
        for _ in range(100):  # the asynchronous ones: until the learner thread has trained once
            result = algo_obj.train()
            if result.get("env_steps_trained", 0) > 0:
                break
        assert result["env_steps_sampled"] > 0
        assert result["env_steps_trained"] > 0
    finally:
        algo_obj.stop()


def test_steady_rate_covers_the_window_from_its_start():
    bench = _bench_module()
    points = [(5.0, 0), (10.0, 1000), (20.0, 3000), (30.0, 6000), (52.0, 10400)]
    # The window opens at the first point at or after 10 s and must span 40 s: 10 -> 52.
    rate, span, frames = bench.steady_rate(points, 10.0, 40.0)
    assert span == pytest.approx(42.0) and frames == 9400
    assert rate == pytest.approx(9400 / 42.0)
    assert bench.steady_rate(points, 10.0, 50.0) is None  # not yet covered
    assert bench.steady_rate(points[:1], 0.0, 1.0) is None


def test_busy_fraction_reads_each_algorithms_report():
    bench = _bench_module()
    assert bench.busy_fraction("apex", {"learner_busy_fraction": 0.9}) == 0.9
    assert bench.busy_fraction("appo", {"learner_idle_fraction": 0.25}) == 0.75
    ppo = {"timers/sample_ms": 30.0, "timers/learn_ms": 60.0, "timers/sync_ms": 10.0}
    assert bench.busy_fraction("ppo", ppo) == pytest.approx(0.6)
    assert bench.busy_fraction("impala", {}) is None


def _run(*args: str, timeout: float = 600) -> tuple[int, dict | None, str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return proc.returncode, json.loads(lines[-1]) if lines else None, proc.stderr


def test_without_a_gpu_it_says_so_runs_nothing_and_exits_0(tmp_path):
    rc, out, err = _run("--out-dir", str(tmp_path))
    assert rc == 0, err
    assert out == {**out, "benchmark": "gpu_bench", "gpu": False, "presets": {}, "pong": None}
    assert "no GPU" in err and "torch sees no CUDA device" in err
    assert not list(tmp_path.iterdir())  # nothing run, nothing written


def test_an_unknown_preset_is_named(tmp_path):
    rc, out, err = _run("--presets", "ppo,warp", "--out-dir", str(tmp_path))
    assert rc != 0 and out is None
    assert "warp" in err and "apex" in err


def test_with_the_cpu_standing_in_it_measures_and_runs_pong(tmp_path):
    rc, out, err = _run(
        "--device",
        "cpu",
        "--presets",
        "ppo",
        "--warmup-s",
        "0",
        "--window-s",
        "2",
        "--pong-budget-s",
        "8",
        "--out-dir",
        str(tmp_path),
    )
    assert rc == 0 and out is not None, err[-3000:]
    ppo = out["presets"]["ppo"]
    assert "error" not in ppo, err[-3000:]
    assert ppo["frames_per_s"] > 0 and ppo["window_s"] >= 2 and ppo["frames"] > 0
    assert 0 < ppo["learner_busy_fraction"] < 1
    assert ppo["gpu_util_mean"] is None  # no nvidia-smi reading on the CPU
    assert out["fastest"] == "ppo"
    pong = out["pong"]
    assert pong["algo"] == "ppo" and pong["reached"] is False and pong["frames"] > 0, pong
    assert json.loads((tmp_path / "gpu_bench.json").read_text()) == out
