"""Where the time goes: CPU microseconds per emulator frame of each part of the Atari path.

    python benchmarks/frame_cost.py [--algos appo,impala,apex] [--seconds 20]

For each algorithm the GPU preset (``examples/<algo>_pong_gpu.yaml``) runs in this process with
its rollout actor's envs in the driver (``num_workers: 0``, the preset's envs per actor; learner
devices faked on the CPU), so every part is timed in one place with ``time.thread_time`` (CPU
time of the thread doing the work: waiting for the GIL or for the other core does not count):

- ``env_us``: the vector env's ``step`` (ALE with the preset's preprocessing), timed on its own
  with the process clock after the run (ale-py steps its envs on threads of its own);
- ``inference_us``: the policy's forward passes on the actor (``act`` and the bootstrap);
- ``fragment_us``: the rest of a sample call: buffers, episode bookkeeping, postprocessing
  (V-trace sequences or Ape-X's n-step transitions and initial priorities);
- ``transport_us``: pickling and unpickling the sampled batch with protocol 5 (what Ray's
  object store does for a result, without the copy between processes);
- ``driver_us``: the rest of the driver's training step: cutting train batches and offering
  them to the learner, weight broadcasts, Ape-X's replay requests, priority updates and (here
  in-process) the replay shard's inserts and samples;
- ``learner_host_us``: what a GPU learner's host thread pays per frame: the aten operations one
  update at the preset's shape dispatches (``learner_ops_per_update``, each a kernel launch on a
  GPU) times the CPU cost of one (``learner_host_us_per_op``: a 2-row update, 2 transitions or 2
  sequences of one step, whose arithmetic is negligible, over its own operations), spread over
  the frames one update covers. An estimate: the per-op price is this CPU's, measured on a
  small update; the op count is exact.

Every figure is per emulator frame (agent steps x frame skip 4). ``actor_us`` sums env,
inference and fragment: one core's worth of actor work gives ``1e6 / actor_us`` frames/s.
``driver_frames_per_s`` is what one driver core could hand on (1e6 / (transport + driver)).
Progress goes to stderr; the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

ALGOS = ("appo", "impala", "apex")


def log(msg: str) -> None:
    print(f"[frame_cost] {msg}", file=sys.stderr, flush=True)


class Clock:
    """Adds the calling thread's CPU time spent inside wrapped callables, by part."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}

    def wrap(self, part: str, fn):
        def timed(*args, **kwargs):
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.parts[part] = self.parts.get(part, 0.0) + time.thread_time() - t0

        return timed


def preset(algo: str, envs: int | None = None) -> dict[str, Any]:
    from gpu_bench import preset_path

    from shoal.config import load_yaml

    data = load_yaml(str(preset_path(algo)))
    data.pop("algo")
    data.pop("stop")
    res = dict(data["resources"])
    per_actor = envs or res["num_envs_per_worker"]
    res.update(num_workers=0, num_gpus=0, num_envs_per_worker=per_actor)
    if algo == "apex":
        res.update(num_replay_shards=1, replay_shard_cpus=0.0)
        data["replay_capacity"] = 50_000
        data["learning_starts"] = 2_000
    data["resources"] = res
    if algo in ("appo", "impala"):
        data["fake_devices"] = True
    data["min_time_s_per_iteration"] = 0
    data["seed"] = 0
    return data


def measure_path(algo: str, seconds: float) -> dict[str, Any]:
    """env / inference / fragment / transport / driver CPU time per frame, from an in-process run."""
    from shoal.algorithms import get_config_class

    config = get_config_class(algo)(**preset(algo))
    skip = config.env_preprocessing.frame_skip
    a = config.build()
    clock = Clock()
    try:
        a.train()  # the driver's envs exist once the first step has run
        for r in a.env_runners.start().actors.values():
            r.env.step = clock.wrap("env", r.env.step)
            r.policy.act = clock.wrap("inference", r.policy.act)
            r.policy.bootstrap = clock.wrap("inference", r.policy.bootstrap)
            r.sample = clock.wrap("sample", _transported(r.sample, clock))
        a.training_step = clock.wrap("step", a.training_step)
        calls = {"learn": 0}
        thread = getattr(a, "learner_thread", None)  # Ape-X: its learning thread's own work per update
        if thread is not None:
            learn = clock.wrap("learn_fn", thread.learn_fn)

            def counted(data):
                calls["learn"] += 1
                return learn(data)

            thread.learn_fn = counted
            if getattr(thread, "load_fn", None) is not None:
                thread.load_fn = clock.wrap("load_fn", thread.load_fn)
        t_end = time.monotonic() + seconds
        warm = True
        start = 0
        while time.monotonic() < t_end or warm:
            result = a.train()
            if warm and result.get("env_steps_trained", 0) > 0:  # measure once the learner runs
                warm = False
                clock.parts.clear()
                calls["learn"] = 0
                start = int(result["env_steps_sampled"])
                t_end = time.monotonic() + seconds
        frames = (int(result["env_steps_sampled"]) - start) * skip
        env_us = _env_alone(a, skip)
    finally:
        a.stop()
    p = clock.parts
    us = {k: 1e6 * v / max(frames, 1) for k, v in p.items()}
    sample = us.get("sample", 0.0)
    out = {
        "env_us": env_us,
        "inference_us": us.get("inference", 0.0),
        "fragment_us": sample - us.get("env", 0.0) - us.get("inference", 0.0) - us.get("transport", 0.0),
        "transport_us": us.get("transport", 0.0),
        "driver_us": us.get("step", 0.0) - sample,
        "frames_measured": frames,
    }
    if calls["learn"]:  # Ape-X: CPU per update of the learning thread, and of its loader (if any)
        out["learning_thread_us_per_update"] = 1e6 * p.get("learn_fn", 0.0) / calls["learn"]
        out["loader_us_per_update"] = 1e6 * p.get("load_fn", 0.0) / calls["learn"]
    return out


def _env_alone(a, skip: int, steps: int = 400) -> float:
    """Process CPU time per frame of the driver's vector env stepped alone (random actions) while
    the learner waits: ale-py steps its envs on threads of its own, which a thread clock misses."""
    runner = next(iter(a.env_runners.start().actors.values()))
    env = runner.env
    with _hold(a):
        t0 = time.process_time()
        for _ in range(steps):
            env.step(env.action_space.sample())
        spent = time.process_time() - t0
    return 1e6 * spent / (steps * runner.num_envs * skip)


def _transported(sample, clock: Clock):
    """``sample`` whose batch makes the trip Ray's object store makes (pickle protocol 5), timed apart."""

    def run(*args, **kwargs):
        batch, metrics = sample(*args, **kwargs)
        t0 = time.thread_time()
        buffers: list = []
        data = pickle.dumps(batch, protocol=5, buffer_callback=buffers.append)
        batch = pickle.loads(data, buffers=[b.raw() for b in buffers])
        clock.parts["transport"] = clock.parts.get("transport", 0.0) + time.thread_time() - t0
        return batch, metrics

    return run


def _captured_update(data: dict[str, Any], algo: str):
    """Build ``algo`` from ``data``, train until the learner has seen a batch; (algo, learner, that batch)."""
    from shoal.algorithms import get_config_class

    a = get_config_class(algo)(**data).build()
    learner = a.policies.only.learner
    orig = learner.update_minibatch
    seen: list[dict] = []

    def capture(tensors):
        seen.append({k: v.clone() for k, v in tensors.items()})
        return orig(tensors)

    learner.update_minibatch = capture
    for _ in range(1000):
        a.train()
        if seen:
            break
    learner.update_minibatch = orig
    return a, learner, seen[0]


def _hold(a):
    return a.learner_thread.hold() if hasattr(a, "learner_thread") else a.thread.hold()


def _ops_and_cpu(data: dict[str, Any], algo: str, repeats: int) -> tuple[int, float]:
    """One update's aten ops and its mean CPU seconds (over ``repeats``, after one to warm up), on
    a batch ``algo`` built from ``data`` sampled for its learner."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    a, learner, batch = _captured_update(data, algo)
    try:
        with _hold(a):
            learner.update_minibatch(batch)  # warm
            with Count():
                learner.update_minibatch(batch)
            t0 = time.thread_time()
            for _ in range(repeats):
                learner.update_minibatch(batch)
            return Count.n, (time.thread_time() - t0) / repeats
    finally:
        a.stop()


def measure_learner(algo: str, repeats: int = 20) -> dict[str, Any]:
    """The learner's fixed host cost per update (a 2-row update) and its ops at the preset's shape."""
    data = preset(algo, envs=2)
    rows_per_update = data["train_batch_size"]
    ops, full_update = _ops_and_cpu(data, algo, 3)
    # the same learner on 2-row updates (Ape-X: 2 transitions; V-trace: 2 sequences of 1 step)
    tiny = {**data, "train_batch_size": 2}
    if algo == "apex":
        tiny["learning_starts"] = 64
    else:
        tiny.update(rollout_fragment_length=1, minibatch_buffer_size=1, num_sgd_iter=1)
    small_ops, per_update = _ops_and_cpu(tiny, algo, repeats)
    # frames per learned row: 4 (frame skip) over the times each row is learned (Ape-X: its
    # training intensity; APPO: its passes over each batch)
    passes = data.get("training_intensity", 1.0) if algo == "apex" else data.get("num_sgd_iter", 1)
    frames_per_row = 4 / passes
    # a 2-row update is all overhead: its CPU time per dispatched op prices the ops of a full one
    us_per_op = 1e6 * per_update / small_ops
    host_per_update = us_per_op * ops
    return {
        "learner_host_us_per_op": us_per_op,
        "learner_host_us_per_update": host_per_update,
        "learner_host_us": host_per_update / rows_per_update / frames_per_row,
        "learner_cpu_us_per_update": 1e6 * full_update,
        "learner_ops_per_update": ops,
        "rows_per_update": rows_per_update,
        "updates_per_1k_frames": 1000 / (rows_per_update * frames_per_row),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description="CPU time per emulator frame of each part of the Atari path; one JSON line."
    )
    p.add_argument("--algos", default=",".join(ALGOS))
    p.add_argument("--seconds", type=float, default=20.0, help="measured seconds per algorithm once the learner runs")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    out: dict[str, Any] = {"benchmark": "frame_cost", "torch": torch.__version__, "algos": {}}
    for algo in [x for x in args.algos.split(",") if x]:
        if algo not in ALGOS:
            raise SystemExit(f"frame_cost: algorithms are {', '.join(ALGOS)}; got {algo!r}")
        log(f"{algo}: the path, {args.seconds:g} s")
        path = measure_path(algo, args.seconds)
        log(f"{algo}: the learner's host cost")
        learner = measure_learner(algo)
        r = {**path, **learner}
        r["actor_us"] = r["env_us"] + r["inference_us"] + r["fragment_us"]
        r["actor_frames_per_core_s"] = 1e6 / r["actor_us"] if r["actor_us"] > 0 else None
        r["driver_frames_per_s"] = 1e6 / (r["transport_us"] + r["driver_us"]) if r["driver_us"] > 0 else None
        r["learner_host_frames_per_s"] = 1e6 / r["learner_host_us"] if r["learner_host_us"] > 0 else None
        out["algos"][algo] = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()}
        log(f"{algo}: {out['algos'][algo]}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
