"""Every CUDA path of shoal, run for real on a GPU machine: one JSON line says which passed.

    make gpu-check                     # or: python benchmarks/gpu_check.py
    python benchmarks/gpu_check.py [--device cuda|cpu] [--only NAME,NAME] [--pong-s 120]

Without a CUDA device (and without ``--device cpu``) it says so on stderr, prints
``{"benchmark": "gpu_check", "gpu": false, "passed": [], "failed": [], ...}`` and exits 0
having run nothing. ``--device cpu`` runs the same checks with the CPU standing in for the GPU
(learners on ``cpu``, fake learner devices, gloo for nccl): that is how the script's own logic is
tested on machines without one.

The checks (``--only`` picks some):

- ``learner_ppo``, ``learner_dqn``, ``learner_apex``, ``learner_impala``, ``learner_appo``: each
  algorithm's learner with ``resources.num_gpus: 1`` on CartPole, two iterations; its module
  (and APPO's target network) must sit on the GPU and its loss stay finite.
- ``multi_device_towers``: APPO's multi-device learner over every visible GPU (two fake
  devices on the CPU).
- ``uint8_on_device``: an Atari-shaped uint8 batch crosses to the device as uint8 (a quarter of
  the bytes of float32) and the Nature CNN scales it there.
- ``checkpoint_to_cpu``: a PPO checkpoint written by a GPU learner loads with
  ``shoal.load_policy`` in a process that sees no GPU (``CUDA_VISIBLE_DEVICES=""``) and acts.
- ``ddppo_gpu``: DD-PPO, two Ray workers learning on the GPU: with one GPU they share it (0.5
  each) and all-reduce with gloo (NCCL refuses two ranks on one device); with two or more GPUs,
  one each and NCCL (``ddppo_backend`` says which ran).
- ``league_fractional_gpus``: an AlphaStar league whose two learning policies share one GPU in a
  remote learner shard.
- ``learner_group``: APPO with two learner processes (``resources.num_learners: 2``): with two or
  more GPUs one each and NCCL, with one GPU sharing it (0.5 each) over gloo
  (``learner_group_backend`` says which); both must train on the GPU and end with equal replicas.
- ``appo_pong``: ``examples/appo_pong.yaml`` with its learner on the GPU for ``--pong-s``
  seconds (frames/s and the learner's share of busy time); skipped with ``--pong-s 0``, the
  default on the CPU.

The Ray checks are reported in ``skipped`` when Ray is not installed (a GPU image may lack it).
Progress goes to stderr; the last stdout line is one JSON object: ``gpu``, ``device`` (the GPU's
name), ``torch``, ``cuda``, ``passed``, ``failed``, ``skipped`` (lists of check names), ``errors``
(the last line of each failure), ``seconds`` (per check) and ``appo_pong_frames_per_s``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parent.parent
LEARNER_ALGOS = ("ppo", "dqn", "apex", "impala", "appo")
RAY_CHECKS = ("ddppo_gpu", "league_fractional_gpus", "learner_group")


def log(msg: str) -> None:
    print(f"[gpu_check] {msg}", file=sys.stderr, flush=True)


class Check:
    """What every check gets: the device standing for "the GPU" and how to configure for it."""

    def __init__(self, device: str, tmp: Path, pong_s: float) -> None:
        self.device, self.tmp, self.pong_s = device, tmp, pong_s
        self.cuda = device == "cuda"
        self.facts: dict[str, Any] = {}

    def gpus(self, n: float = 1) -> float:
        """``resources.num_gpus`` for a learner on "the GPU": n on CUDA, 0 on the CPU stand-in."""
        return n if self.cuda else 0.0

    def expect_on_device(self, module: torch.nn.Module, what: str) -> None:
        got = {p.device.type for p in module.parameters()}
        if got != {self.device}:
            raise AssertionError(f"{what} has parameters on {sorted(got)}, expected {self.device}")


def _small(algo: str, **kw: Any):
    from shoal.algorithms import get_config_class

    base: dict[str, Any] = dict(env="CartPole-v1", seed=0, min_time_s_per_iteration=0.0)
    if algo in ("impala", "appo"):
        base.update(rollout_fragment_length=16, train_batch_size=128, resources={"num_envs_per_worker": 8})
    if algo in ("dqn", "apex"):
        base.update(learning_starts=64, train_batch_size=32)
    merged = {**base, **kw, "resources": {**base.get("resources", {}), **kw.get("resources", {})}}
    return get_config_class(algo)(**merged)


def _finite(result: dict[str, Any], key: str) -> None:
    value = result.get(key)
    if value is None or not math.isfinite(float(value)):
        raise AssertionError(f"{key} is {value!r} after training")


def check_learner(c: Check, algo: str) -> None:
    cfg = _small(algo, resources={"num_gpus": c.gpus()})
    with cfg.build() as trained:
        result: dict[str, Any] = {}
        for _ in range(2):
            result = trained.train()
        deadline = time.time() + 60
        while result.get("env_steps_trained", 0) == 0 and time.time() < deadline:  # async learners: one result
            result = trained.train()
        if result.get("env_steps_trained", 0) == 0:
            raise AssertionError("nothing was trained in 60 s")
        for pid, pl in trained.policies:
            c.expect_on_device(pl.learner.module, f"{algo} learner of {pid}")
            if pl.target is not None:
                c.expect_on_device(pl.target.net, f"{algo} target network of {pid}")
        loss = next(
            (
                k
                for k in ("learner/total_loss", "learner/loss", "learner/td_loss", "learner/policy_loss")
                if k in result
            ),
            None,
        )
        if loss is not None:
            _finite(result, loss)


def check_multi_device_towers(c: Check) -> None:
    n = max(1, torch.cuda.device_count()) if c.cuda else 2
    cfg = _small(
        "appo",
        num_learner_devices=n,
        fake_devices=not c.cuda,
        train_batch_size=16 * 2 * n,
        resources={"num_gpus": c.gpus(n)},
    )
    with cfg.build() as trained:
        deadline, result = time.time() + 90, {}
        while result.get("env_steps_trained", 0) < 4 * cfg.train_batch_size and time.time() < deadline:
            result = trained.train()
        if result.get("env_steps_trained", 0) == 0:
            raise AssertionError("the multi-device learner trained nothing in 90 s")
        c.expect_on_device(trained.policies.only.learner.module, "the master copy")
    c.facts["multi_device_towers"] = n


def check_uint8_on_device(c: Check) -> None:
    import gymnasium as gym
    import numpy as np

    from shoal.batch import Batch, Col
    from shoal.config import ModelConfig
    from shoal.models import build_actor_critic

    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    rows = np.random.default_rng(0).integers(0, 256, (64, 4, 84, 84), dtype=np.uint8)
    tensors = Batch({Col.OBS: rows}).to_torch(torch.device(c.device))
    obs = tensors[Col.OBS]
    if obs.dtype != torch.uint8 or obs.device.type != c.device:
        raise AssertionError(f"the frames crossed as {obs.dtype} on {obs.device}, expected uint8 on {c.device}")
    model = build_actor_critic(space, gym.spaces.Discrete(6), ModelConfig(torso="nature_cnn", hiddens=[])).to(c.device)
    logits, value = model(obs)
    if not (torch.isfinite(logits).all() and torch.isfinite(value).all()):
        raise AssertionError("the network's output on uint8 frames is not finite")
    c.facts["uint8_bytes_per_frame_stack"] = int(rows[0].nbytes)


def check_checkpoint_to_cpu(c: Check) -> None:
    with _small(
        "ppo", train_batch_size=256, minibatch_size=64, num_sgd_iter=1, resources={"num_gpus": c.gpus()}
    ).build() as trained:
        trained.train()
        c.expect_on_device(trained.policies.only.learner.module, "the PPO learner")
        path = trained.save(c.tmp / "ppo_checkpoint")
    code = (
        "import numpy as np, torch, shoal; assert not torch.cuda.is_available(); "
        f"p = shoal.load_policy({str(path)!r}); a, _ = p.predict(np.zeros(4, np.float32)); print('acted', int(a))"
    )
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 or "acted" not in proc.stdout:
        raise AssertionError(f"load_policy in a CPU-only process failed: {(proc.stderr or proc.stdout).strip()[-400:]}")


def check_ddppo_gpu(c: Check) -> None:
    from shoal.algorithms import get_config_class

    # NCCL refuses two ranks on one device: with one GPU the two workers share it (0.5 each) and
    # all-reduce their CUDA gradients with gloo; with two or more, each gets a whole GPU and NCCL.
    nccl = c.cuda and torch.cuda.device_count() >= 2
    c.facts["ddppo_backend"] = "nccl" if nccl else "gloo"
    cfg = get_config_class("ddppo")(
        env="CartPole-v1",
        seed=0,
        rollout_fragment_length=32,
        minibatch_size=64,
        num_sgd_iter=1,
        torch_distributed_backend=c.facts["ddppo_backend"],
        min_time_s_per_iteration=0.0,
        resources={"num_workers": 2, "num_envs_per_worker": 4, "num_gpus_per_worker": c.gpus(1 if nccl else 0.5)},
    )
    with cfg.build() as trained:
        for _ in range(2):
            result = trained.train()
        _finite(result, "learner/total_loss" if "learner/total_loss" in result else "learner/policy_loss")


def check_league_fractional_gpus(c: Check) -> None:
    from shoal.algorithms import get_config_class
    from shoal.config import load_yaml

    data = load_yaml(REPO / "examples" / "alpha_star_tictactoe.yaml")
    for key in ("algo", "stop"):
        data.pop(key, None)
    data.update(max_num_policies_to_train=2, min_time_s_per_iteration=0.5)
    data["league"] = {**data["league"], "num_main_exploiters": 1}
    data["resources"] = {
        **data["resources"],
        "num_envs_per_worker": 8,
        "num_gpus": c.gpus(1),
        "remote_learners": True,
        "num_learner_shards": 1,
        "num_cpus_per_learner": 0.25,
        "num_workers": 1,
        "num_cpus_per_worker": 0.25,
    }
    with get_config_class("alpha_star")(**data).build() as trained:
        deadline, result = time.time() + 120, {}
        while time.time() < deadline:
            result = trained.train()
            learned = [k for k, v in result.items() if k.startswith("learner/") and k.endswith("/num_updates") and v]
            if len(learned) >= 2:
                break
        else:
            raise AssertionError(f"two policies did not both learn within 120 s (results: {sorted(result)[:20]})")


def check_learner_group(c: Check) -> None:
    # Two APPO learner processes training data parallel: with two or more GPUs one each and NCCL;
    # with one GPU they share it (0.5 each) and all-reduce their CUDA gradients with gloo.
    from shoal.algorithms import get_config_class

    per_learner = c.gpus(1 if c.cuda and torch.cuda.device_count() >= 2 else 0.5)
    cfg = get_config_class("appo")(
        env="CartPole-v1",
        seed=0,
        rollout_fragment_length=16,
        train_batch_size=256,
        min_time_s_per_iteration=0.0,
        resources={
            "num_workers": 1,
            "num_envs_per_worker": 8,
            "num_cpus_per_worker": 0.25,
            "num_learners": 2,
            "num_cpus_per_learner": 0.25,
            "num_gpus_per_learner": per_learner,
        },
    )
    c.facts["learner_group_backend"] = cfg.resources.learner_backend()
    with cfg.build() as trained:
        deadline, result = time.time() + 120, {}
        while time.time() < deadline and result.get("num_learner_results", 0) < 8:
            result = trained.train()
        if result.get("num_learner_results", 0) < 8:
            raise AssertionError(f"the learner group learned {result.get('num_learner_results')} batches in 120 s")
        group = trained.learner_group
        group.wait_idle()
        devices = [group.group.call(i, "device") for i in sorted(group.group.actor_ids)]
        if any(not d.startswith(c.device) for d in devices):
            raise AssertionError(f"the learners trained on {devices}, expected {c.device}")
        w = [group.group.call(i, "get_weights") for i in sorted(group.group.actor_ids)]
        if any(not (w[0][k] == w[1][k]).all() for k in w[0]):
            raise AssertionError("the two learners' replicas differ after training")


def check_appo_pong(c: Check) -> None:
    if c.pong_s <= 0:
        raise SkipCheck("--pong-s 0")
    from shoal.algorithms import get_config_class
    from shoal.config import load_yaml

    data = load_yaml(REPO / "examples" / "appo_pong.yaml")
    for key in ("algo", "stop"):
        data.pop(key, None)
    data["resources"] = {**data.get("resources", {}), "num_gpus": c.gpus()}
    data["min_time_s_per_iteration"] = 5
    with get_config_class("appo")(**data, seed=0).build() as trained:
        t0, result = time.time(), {}
        while time.time() - t0 < c.pong_s:
            result = trained.train()
        c.expect_on_device(trained.policies.only.learner.module, "the APPO learner")
        skip = trained.config.env_preprocessing.frame_skip
    c.facts["appo_pong_frames_per_s"] = round(result["env_steps_sampled"] * skip / result["time_total_s"], 1)
    c.facts["appo_pong_trained_per_s"] = round(result["env_steps_trained"] / result["time_total_s"], 1)


class SkipCheck(Exception):
    """A check that does not apply here (said why)."""


def checks() -> dict[str, Callable[[Check], None]]:
    out: dict[str, Callable[[Check], None]] = {
        f"learner_{a}": (lambda c, a=a: check_learner(c, a)) for a in LEARNER_ALGOS
    }
    out.update(
        multi_device_towers=check_multi_device_towers,
        uint8_on_device=check_uint8_on_device,
        checkpoint_to_cpu=check_checkpoint_to_cpu,
        ddppo_gpu=check_ddppo_gpu,
        league_fractional_gpus=check_league_fractional_gpus,
        learner_group=check_learner_group,
        appo_pong=check_appo_pong,
    )
    return out


def run(device: str, names: list[str], pong_s: float) -> dict[str, Any]:
    torch.set_num_threads(1)
    passed, failed, skipped, errors, seconds = [], [], [], {}, {}
    facts: dict[str, Any] = {}
    have_ray = importlib.util.find_spec("ray") is not None
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            c = Check(device, Path(tmp), pong_s)
            if name in RAY_CHECKS and not have_ray:
                skipped.append(name)
                errors[name] = "skipped: ray is not installed"
                continue
            log(f"{name} ...")
            t0 = time.perf_counter()
            try:
                checks()[name](c)
            except SkipCheck as e:
                skipped.append(name)
                errors[name] = f"skipped: {e}"
            except Exception as e:  # noqa: BLE001 - every failure is reported, the others still run
                failed.append(name)
                errors[name] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"[:500]
                log("".join(traceback.format_exception(e))[-2000:])
            else:
                passed.append(name)
            finally:
                seconds[name] = round(time.perf_counter() - t0, 1)
                _shutdown_ray()
            facts.update(c.facts)
            log(
                f"{name}: {'passed' if name in passed else 'skipped' if name in skipped else 'FAILED'} "
                f"in {seconds[name]} s {errors.get(name, '')}"
            )
    return {
        "passed": passed,
        "failed": failed,
        "skipped": skipped,
        "errors": errors,
        "seconds": seconds,
        "appo_pong_frames_per_s": facts.pop("appo_pong_frames_per_s", None),
        **facts,
    }


def _shutdown_ray() -> None:
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description="Run every CUDA path of shoal once; one JSON line.")
    p.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default=None,
        help="default: cuda when torch sees one, else nothing runs; cpu: the CPU stands in",
    )
    p.add_argument("--only", default="", help=f"comma-separated checks (of {', '.join(checks())})")
    p.add_argument("--pong-s", type=float, default=None, help="seconds of APPO Pong (default 120 on cuda, 0 on cpu)")
    args = p.parse_args()
    names = [n for n in args.only.split(",") if n] or list(checks())
    unknown = sorted(set(names) - set(checks()))
    if unknown:
        p.error(f"unknown check(s) {', '.join(unknown)}; the checks are {', '.join(checks())}")
    header: dict[str, Any] = {"benchmark": "gpu_check", "torch": torch.__version__, "cuda": torch.version.cuda}
    device = args.device or ("cuda" if torch.cuda.is_available() else None)
    if device is None:
        log(
            "torch sees no CUDA device here: nothing to check (run this on a GPU machine, or --device cpu to "
            "exercise the checks with the CPU standing in)"
        )
        print(
            json.dumps(
                {
                    **header,
                    "gpu": False,
                    "device": None,
                    "passed": [],
                    "failed": [],
                    "skipped": names,
                    "errors": {},
                    "seconds": {},
                    "appo_pong_frames_per_s": None,
                }
            )
        )
        return
    if device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch sees no CUDA device")
    pong_s = args.pong_s if args.pong_s is not None else (120.0 if device == "cuda" else 0.0)
    gpu_name = torch.cuda.get_device_name(0) if device == "cuda" else None
    log(
        f"device {device}{f' ({gpu_name}, {torch.cuda.device_count()} visible)' if gpu_name else ''}: "
        f"{len(names)} checks"
    )
    out = run(device, names, pong_s)
    print(json.dumps({**header, "gpu": device == "cuda", "device": gpu_name or "cpu (standing in for a GPU)", **out}))
    sys.exit(1 if out["failed"] else 0)


if __name__ == "__main__":
    main()
