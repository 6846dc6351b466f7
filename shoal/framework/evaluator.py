"""Evaluator: greedy episodes of an algorithm's current weights, beside its training actors.

An algorithm's ``evaluate()`` asks its Evaluator. A single-agent run evaluates on evaluation
actors (``evaluation.evaluation_num_workers`` > 0: Ray actors of their own, started by the first
evaluation, each playing its share of the episodes) or on one runner in the driver (also what
``render`` uses). Each gets the weights and the merged normalizer statistics first. A
``multi_agent`` run plays whole games on a separate runner in the driver and reports the
return summed over agents and per policy.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from shoal.errors import ActorLostError, ConfigError
from shoal.rollout.env_runner import EnvRunner, fragment_to_batch
from shoal.runtime import make_actor_group
from shoal.seeding import EVAL_ACTORS_FIRST_INDEX, EVAL_RUNNER_INDEX

if TYPE_CHECKING:
    from shoal.framework.base import Algorithm


class Evaluator:
    def __init__(self, algo: Algorithm) -> None:
        self.algo = algo
        self.runners: Any = None  # the evaluation actors, started by the first evaluation that needs them
        self.local: EnvRunner | None = None  # the driver's runner: no evaluation actors, or render

    @property
    def num_restarts(self) -> int:
        return self.runners.num_restarts if self.runners is not None else 0

    def evaluate(self, n: int, render: bool = False) -> dict[str, float]:
        algo = self.algo
        if algo.is_multi_agent:
            if render:
                raise ConfigError("rendering is not supported for multi-agent evaluation")
            returns, lengths, windows = algo.evaluation_episodes(n)
            return {
                "episode_return_mean": float(np.mean(returns[:n])),
                "episode_return_std": float(np.std(returns[:n])),
                "episode_len_mean": float(np.mean(lengths[:n])),
                "num_episodes": n,
                **windows.metrics(),
            }
        if algo.config.evaluation.evaluation_num_workers > 0 and not render:
            return self._on_actors(n, algo.get_weights())
        if self.local is None:
            self.local = EnvRunner(algo.config, EVAL_RUNNER_INDEX, algo.policy_cls, fragment_to_batch, 1, num_envs=1)
        self.local.set_weights(algo.get_weights())
        for method, args in algo.normalizer_calls():
            getattr(self.local, method)(*args)
        return self.local.evaluate(n, render=render)

    def _on_actors(self, n: int, weights) -> dict[str, float]:
        """``n`` episodes shared out over the evaluation actors; their figures merged."""
        algo = self.algo
        if self.runners is None:
            self.runners = make_actor_group(
                EnvRunner,
                algo.config.evaluation.evaluation_num_workers,
                lambda i: (
                    (algo.config, EVAL_ACTORS_FIRST_INDEX + i, algo.policy_cls, fragment_to_batch, 1),
                    {"num_envs": 1},
                ),
                remote=True,
                resources=algo.actor_resources("evaluation actor"),
                name="evaluation actor",
                about=f"env {algo.config.env_name()}",
            )
        k = len(self.runners.actor_ids)
        self.runners.foreach("set_weights", self.runners.put(weights), wait=False)
        self.send_normalizer()
        shares = [n // k + (1 if i < n % k else 0) for i in range(k)]
        outs = [self._on(i, s) for i, s in zip(self.runners.actor_ids, shares) if s]
        total = sum(o["num_episodes"] for o in outs)
        mean = sum(o["episode_return_mean"] * o["num_episodes"] for o in outs) / total
        var = (
            sum(
                (o["episode_return_std"] ** 2 + (o["episode_return_mean"] - mean) ** 2) * o["num_episodes"]
                for o in outs
            )
            / total
        )
        return {
            "episode_return_mean": mean,
            "episode_return_std": math.sqrt(var),
            "episode_len_mean": sum(o["episode_len_mean"] * o["num_episodes"] for o in outs) / total,
            "num_episodes": total,
        }

    def _on(self, actor_id: int, num_episodes: int) -> dict[str, Any]:
        """``num_episodes`` on evaluation actor ``actor_id``; again on its replacement each time it
        dies or hangs (the group recreates it, with the weights and normalizer sent again), until
        the restart budget (``resources.max_worker_restarts``) says the failures come too fast."""
        while True:
            try:
                return self.runners.call(actor_id, "evaluate", num_episodes)
            except ActorLostError:
                self.runners.foreach(
                    "set_weights", self.runners.put(self.algo.get_weights()), actor_ids=[actor_id], wait=False
                )
                self.send_normalizer(actor_ids=[actor_id])

    def send_normalizer(self, actor_ids=None) -> None:
        """The merged normalizer statistics to the evaluation actors (all, or ``actor_ids``), if started."""
        if self.runners is None:
            return
        for method, args in self.algo.normalizer_calls():
            self.runners.foreach(method, *args, actor_ids=actor_ids, wait=False)

    def stop(self) -> None:
        if self.runners is not None:
            self.runners.stop()
            self.runners = None
        if self.local is not None:
            self.local.stop()
            self.local = None
