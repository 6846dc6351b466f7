"""The learner group's speedup: APPO, learner-bound, K learner processes against one.

    python benchmarks/learner_group.py [--learners 1,2] [--shape pong|cartpole] [--seconds 60]
                                       [--warmup-s 25] [--train-batch-size 512] [--envs 4] [--gpus 0]

APPO with the Nature CNN at 84x84 (``--shape pong``) is learner-bound on this machine: one
core trains about 1.2k rows/s, while a real Pong actor needs a core to make 1.5k. So the
rollout actors here are the virtual ones of ``driver_scaling.py``: a host process answers every
sample request with one pre-built real fragment (``--envs`` Pongs x 32 steps, sampled once at
the start), leaving the machine's two cores to the learners and the driver. Everything else
is the real run: APPO's driver, its pipeline, and with K > 1 the learner group (K processes,
gradients all-reduced over gloo, fragments passed by reference) or with K = 1 the learner
thread in the driver, the default. ``--gpus G`` (a GPU machine) puts the learner on G GPUs
(with K > 1, G / K each).

Per K it trains ``--warmup-s`` seconds (the learner processes start, import torch, form the
group), then measures ``--seconds``: trained rows per second (``env_steps_trained``), the
learner's busy fraction, milliseconds per all-reduce, and the driver process's CPU use. The
last stdout line is one JSON object with ``speedup_2_vs_1`` (trained rows/s with two learners
over one learner with one torch thread), ``speedup_2_vs_1_same_threads`` (over one learner
allowed two torch threads, as many as the two learners have together: the fair comparison,
since otherwise the figure may only show that two processes use two cores; skipped with
``--no-same-threads`` or ``--gpus``) and the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import driver_scaling as ds  # noqa: E402  (its virtual rollout actors)


def log(msg: str) -> None:
    print(f"[learner_group] {msg}", file=sys.stderr, flush=True)


def config(args, num_learners: int, num_workers: int, torch_threads: int = 1) -> dict[str, Any]:
    return {
        "env": ds.SHAPES[args.shape]["env"],
        "model": ds.SHAPES[args.shape]["model"],
        "seed": 0,
        "rollout_fragment_length": 32,
        "train_batch_size": args.train_batch_size,
        "num_sgd_iter": 1,
        "minibatch_buffer_size": 1,
        "learner_queue_size": 4,
        "broadcast_interval": args.broadcast_interval,
        "min_time_s_per_iteration": 1.0,
        "resources": {
            "num_workers": num_workers,
            "num_envs_per_worker": args.envs,
            "num_cpus_per_worker": 0.001,
            "num_learners": num_learners,
            "torch_threads": torch_threads,
            "num_cpus_per_learner": 0.45,  # Ray's accounting only: 2 learners and the driver on 2 cores
            # --gpus G: one learner in the driver on G GPUs, or K learner processes sharing them
            **({"num_gpus": args.gpus} if args.gpus and num_learners == 1 else {}),
            **({"num_gpus_per_learner": args.gpus / num_learners} if args.gpus and num_learners > 1 else {}),
        },
    }


def sample_once(args) -> Any:
    """One real (fragment, metrics) of APPO's rollout actors, from the env in-process."""
    from shoal.algorithms.appo import APPOConfig

    algo = APPOConfig(**config(args, 1, 0)).build()
    try:
        return algo.env_runners.start().call(0, "sample")
    finally:
        algo.stop()


def run_one(args, num_learners: int, sample_result: Any, torch_threads: int = 1) -> dict[str, Any]:
    import ray

    from shoal.algorithms.appo import APPOConfig

    host_cls = ray.remote(ds.FragmentHost).options(num_cpus=0.001, max_concurrency=64)
    hosts = [host_cls.remote(ray.put(sample_result), args.actors / args.rate)]
    ray.get([h.counts.remote() for h in hosts])
    ds.install_virtual_actors(hosts)
    algo = APPOConfig(**config(args, num_learners, args.actors, torch_threads)).build()
    try:
        t_end = time.monotonic() + args.warmup_s
        while time.monotonic() < t_end:
            algo.train()
        thread = algo.pipeline.thread if num_learners == 1 else None
        steps0, cpu0, wall0 = algo.counters["env_steps_trained"], time.process_time(), time.perf_counter()
        learner_cpu0 = ds.thread_cpu_s(getattr(thread, "native_id", None))
        idle, allreduce = [], []
        t_end = time.monotonic() + args.seconds
        while time.monotonic() < t_end:
            r = algo.train()
            if "learner_idle_fraction" in r:
                idle.append(r["learner_idle_fraction"])
            if "learner_allreduce_ms" in r:
                allreduce.append(r["learner_allreduce_ms"])
        wall = time.perf_counter() - wall0
        trained = algo.counters["env_steps_trained"] - steps0
        driver_cpu = time.process_time() - cpu0 - (ds.thread_cpu_s(getattr(thread, "native_id", None)) - learner_cpu0)
        out = {
            "num_learners": num_learners,
            "torch_threads": torch_threads,
            "seconds": round(wall, 1),
            "trained_rows_per_s": round(trained / wall, 1),
            "learner_busy_fraction": round(1.0 - sum(idle) / len(idle), 3) if idle else None,
            "allreduce_ms": round(allreduce[-1], 2) if allreduce else None,
            "driver_cpu_fraction": round(driver_cpu / wall, 3),
            "learner_batches_lost": r.get("num_learner_batches_lost", 0),
            "learner_regroups": r.get("num_learner_regroups", 0),
        }
        log(json.dumps(out))
        return out
    finally:
        algo.stop()
        for h in hosts:
            ray.kill(h)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--learners", default="1,2", help="learner counts to run, e.g. 1,2")
    p.add_argument("--shape", choices=sorted(ds.SHAPES), default="pong")
    p.add_argument("--seconds", type=float, default=60.0, help="measured seconds per run")
    p.add_argument("--warmup-s", type=float, default=25.0)
    p.add_argument("--train-batch-size", type=int, default=512, help="rows per update, split over the learners")
    p.add_argument("--envs", type=int, default=4, help="envs per (virtual) rollout actor: rows per fragment / 32")
    p.add_argument("--broadcast-interval", type=int, default=1, help="learner updates between weight broadcasts")
    p.add_argument("--actors", type=int, default=8, help="virtual rollout actors")
    p.add_argument("--rate", type=float, default=60.0, help="fragments/s the actors offer at most")
    p.add_argument("--gpus", type=float, default=0.0, help="GPUs for the learners (a GPU machine): 0 trains on CPU")
    p.add_argument(
        "--no-same-threads",
        action="store_true",
        help="skip the fair baseline: one learner allowed as many torch threads as K learners have in all",
    )
    args = p.parse_args()

    import torch

    torch.set_num_threads(1)
    from shoal import runtime
    from shoal.batch import Col

    here = str(Path(__file__).resolve().parent)  # Ray's workers import driver_scaling's host class
    os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (here, os.environ.get("PYTHONPATH")) if x)
    runtime.start(num_cpus=2)
    result = sample_once(args)
    log(f"fragments of {len(result[0][Col.ACTIONS])} rows ({args.shape})")
    counts = [int(x) for x in args.learners.split(",") if x.strip()]
    runs = [run_one(args, k, result) for k in counts]
    by_k = {r["num_learners"]: r for r in runs}
    summary: dict[str, Any] = {}
    for k in counts:
        if k != 1 and 1 in by_k:
            summary[f"speedup_{k}_vs_1"] = round(
                by_k[k]["trained_rows_per_s"] / max(by_k[1]["trained_rows_per_s"], 1e-9), 2
            )
    # The fair baseline: one learner with as many torch threads as the K learners have together
    # (K processes x 1 thread), so a speedup is not only "K processes use K cores". Off a GPU only.
    if not args.no_same_threads and not args.gpus and 1 in by_k:
        for k in counts:
            if k > 1:
                same = run_one(args, 1, result, torch_threads=k)
                runs.append(same)
                summary[f"speedup_{k}_vs_1_same_threads"] = round(
                    by_k[k]["trained_rows_per_s"] / max(same["trained_rows_per_s"], 1e-9), 2
                )
    print(
        json.dumps(
            {
                "benchmark": "learner_group",
                "algo": "appo",
                "shape": args.shape,
                "actors": "virtual (pre-built fragments)",
                "train_batch_size": args.train_batch_size,
                "gpus": args.gpus,
                "device": torch.cuda.get_device_name(0) if args.gpus else "cpu",
                "rows_per_fragment": 32 * args.envs,
                **summary,
                "runs": runs,
            }
        )
    )
    runtime.shutdown()


if __name__ == "__main__":
    main()
