"""Sampling throughput alone (no learning): env steps per second on CartPole-v1.

An EnvRunner with an ActorCriticPolicy and the PPO GAE postprocessing (gamma 0.99, lambda
0.95), measured three ways: in this process; as 1 Ray rollout actor; as 2 Ray rollout
actors (each reserving 1 CPU, built through ``shoal.runtime.make_actor_group`` as the
algorithms build them, and called with ``group.foreach("sample")``, so the transfer of
every batch back to the driver is included). Each measurement warms up with one
``sample()`` and then counts ``metrics.env_steps`` (valid steps; reset steps are not
counted) of the fragments finished within ``--seconds``.

    python benchmarks/sampling.py [--envs 256] [--fragment 64] [--seconds 5]

Progress goes to stderr; the last stdout line is one JSON object:
``{"benchmark": "sampling", "local_env_steps_per_s", "ray_1_worker_env_steps_per_s",
"ray_2_workers_env_steps_per_s", "envs_per_worker", "fragment", "seconds"}``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time

from shoal import runtime
from shoal.algorithms.ppo import PPOConfig
from shoal.algorithms.ppo_loss import gae_postprocess
from shoal.rollout import ActorCriticPolicy, EnvRunner


def log(msg: str) -> None:
    print(f"[sampling] {msg}", file=sys.stderr, flush=True)


def measure(sample_once, seconds: float) -> float:
    """Env steps per second of ``sample_once() -> steps`` over a window of ``seconds`` (after one warm-up call)."""
    sample_once()
    steps, t0 = 0, time.perf_counter()
    while True:
        steps += sample_once()
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return steps / elapsed


def measure_ray(config: PPOConfig, n: int, postprocess, fragment: int, seconds: float) -> float:
    def ctor(i: int):
        return (config, i, ActorCriticPolicy, postprocess, fragment), {}

    group = runtime.make_actor_group(EnvRunner, n, ctor, remote=True, num_cpus=1, name="rollout actor")
    try:

        def sample_once() -> int:
            results = group.foreach("sample")
            if len(results) != n:  # a failed actor is restarted and left out: do not hide it
                raise RuntimeError(f"{n - len(results)} of {n} rollout actors failed: {group.last_failure}")
            return sum(m.env_steps for _, m in results)

        return measure(sample_once, seconds)
    finally:
        group.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", type=int, default=256, help="envs per runner")
    p.add_argument("--fragment", type=int, default=64, help="steps per env per sample()")
    p.add_argument("--seconds", type=float, default=5.0, help="length of each measurement")
    args = p.parse_args()

    config = PPOConfig(
        env="CartPole-v1", seed=0, rollout_fragment_length=args.fragment, resources={"num_envs_per_worker": args.envs}
    )
    postprocess = functools.partial(gae_postprocess, gamma=0.99, gae_lambda=0.95)
    out = {"benchmark": "sampling"}
    try:
        runner = EnvRunner(config, 0, ActorCriticPolicy, postprocess, args.fragment)
        out["local_env_steps_per_s"] = measure(lambda: runner.sample()[1].env_steps, args.seconds)
        runner.stop()
        log(f"local: {out['local_env_steps_per_s']:,.0f} env steps/s")
        for n, key in ((1, "ray_1_worker_env_steps_per_s"), (2, "ray_2_workers_env_steps_per_s")):
            out[key] = measure_ray(config, n, postprocess, args.fragment, args.seconds)
            log(f"ray, {n} worker(s): {out[key]:,.0f} env steps/s")
    finally:
        runtime.shutdown()
    out.update(envs_per_worker=args.envs, fragment=args.fragment, seconds=args.seconds)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
