"""The learner group's union-batch step, outside Ray: fragments with reset rows, one SGD step of a
learner, and a process target that takes that step as one rank of a gloo group (importable, so
torch.multiprocessing can spawn it)."""

from __future__ import annotations

import numpy as np
import torch

from shoal.batch import Batch, Col

# Two learners, 16-step fragments of 2 CartPoles (32 rows): one fragment a learner per round.
GROUP = dict(
    env="CartPole-v1",
    seed=0,
    lr=0.01,
    grad_clip=0.5,
    rollout_fragment_length=16,
    train_batch_size=64,
    normalize_advantages=True,
    resources={
        "num_workers": 2,
        "num_envs_per_worker": 2,
        "num_cpus_per_worker": 0.25,
        "num_learners": 2,
        "num_cpus_per_learner": 0.5,
        "learner_collective_timeout_s": 30,
    },
)


def make_config(algo: str, **extra):
    from shoal.algorithms.appo import APPOConfig
    from shoal.algorithms.impala import IMPALAConfig

    return {"impala": IMPALAConfig, "appo": APPOConfig}[algo](**{**GROUP, **extra})


def spaces(cfg):
    import gymnasium as gym

    env = gym.make(cfg.env)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def fragment(cfg, index: int) -> Batch:
    """Rollout actor ``index``'s first fragment that holds reset rows (``valid`` False, where an env
    restarted): random CartPoles end episodes within a few fragments."""
    from shoal.rollout import ActorCriticPolicy
    from shoal.rollout.env_runner import EnvRunner
    from shoal.rollout.postprocessing import sequence_postprocess

    runner = EnvRunner(cfg, index, ActorCriticPolicy, sequence_postprocess, cfg.fragment_length())
    try:
        for _ in range(20):
            batch, _ = runner.sample()
            if not batch[Col.VALID].all():
                return batch
    finally:
        runner.stop()
    raise AssertionError(f"20 fragments of rollout actor {index} without a reset row")


def uneven_parts(cfg) -> list[Batch]:
    """Two learners' batches with reset rows, unevenly many: sampled fragments (each with at least
    one reset row), the second also masked in the second half of each of its sequences, as if
    its envs had reset there, so it has about half the first's valid rows."""
    a, b = fragment(cfg, 1), fragment(cfg, 2)
    T = cfg.fragment_length()
    valid = b[Col.VALID].copy().reshape(-1, T)
    valid[:, T // 2 :] = False
    b[Col.VALID] = valid.reshape(-1)
    na, nb = int(a[Col.VALID].sum()), int(b[Col.VALID].sum())
    assert na > nb + T // 2, (na, nb)
    return [a, b]


def one_step(learner, batch: Batch | None) -> tuple[np.ndarray, dict]:
    """One SGD step on ``batch`` (None: an empty batch); (the gradient the optimizer got, before any
    clip, flattened; the weights after the step)."""
    from shoal.learn.distributed import flatten_grads

    learner.compute_gradients(batch.to_torch(learner.device) if batch is not None else {})
    learner.reduce_gradients()
    grad = flatten_grads(learner.params).detach().cpu().numpy().copy()
    learner.apply_gradients()
    return grad, learner.get_weights()


def union_rank(rank: int, world: int, port: int, cases: list, out) -> None:
    """One replica of a gloo group: for each case ``(algo, config extras, start state, parts)``, a
    fresh member learner (:class:`~shoal.learn.distributed.UnionBatchLearner`) from the start state
    takes one step on ``parts[rank]`` (None: every fragment lost); put ``(rank, [(grad, weights)])``."""
    from shoal.learn.distributed import UnionBatchLearner, destroy_process_group, init_process_group

    torch.set_num_threads(1)
    init_process_group("gloo", ("127.0.0.1", port), rank, world, timeout_s=30)
    got = []
    try:
        for algo, extra, state, parts in cases:
            cfg = make_config(algo, **extra)
            policy = cfg.algorithm_cls._policy_learner(cfg, *spaces(cfg), None, learner_cls=UnionBatchLearner)
            policy.set_state(state)
            got.append(one_step(policy.learner, parts[rank]))
    finally:
        out.put((rank, got))
        destroy_process_group()
