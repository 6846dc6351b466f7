"""How one driver scales with its rollout actors, by simulation: 8 to 256 synthetic actors.

    python benchmarks/driver_scaling.py [--algos impala,appo,ppo,apex] [--actors 8,32,128,256]
                                        [--shape pong|cartpole] [--rate 100] [--seconds 20]
                                        [--learner-rate 25000] [--png driver_scaling.png]
                                        [--envs 1] [--learners 1]

The real drivers of IMPALA, APPO, PPO and Ape-X (their training step, actor group, pipeline,
weight broadcasts and, for Ape-X, real replay shards (``--shards``), unchanged) run against *virtual*
rollout actors: a few host processes (Ray actors) each stand in for many actors and answer
every ``sample`` request (Ape-X: ``sample_into_replay``) with one pre-built fragment
(a real one, sampled once from the env at the start: Pong-shaped uint8 rows at 84x84, or
CartPole rows), paced so that all actors together offer ``--rate`` fragments per second
whatever their number. No env steps and no inference run in them. The learner is a stub that
consumes ``--learner-rate`` rows per second (``--real-learner`` trains the real network
instead), so the machine's two cores go to the driver and the hosts.

With the offered rate fixed, what changes with the number of actors is only the driver's
bookkeeping: anything it does per actor on every step or every fragment shows as driver CPU
per fragment growing with N. Per algorithm and N it reports fragments/s and bytes/s taken in,
the driver's CPU per fragment (its process's CPU time less the learner thread's), the weight
broadcasts (``set_weights`` calls the actors received per fragment, and driver seconds per
broadcast), the learner's busy fraction, and requests/batches dropped. From the driver's CPU
per fragment at 256 actors it projects how many real Pong actors one driver core can feed
(a real actor: ``--actor-fragments-per-s``, default one core's measured Pong rate) and whether
one driver keeps up with a learner consuming ``--learner-rate`` rows per second (an assumed
GPU learner: stated in the JSON, not measured).

``--envs E`` gives each actor E envs, so a fragment holds E x 32 rows (one request, E times the
data). ``--learners K`` (IMPALA, APPO) runs them with a learner group of K learner processes
(stubs too, consuming ``--learner-rate`` between them): fragments then reach the learners by
object reference and the driver handles only references and metrics.

The last stdout line is one JSON object with, per algorithm, ``<algo>_cpu_per_fragment_ratio_256_vs_8``
(the target: <= 1.5) and the table of runs; ``--png`` draws CPU per fragment against N.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = {
    # the env and network of each shape: Pong at 84x84 with the Nature CNN (6.4 MB of weights)
    "pong": {"env": "ALE/Pong-v5", "model": {"torso": "nature_cnn"}},
    "cartpole": {"env": "CartPole-v1", "model": {"hiddens": [64, 64]}},
}
# One real Pong rollout actor on one core of this machine: ~2.5k env steps/s stepping alone,
# ~4k/s of Nature-CNN inference; both in one process about 1.5k steps/s, 47 fragments of 32.
REAL_PONG_FRAGMENTS_PER_S = 47.0


def log(msg: str) -> None:
    print(f"[driver_scaling] {msg}", file=sys.stderr, flush=True)


# ---- the synthetic actors ------------------------------------------------------------------------
class FragmentHost:
    """One process standing in for many rollout actors (a Ray actor with concurrent calls).

    ``call(vid, method, ...)`` answers actor ``vid``'s request: ``sample`` returns the pre-built
    fragment with that actor's metrics, no sooner than one ``period_s`` after its previous one;
    every other method (weights, normalizer, global vars) is counted and answered at once."""

    def __init__(self, sample_result: Any, period_s: float) -> None:
        self.batch, self.metrics = sample_result
        self.priorities = self.batch.data.pop("priorities", None)  # Ape-X's initial priorities
        self.period_s = period_s
        self.next_due: dict[int, float] = {}
        self.calls: dict[str, int] = {}
        self.shards: dict[int, list] = {}  # Ape-X: each actor's replay shard proxies

    async def call(self, vid: int, method: str, *args: Any, **kwargs: Any) -> Any:
        self.calls[method] = self.calls.get(method, 0) + 1
        if method == "set_shards":
            self.shards[vid] = list(args[0])
        if method not in ("sample", "sample_into_replay"):
            return None
        now = time.monotonic()
        due = max(now, self.next_due.get(vid, now + (vid * 0.618 % 1.0) * self.period_s))
        self.next_due[vid] = due + self.period_s  # taken before waiting: a second open request waits its turn
        if due > now:
            await asyncio.sleep(due - now)
        m = self.metrics
        metrics = type(m)(env_steps=m.env_steps, worker_index=vid)
        if method == "sample":
            return self.batch, metrics
        shards = self.shards.get(vid)  # Ape-X: the fragment goes to a replay shard, the driver gets metrics
        if shards:
            shards[(vid + int(now * 1000)) % len(shards)].add(self.batch, self.priorities)
        return metrics

    def counts(self) -> dict[str, int]:
        return dict(self.calls)


class VirtualMethod:
    """``handle.method`` of a virtual actor: ``.remote(...)`` calls its host (``.options(num_returns=2)``
    too: a learner group's sample requests leave the fragment in the object store)."""

    def __init__(self, host: Any, vid: int, method: str, opts: dict | None = None) -> None:
        self.host, self.vid, self.method, self.opts = host, vid, method, opts

    def options(self, **opts: Any) -> "VirtualMethod":
        return VirtualMethod(self.host, self.vid, self.method, opts)

    def remote(self, *args: Any, **kwargs: Any):
        call = self.host.call.options(**self.opts) if self.opts else self.host.call
        return call.remote(self.vid, self.method, *args, **kwargs)


class VirtualHandle:
    """What the driver's actor group holds for one virtual actor: ``handle.method.remote(...)``
    becomes ``host.call.remote(vid, "method", ...)``."""

    def __init__(self, host: Any, vid: int) -> None:
        self.host, self.vid = host, vid

    def __getattr__(self, method: str) -> VirtualMethod:
        if method.startswith("__") and method != "__ray_ready__":
            raise AttributeError(method)
        return VirtualMethod(self.host, self.vid, method)


def install_virtual_actors(hosts: list[Any]) -> None:
    """Make the rollout actor group's actors virtual ones on ``hosts`` (round robin)."""
    from shoal.framework import rollout_group as rg
    from shoal.runtime.ray_group import RayActorGroup

    class VirtualGroup(RayActorGroup):
        def _launch(self, i: int):
            return VirtualHandle(hosts[i % len(hosts)], i)

    original = getattr(rg.make_actor_group, "original", rg.make_actor_group)

    def make_group(cls, num_actors, ctor, *, remote, resources=None, max_in_flight=1, name="actor", **kw):
        if not remote:  # the in-process runner that samples the real fragment
            return original(cls, num_actors, ctor, remote=False, max_in_flight=max_in_flight, **kw)
        return VirtualGroup(cls, num_actors, ctor, resources, max_in_flight=max_in_flight, name=name, **kw)

    make_group.original = original  # type: ignore[attr-defined]
    rg.make_actor_group = make_group


# ---- one run -------------------------------------------------------------------------------------
def base_config(
    algo: str, shape: str, num_actors: int, shards: int = 2, learners: int = 1, envs: int = 1
) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "env": SHAPES[shape]["env"],
        "model": SHAPES[shape]["model"],
        "seed": 0,
        "rollout_fragment_length": 32,
        "min_time_s_per_iteration": 1.0,
        "resources": {"num_workers": num_actors, "num_envs_per_worker": envs, "num_cpus_per_worker": 0.001},
    }
    if algo in ("impala", "appo"):
        cfg["train_batch_size"] = 256 * envs  # 8 fragments per learner update
        if learners > 1:  # a learner group: fragments go to the learners by reference
            cfg["resources"].update(num_learners=learners, num_cpus_per_learner=0.001)
    elif algo == "apex":  # fragments go to the replay shards; replayed batches of 64 come back through the driver
        cfg.update(replay_capacity=20_000, learning_starts=2_000, train_batch_size=64)
        cfg["resources"].update(num_replay_shards=shards, replay_shard_cpus=0.5 / shards)
        cfg["model"] = {"torso": "nature_cnn"} if shape == "pong" else {"hiddens": [64, 64]}
    else:  # ppo: one fragment from every actor per iteration
        cfg.update(train_batch_size=32 * num_actors, minibatch_size=min(256, 32 * num_actors), num_sgd_iter=1)
    return cfg


def sample_once(algo_name: str, shape: str, envs: int = 1) -> Any:
    """One real (fragment, metrics) of this algorithm's rollout actors, from the env in-process."""
    from shoal.algorithms import get_config_class

    cfg = base_config(algo_name, shape, 1)
    cfg["resources"] = {"num_workers": 0, "num_envs_per_worker": envs}
    algo = get_config_class(algo_name)(**cfg).build()
    try:
        group = algo.env_runners.start()
        return group.call(0, "sample")
    finally:
        algo.stop()


def stub_learners(algo, rows_per_s: float) -> None:
    """Each policy learner consumes a minibatch in rows / ``rows_per_s`` seconds, training nothing."""
    import torch

    def update_minibatch(tensors):
        rows = len(next(iter(tensors.values())))
        time.sleep(rows / rows_per_s)
        return {"td_error": torch.ones(rows)}  # what Ape-X's priority update reads

    for _, pl in algo.policies:
        pl.learner.update_minibatch = update_minibatch


def stub_group_learners(rows_per_s: float) -> None:
    """A learner group's learner processes (``--learners`` > 1) consume ``rows_per_s`` rows a second
    between them, training nothing (so they never all-reduce): they still read every fragment
    from the object store and join them into batches, as the real ones do."""
    from shoal.framework import pipeline
    from shoal.framework.learner_group import GroupLearner

    class StubGroupLearner(GroupLearner):
        def __init__(self, config, *args: Any, **kwargs: Any) -> None:
            super().__init__(config, *args, **kwargs)
            share = rows_per_s / config.resources.num_learners

            def update_minibatch(tensors):
                time.sleep(len(next(iter(tensors.values()))) / share)
                return {}

            self.learner.update_minibatch = update_minibatch

    pipeline.GroupLearner = StubGroupLearner  # type: ignore[misc]


def thread_cpu_s(native_id: int | None) -> float:
    if native_id is None:
        return 0.0
    try:
        with open(f"/proc/self/task/{native_id}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def run_one(algo_name: str, n: int, args, sample_result, bytes_per_fragment: int) -> dict[str, Any]:
    import ray

    from shoal.algorithms import get_config_class
    from shoal.batch import Col

    rows = len(sample_result[0][Col.ACTIONS])
    period = n / args.rate  # each actor's seconds between fragments: all together offer --rate/s
    num_hosts = max(1, min(args.hosts, n))
    remote_host = ray.remote(FragmentHost).options(num_cpus=0.001, max_concurrency=max(64, 4 * n))
    shared = ray.put(sample_result)
    hosts = [remote_host.remote(shared, period) for _ in range(num_hosts)]
    ray.get([h.counts.remote() for h in hosts])
    install_virtual_actors(hosts)
    learners = args.learners if algo_name in ("impala", "appo") else 1
    if learners > 1 and not args.real_learner:
        stub_group_learners(args.learner_rate)
    algo = get_config_class(algo_name)(
        **base_config(algo_name, args.shape, n, args.shards, learners, args.envs)
    ).build()
    try:
        if not args.real_learner:
            stub_learners(algo, args.learner_rate)
        # the learner thread, whose CPU is not the driver's: IMPALA's and APPO's pipeline's, Ape-X's own
        thread = algo.pipeline.thread if hasattr(algo, "pipeline") else getattr(algo, "learner_thread", None)
        t_end = time.monotonic() + args.warmup_s
        while time.monotonic() < t_end:
            algo.train()
        before = {
            "steps": algo.counters["env_steps_sampled"],
            "cpu": time.process_time(),
            "learner_cpu": thread_cpu_s(getattr(thread, "native_id", None)),
            "wall": time.perf_counter(),
            "calls": _sum_counts(ray.get([h.counts.remote() for h in hosts])),
            "dropped": algo.env_runners.num_dropped_requests,
            "batches_dropped": getattr(thread, "num_dropped", 0) if thread else 0,
        }
        sync_s, broadcasts = 0.0, 0
        original = algo.broadcast_weights

        def timed_broadcast(*a, **k):
            nonlocal sync_s, broadcasts
            t0 = time.perf_counter()
            original(*a, **k)
            sync_s += time.perf_counter() - t0
            broadcasts += 1

        algo.broadcast_weights = timed_broadcast
        t_end, idle = time.monotonic() + args.seconds, []
        profile = None
        if args.profile:
            import cProfile

            profile = cProfile.Profile()
            profile.enable()
        while time.monotonic() < t_end:
            r = algo.train()
            if "learner_idle_fraction" in r:  # over the iteration
                idle.append(r["learner_idle_fraction"])
            elif r.get("learner_busy_fraction") is not None:  # Ape-X's
                idle.append(1.0 - r["learner_busy_fraction"])
        if profile is not None:
            import io
            import pstats

            profile.disable()
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
            log(f"{algo_name} with {n} actors, the driver's main thread by own time:\n{text.getvalue()}")
        wall = time.perf_counter() - before["wall"]
        busy = 1.0 - float(np.mean(idle)) if idle else None
        learner_cpu = thread_cpu_s(getattr(thread, "native_id", None)) - before["learner_cpu"]
        driver_cpu = time.process_time() - before["cpu"] - learner_cpu
        calls = _sum_counts(ray.get([h.counts.remote() for h in hosts]))
        fragments = (algo.counters["env_steps_sampled"] - before["steps"]) / rows
        weight_calls = calls.get("set_weights", 0) - before["calls"].get("set_weights", 0)
        out = {
            "algo": algo_name,
            "actors": n,
            "hosts": num_hosts,
            "seconds": round(wall, 1),
            "offered_fragments_per_s": args.rate,
            "fragments_per_s": round(fragments / wall, 1),
            "mb_per_s": round(fragments * bytes_per_fragment / wall / 1e6, 1),
            "driver_cpu_ms_per_fragment": round(1000 * driver_cpu / max(fragments, 1), 3),
            "driver_cpu_fraction": round(driver_cpu / wall, 3),
            "weight_calls_per_fragment": round(weight_calls / max(fragments, 1), 2),
            "broadcasts": broadcasts,
            "ms_per_broadcast": round(1000 * sync_s / broadcasts, 2) if broadcasts else None,
            "learner_busy_fraction": None if busy is None else round(busy, 3),
            "requests_dropped": algo.env_runners.num_dropped_requests - before["dropped"],
            "batches_dropped": (getattr(thread, "num_dropped", 0) - before["batches_dropped"]) if thread else 0,
        }
        log(json.dumps(out))
        return out
    finally:
        algo.stop()
        for h in hosts:
            ray.kill(h)


def _sum_counts(counts: list[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    return total


def draw(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for algo in dict.fromkeys(r["algo"] for r in runs):
        pts = [(r["actors"], r["driver_cpu_ms_per_fragment"]) for r in runs if r["algo"] == algo]
        ax.plot(*zip(*pts), marker="o", label=algo)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rollout actors (virtual)")
    ax.set_ylabel("driver CPU per fragment (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title("One driver, a fixed offered rate, more actors")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    log(f"plot: {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algos", default="impala,appo,ppo,apex")
    p.add_argument("--actors", default="8,32,128,256")
    p.add_argument("--shape", choices=sorted(SHAPES), default="pong")
    p.add_argument("--rate", type=float, default=100.0, help="fragments/s all actors together offer")
    p.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run")
    p.add_argument("--warmup-s", type=float, default=5.0)
    p.add_argument("--hosts", type=int, default=2, help="processes the virtual actors live in")
    p.add_argument("--shards", type=int, default=2, help="Ape-X's replay shards (real ones)")
    p.add_argument("--learner-rate", type=float, default=25000.0, help="rows/s the stub learner consumes")
    p.add_argument("--envs", type=int, default=1, help="envs per actor: a fragment is 32 steps of each")
    p.add_argument(
        "--learners",
        type=int,
        default=1,
        help="IMPALA/APPO: resources.num_learners; above 1 a learner group takes the fragments by reference",
    )
    p.add_argument("--real-learner", action="store_true", help="train the real network instead of the stub")
    p.add_argument("--actor-fragments-per-s", type=float, default=REAL_PONG_FRAGMENTS_PER_S)
    p.add_argument("--png", type=Path, default=None)
    p.add_argument("--profile", action="store_true", help="print where the driver's main thread spends its time")
    args = p.parse_args()

    import torch

    torch.set_num_threads(1)
    from shoal import runtime
    from shoal.batch import Col

    runtime.start(num_cpus=2)
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    sizes = [int(x) for x in args.actors.split(",")]
    runs: list[dict] = []
    summary: dict[str, Any] = {}
    for algo in algos:
        result = sample_once(algo, args.shape, args.envs)
        batch = result[0]
        bytes_per_fragment = sum(np.asarray(batch[k]).nbytes for k in batch.keys())
        log(f"{algo}: fragments of {len(batch[Col.ACTIONS])} rows, {bytes_per_fragment:,} bytes")
        algo_runs = [run_one(algo, n, args, result, bytes_per_fragment) for n in sizes]
        runs += algo_runs
        by_n = {r["actors"]: r for r in algo_runs}
        lo, hi = min(sizes), max(sizes)
        ratio = by_n[hi]["driver_cpu_ms_per_fragment"] / max(by_n[lo]["driver_cpu_ms_per_fragment"], 1e-9)
        summary[f"{algo}_cpu_per_fragment_ratio_{hi}_vs_{lo}"] = round(ratio, 2)
        per_fragment_s = by_n[hi]["driver_cpu_ms_per_fragment"] / 1000
        capacity = 1.0 / per_fragment_s if per_fragment_s > 0 else float("inf")  # fragments/s per driver core
        summary[f"{algo}_driver_fragments_per_s_per_core_at_{hi}"] = round(capacity, 1)
        # a real actor makes --actor-fragments-per-s fragments of 32 steps of one env: with --envs
        # per actor its fragments are that many times longer and come that many times less often
        summary[f"{algo}_projected_real_pong_actors"] = int(capacity * args.envs / args.actor_fragments_per_s)
        rows = len(batch[Col.ACTIONS])
        summary[f"{algo}_keeps_up_with_learner_at_{hi}"] = bool(capacity * rows >= args.learner_rate)
    if args.png:
        draw(runs, args.png)
    print(
        json.dumps(
            {
                "benchmark": "driver_scaling",
                "shape": args.shape,
                "offered_fragments_per_s": args.rate,
                "assumed_learner_rows_per_s": args.learner_rate,
                "num_learners": args.learners,
                "envs_per_actor": args.envs,
                "assumed_real_actor_fragments_per_s": args.actor_fragments_per_s,
                **summary,
                "runs": runs,
            }
        )
    )
    runtime.shutdown()


if __name__ == "__main__":
    main()
