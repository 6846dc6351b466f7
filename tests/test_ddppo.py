"""DD-PPO: config rules, the gradient all-reduce, identical replicas, learning, kill-and-continue."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from shoal.algorithms.ddppo import DDPPO, DDPPOConfig, DDPPOWorker
from shoal.config import load_yaml
from shoal.errors import ConfigError
from shoal.learn.distributed import flatten_grads, free_port, unflatten_grads_
from shoal.learn.stats import mean_stats
from shoal.learn.threads import LearnerResult

PRESET = Path(__file__).resolve().parents[1] / "examples" / "ddppo_cartpole.yaml"
# Small rounds for the integration tests: 2 workers x 4 envs x 32 steps, 2 minibatches, 2 epochs.
SMALL = dict(
    env="CartPole-v1",
    rollout_fragment_length=32,
    minibatch_size=64,
    num_sgd_iter=2,
    torch_distributed_timeout_s=10,
    resources={"num_workers": 2, "num_envs_per_worker": 4},
)


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def _optimizer_equal(a: dict, b: dict) -> bool:
    sa, sb = a["state"], b["state"]
    return sa.keys() == sb.keys() and all(torch.equal(sa[k][n], sb[k][n]) for k in sa for n in sa[k])


# ---- config rules: each a clear error before any actor starts --------------------------------
@pytest.mark.parametrize(
    "overrides, key, allowed",
    [
        ({"resources": {"num_workers": 0}}, "resources.num_workers", "num_workers >= 1"),
        ({"torch_distributed_backend": "tcp"}, "torch_distributed_backend", "gloo, nccl, mpi"),
        ({"resources": {"num_gpus": 1}}, "resources.num_gpus", "num_gpus_per_worker"),
        ({"batch_mode": "complete_episodes"}, "batch_mode", "truncate_episodes"),
        ({"use_kl_loss": True}, "use_kl_loss", "central learner"),
        ({"train_batch_size": 4096}, "train_batch_size", "rollout_fragment_length x resources.num_envs_per_worker"),
        ({"rollout_fragment_length": "auto"}, "rollout_fragment_length", "integer"),
        ({"minibatch_size": 4096}, "minibatch_size", "= 512"),
        ({"collective_wait": "busy"}, "collective_wait", "auto, spin, block"),
    ],
)
def test_config_rules_fail_naming_the_key(overrides, key, allowed):
    with pytest.raises(ConfigError) as info:
        DDPPOConfig(env="CartPole-v1", **overrides)
    msg = str(info.value)
    assert key in msg and allowed in msg, msg


def test_backends_torch_lacks_and_nccl_without_gpus_are_refused():
    import torch.distributed as dist

    if not dist.is_mpi_available():
        with pytest.raises(ConfigError, match="no 'mpi' backend"):
            DDPPOConfig(env="CartPole-v1", torch_distributed_backend="mpi")
    with pytest.raises(ConfigError, match="nccl"):
        DDPPOConfig(env="CartPole-v1", torch_distributed_backend="nccl")


def test_nccl_with_workers_sharing_a_gpu_is_refused(monkeypatch):
    # two ranks on one GPU: NCCL's "invalid usage" on the first GPU run, refused before any actor starts
    # (this torch may lack nccl: pretend it has it so the rule itself is reached)
    monkeypatch.setattr("shoal.algorithms.ddppo.backend_available", lambda name: True)
    with pytest.raises(ConfigError, match="whole GPU"):
        DDPPOConfig(env="CartPole-v1", torch_distributed_backend="nccl", resources={"num_gpus_per_worker": 0.5})
    one = DDPPOConfig(
        env="CartPole-v1", torch_distributed_backend="nccl", resources={"num_workers": 1, "num_gpus_per_worker": 0.5}
    )
    assert one.resources.num_workers == 1  # a single rank cannot collide with itself


def test_config_rules_also_hold_on_assignment():
    cfg = DDPPOConfig(env="CartPole-v1")
    with pytest.raises(ConfigError, match="num_workers >= 1"):
        cfg.resources.num_workers = 0
    with pytest.raises(ConfigError, match="use_kl_loss"):
        cfg.use_kl_loss = True
    assert cfg.resources.num_workers == 2 and "use_kl_loss" not in cfg.to_dict()  # refused, never set


def test_config_defaults_derive_the_batch_and_round_trip():
    cfg = DDPPOConfig(env="CartPole-v1", rollout_fragment_length=50, resources={"num_envs_per_worker": 6})
    assert cfg.worker_batch_size() == 300
    assert cfg.torch_distributed_backend == "gloo" and cfg.keep_local_weights_in_sync
    assert cfg.resources.num_workers == 2 and cfg.resources.num_gpus == 0
    d = cfg.to_dict()
    assert "train_batch_size" not in d  # derived, so never written back as if it were set
    assert DDPPOConfig.from_dict(d) == cfg
    preset = load_yaml(PRESET)
    preset.pop("stop")
    assert DDPPOConfig.from_dict(preset).worker_batch_size() == 128 * 64  # envs x fragment per worker


# ---- the gradient all-reduce -----------------------------------------------------------------
def test_flatten_and_unflatten_grads_keep_the_layout_and_fill_missing_grads_with_zeros():
    a = torch.nn.Parameter(torch.zeros(2, 3))
    b = torch.nn.Parameter(torch.zeros(4))
    a.grad = torch.arange(6.0).reshape(2, 3)
    flat = flatten_grads([a, b])
    assert flat.tolist() == [0, 1, 2, 3, 4, 5, 0, 0, 0, 0]
    unflatten_grads_([a, b], torch.arange(10.0) * 2)
    assert a.grad.tolist() == [[0, 2, 4], [6, 8, 10]]
    assert b.grad.tolist() == [12, 14, 16, 18]
    with pytest.raises(ValueError, match="11 elements"):
        unflatten_grads_([a, b], torch.zeros(11))


def test_a_fixed_minibatch_count_splits_any_batch_into_that_many_steps():
    from shoal.batch import Batch
    from shoal.learn import Learner

    sizes = []

    def loss(module, batch, learner):
        sizes.append(len(batch["x"]))
        return (module.weight * batch["x"]).sum(), {}

    learner = Learner(torch.nn.Linear(1, 1, bias=False), loss, lr=0.1)
    rng = np.random.default_rng(0)
    learner.update(Batch({"x": np.ones((10, 1), np.float32)}), 2, 4, rng, num_minibatches=4)
    assert sizes == [3, 3, 2, 2] * 2 and learner.num_updates == 8
    sizes.clear()
    learner.update(Batch({"x": np.ones((3, 1), np.float32)}), 1, 4, rng, num_minibatches=4)
    assert sizes == [2, 2, 1, 1]  # fewer rows than minibatches: rows repeat, no step is skipped
    sizes.clear()
    learner.update(
        Batch({"x": np.ones((10, 1), np.float32)}), 1, 4, rng
    )  # the default: full minibatches, then the rest
    assert sizes == [4, 4, 2]


def _spawn(target, world: int, *args):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, out)) for r in range(world)]
    for p in procs:
        p.start()
    return procs, out


@pytest.mark.parametrize("spin", [False, True], ids=["block", "spin"])
def test_all_reduce_averages_gradients_over_two_processes(spin):
    import ddppo_helpers

    # loss_r = sum(w * x_r): rank 0's gradient is [1, 2], rank 1's [3, 6]; the mean is [2, 4].
    procs, out = _spawn(ddppo_helpers.reduce_rank, 2, [[1.0, 2.0], [3.0, 6.0]], spin)
    results = sorted(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    (_, g0, w0, n0), (_, g1, w1, n1) = results
    assert g0 == g1 == [[2.0, 4.0]]
    # Adam's first step moves each weight by lr * sign(grad): [0.5, -0.5] - 0.1 = [0.4, -0.6] on both ranks.
    assert w0 == w1
    assert np.allclose(w0, [[0.4, -0.6]], atol=1e-4)
    assert n0 == n1 == 1


def test_a_nan_gradient_on_one_rank_is_skipped_by_every_rank():
    import ddppo_helpers

    # rank 0's input holds a NaN: the all-reduced gradient is [nan, 4] on both ranks, and both skip the step
    procs, out = _spawn(ddppo_helpers.reduce_rank, 2, [[float("nan"), 2.0], [3.0, 6.0]], False)
    results = sorted(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    (_, g0, w0, _), (_, g1, w1, _) = results
    assert np.isnan(g0[0][0]) and np.isnan(g1[0][0]) and g0[0][1] == g1[0][1] == 4.0
    assert w0 == w1 == [[0.5, -0.5]]  # the weights stay equal, and as they were


@pytest.mark.parametrize("spin", [False, True], ids=["block", "spin"])
def test_a_dead_peer_makes_the_all_reduce_fail_fast_with_a_collective_error(spin):
    import ddppo_helpers

    procs, out = _spawn(ddppo_helpers.dying_peer_rank, 2, spin)
    kind, elapsed, *msg = out.get(timeout=60)
    for p in procs:
        p.join(timeout=30)
    assert kind == "CollectiveError", (kind, msg)
    assert elapsed < 9  # well inside the 10 s group timeout: the closed socket is noticed at once


def test_worker_in_process_samples_trains_and_hands_over_its_state():
    cfg = DDPPOConfig(**{**SMALL, "resources": {"num_workers": 1, "num_envs_per_worker": 4}}, seed=0)
    a, b = DDPPOWorker(cfg, 1), DDPPOWorker(cfg, 2)
    try:
        before = a.get_weights()
        r = a.sample_and_train()  # no process group: a group of one
        learned = r.learned
        assert isinstance(learned, LearnerResult) and learned.env_steps == r.metrics.env_steps > 100
        assert learned.agent_steps == learned.env_steps and r.rounds == 1
        assert learned.weights is None  # only rank 0 of a group returns weights
        assert not _equal(before, a.get_weights())
        assert _equal(a.runner.get_weights(), a.get_weights())  # the sampler acts with the new weights
        assert learned.stats["allreduce_ms_per_minibatch"] == 0.0 and a.rounds == 1
        # Reset steps shorten the batch below 4 x 32, yet the minibatch count is fixed: 2 epochs x 2.
        assert cfg.num_minibatches() == 2 and a.learner.num_updates == 4
        b.set_sync_state(a.get_sync_state())
        assert _equal(a.get_weights(), b.get_weights()) and _equal(b.runner.get_weights(), b.get_weights())
        assert _optimizer_equal(a.get_optimizer_state(), b.get_optimizer_state()) and b.rounds == 1
    finally:
        a.stop()
        b.stop()


def test_mean_stats_averages_each_key_over_the_workers_that_report_it():
    assert mean_stats([{"a": 1.0, "b": 4.0}, {"a": 3.0}]) == {"a": 2.0, "b": 4.0}
    assert mean_stats([]) == {}


def test_workers_poll_for_the_all_reduce_only_with_a_cpu_of_their_own():
    cfg = DDPPOConfig(env="CartPole-v1")  # gloo, 1 CPU per worker
    assert cfg.collective_wait == "auto" and cfg.spin_wait()
    assert not DDPPOConfig(env="CartPole-v1", resources={"num_cpus_per_worker": 0.5}).spin_wait()
    assert not DDPPOConfig(env="CartPole-v1", collective_wait="block").spin_wait()
    assert DDPPOConfig(env="CartPole-v1", collective_wait="spin", resources={"num_cpus_per_worker": 0.5}).spin_wait()
    worker = DDPPOWorker(DDPPOConfig(**{**SMALL, "resources": {"num_workers": 1, "num_envs_per_worker": 4}}), 1)
    try:
        assert worker.learner.spin_wait  # the config reaches the learner
    finally:
        worker.stop()


# ---- on local Ray ------------------------------------------------------------------------------
@pytest.mark.ray
def test_replicas_stay_identical_and_a_checkpoint_restores_them(ray_cluster, tmp_path):
    from shoal.framework.base import Algorithm

    # The save below happens while the first worker waits in its all-reduce for the second. SMALL's 10 s
    # collective timeout is for the tests where a peer dies. In one make test (2026-11-29) a round after
    # the save failed ("connection closed by peer"); 6 runs alone or beside two busy loops passed, so the
    # cause was not isolated, and the 10 s wait under load is the suspect. A save that never lets the
    # second worker in still fails the round, after 60 s.
    algo = DDPPOConfig(**{**SMALL, "torch_distributed_timeout_s": 60}, seed=1).build()
    try:
        assert algo.env_runners is None  # workers start with the first training step
        for _ in range(3):
            r = algo.train()
        assert r["world_size"] == 2 and r["num_regroups"] == 0
        # The driver gathers what has finished without waiting for a straggler, so an iteration may hold one
        # worker's round (4 envs x 32 steps, a little fewer after resets) or both: at least 3 rounds' worth.
        assert r["env_steps_trained"] == r["env_steps_sampled"] >= 3 * 100
        assert r["allreduce_ms_per_minibatch"] > 0
        weights = algo.env_runners.foreach("get_weights")
        optim = algo.env_runners.foreach("get_optimizer_state")
        assert len(weights) == 2
        assert _equal(weights[0], weights[1])  # compared exactly, tensor by tensor
        assert _optimizer_equal(optim[0], optim[1])
        assert _equal(algo.get_weights(), weights[0])  # the driver's copy (keep_local_weights_in_sync)
        # The awkward moment for a save: the first worker is mid-round, waiting in its all-reduce for a
        # peer that has no round yet (the driver has not sent it the next one).
        group = algo.env_runners
        first, second = sorted(group.actor_ids)
        while group.num_in_flight():
            group.fetch_ready(timeout_s=1.0)
        rounds = group.foreach("get_sync_state", actor_ids=[second])[0]["rounds"]
        assert rounds >= 2 and algo.rounds <= rounds  # 3 iterations are 2 or 3 group rounds (no waiting for stragglers)
        group.submit("sample_and_train", actor_ids=[first])
        path = algo.save(tmp_path / "ckpt")  # answered by the worker that is not mid-round
        for _ in range(2):
            r = algo.train()
        assert r["num_failed_rounds"] == 0 and r["num_regroups"] == 0  # no round ran into the collective timeout
    finally:
        algo.stop()
    restored = Algorithm.from_checkpoint(path)
    try:
        assert isinstance(restored, DDPPO) and restored.env_runners is None
        assert _equal(restored.get_weights(), weights[0]) and restored.rounds == rounds
        assert restored.evaluate(num_episodes=2)["num_episodes"] == 2
        assert restored.env_runners is None  # evaluating started no worker
        restored.train()  # the workers start from the checkpoint's learner state
        state = restored.env_runners.foreach("get_sync_state")[0]
        assert (
            state["rounds"] == rounds + 1 and state["learner"]["num_updates"] == (rounds + 1) * 2 * 2
        )  # rounds x epochs x minibatches
    finally:
        restored.stop()


@pytest.mark.ray
def test_a_worker_killed_mid_round_is_replaced_and_the_new_group_trains_on(ray_cluster):
    import ray

    algo = DDPPOConfig(**{**SMALL, "num_sgd_iter": 100}, seed=2).build()  # long rounds: the kill lands mid-round
    try:
        algo.train()
        victim = algo.env_runners.actors[2]
        killer = threading.Timer(0.3, lambda: ray.kill(victim, no_restart=True))
        killer.start()
        t0 = time.perf_counter()
        results = [algo.train() for _ in range(4)]
        killer.join()
        last = results[-1]
        assert last["num_worker_restarts"] == 1 and last["num_regroups"] == 1
        assert last["num_failed_rounds"] >= 1  # the survivor's all-reduce failed; its round was dropped
        assert time.perf_counter() - t0 < 60  # survivors noticed fast, not after a 30-minute default timeout
        assert algo.env_runners.actors[2] is not victim
        # Training goes on with both members: a later round trains both workers' batches (how many
        # rounds the regroup takes depends on when the kill lands, so a few are allowed)
        both = False
        for _ in range(6):
            before = algo.counters["env_steps_trained"]
            r = algo.train()
            if r["env_steps_trained"] - before > 200 and r["world_size"] == 2:
                both = True
                break
        assert both, "no round trained both workers' batches after the regroup"
        weights = algo.env_runners.foreach("get_weights")
        optim = algo.env_runners.foreach("get_optimizer_state")
        assert _equal(weights[0], weights[1]) and _optimizer_equal(optim[0], optim[1])
        assert _equal(algo.get_weights(), weights[0])
    finally:
        algo.stop()


@pytest.mark.ray
@pytest.mark.learning
def test_two_workers_learn_cartpole_with_the_preset(ray_cluster):
    from shoal.app.trainer import train

    data = load_yaml(PRESET)
    data.pop("stop")
    config = DDPPOConfig.from_dict({**data, "seed": 0})
    assert config.resources.num_workers == 2
    # The preset reaches 450 in ~10 s of training (~180k steps) on a 2-core machine shared with
    # a few other jobs; 400 within 90 s leaves room for a much busier one.
    summary = train(config, {"reward": 400, "time_s": 90}, out=None, progress=False)
    assert summary.solved, (
        f"not solved: best mean return {summary.best_return:.1f} after {summary.result['env_steps_sampled']} steps"
    )
    assert summary.result["episode_return_mean"] >= 400
