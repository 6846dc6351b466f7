"""Multi-agent PPO, IMPALA and APPO without a league: the ``multi_agent`` config section.

``PPOConfig(env="pettingzoo.classic:rps_v2", multi_agent={...}).build()`` makes the algorithm's
multi-agent form (``Algorithm.__new__`` picks it when the section is set). The data flow:

- Rollout actors are :class:`~shoal.rollout.multi_agent.MultiAgentEnvRunner`: ``num_envs_per_worker``
  copies of a PettingZoo env (Parallel or AEC, any number of agents), every agent played by the
  policy ``policy_mapping`` gives it when its episode starts, one batched forward per policy
  per tick, illegal actions masked. Each ``sample()`` returns, per learning policy, sequences
  of ``rollout_fragment_length`` decisions (one agent's decisions in order, reset rows marked
  by ``VALID``) with the action masks they were sampled under.
- The driver keeps one learner per learning policy, each with its own config (the algorithm's,
  with the policy's ``config`` and ``model`` overrides). Sampling and learning take turns, as
  in PPO: every training step gathers one round of sequences from all rollout actors and
  updates each learning policy on its own rows with the algorithm's loss under the stored
  masks: V-trace (IMPALA), V-trace plus the clipped surrogate and a target network (APPO), or
  PPO's surrogate on GAE advantages computed learner-side from the current network's values
  over each sequence (PPO).
- Policies outside ``policies_to_train`` keep their initial weights for the whole run.
- Results add ``policy_return_mean/<id>`` (last 100 episodes of each policy's agents) and the
  learners' statistics as ``learner/<id>/<stat>``.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import numpy as np
import torch

from shoal.algorithms.base import Algorithm
from shoal.algorithms.config_groups import policy_config
from shoal.algorithms.ppo import sgd_sequence_length
from shoal.batch import Batch, Col
from shoal.envs import EnvInfo
from shoal.envs.multi_agent import make_multi_agent_env
from shoal.errors import ConfigError
from shoal.imports import import_path
from shoal.learn import resolve_device
from shoal.learn.masking import ActionMasked
from shoal.learn.policy_learner import PolicyLearner
from shoal.logging.metrics import Phase
from shoal.models import build_actor_critic
from shoal.models.recurrent import run_sequences
from shoal.rollout.multi_agent import MultiAgentEnvRunner, PolicyReturnWindows
from shoal.rollout.postprocessing import compute_gae
from shoal.runtime import ActorResources, LazyActorGroup, make_actor_group


# ---- the learners, one per policy -------------------------------------------------------------
def sequence_length(config) -> int:
    """Decisions per sequence the runner cuts: a recurrent model's training sequence
    (``state_sequence_length``: max_seq_len for PPO), otherwise rollout_fragment_length."""
    return config.state_sequence_length() if config.model.is_recurrent() else config.fragment_length()


def _make_loss(kind: str):
    """The algorithm's loss record for ``kind``, with logits under the batch's recorded action masks."""
    if kind == "ppo":
        from shoal.algorithms.ppo import PPOLoss as loss_cls
    elif kind == "impala":
        from shoal.algorithms.impala import IMPALALoss as loss_cls
    else:
        from shoal.algorithms.appo import APPOLoss as loss_cls

    def make(config, *, target, kl):
        objects = {"impala": {}, "ppo": {"kl": kl}, "appo": {"target": target, "kl": kl}}[kind]
        return loss_cls.from_config(config, masked=True, **objects)

    return make


class MultiAgentPolicyLearner(PolicyLearner):
    """One learning policy of the ``multi_agent`` form: the algorithm's loss under the batch's
    action masks; for PPO, GAE computed here from the current network."""

    def __init__(self, kind: str, config, obs_space, action_space, seed: Optional[int]) -> None:
        self.kind = kind
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            module = build_actor_critic(obs_space, action_space, config.model)
        super().__init__(module, config, _make_loss(kind), device=resolve_device(config.resources.num_gpus),
                         target_period=config.target_update_frequency if kind == "appo" else None)

    def learn(self, batch: Batch, env_steps: int, rng: np.random.Generator) -> dict[str, float]:
        cfg, T = self.config, sequence_length(self.config)
        if self.kind == "ppo":
            self.learner.set_env_steps(env_steps)
            batch = self._with_gae(batch, T)
            return self.update(batch, cfg.num_sgd_iter, cfg.minibatch_size, rng, sequence_length=sgd_sequence_length(cfg))
        # V-trace runs over whole sequences: each pass takes the batch as it is
        return self.update(batch, cfg.num_sgd_iter, len(batch), rng, sequence_length=T, env_steps=env_steps)

    @torch.no_grad()
    def _with_gae(self, batch: Batch, T: int) -> Batch:
        """PPO's columns computed here: the behaviour logits and values of the current network (which
        sampled the batch: weights move only between rounds) and GAE over each sequence. A row's
        chain stops at termination and before a reset row; after the sequence's last row it
        bootstraps from the value of that row's next observation."""
        t = batch.to_torch(self.learner.device)
        module = ActionMasked(self.learner.module, t[Col.ACTION_MASK])
        if module.recurrent:  # the next row's value, and after a sequence the value from its final state
            inputs, values, final = run_sequences(module, t, T)
            last = t[Col.NEXT_OBS].reshape(-1, T, *t[Col.NEXT_OBS].shape[1:])[:, -1]
            seq_values = values.reshape(-1, T)
            next_values = torch.cat([seq_values[:, 1:], module.value_step(last, final)[:, None]], dim=1).reshape(-1)
        else:
            inputs, values = module(t[Col.OBS])
            next_values = module.value(t[Col.NEXT_OBS])

        def tm(x: np.ndarray) -> np.ndarray:  # rows, sequence after sequence -> (T, sequences)
            return x.reshape(-1, T).T

        valid, term = tm(batch[Col.VALID]), tm(batch[Col.TERMINATEDS])
        next_valid = np.concatenate([valid[1:], np.ones_like(valid[:1])])
        adv = compute_gae(tm(batch[Col.REWARDS]), tm(values.cpu().numpy()), tm(next_values.cpu().numpy()), term,
                          term | ~next_valid, self.config.gamma, self.config.gae_lambda)
        out = Batch(dict(batch.items()))
        v = values.cpu().numpy()
        out[Col.ADVANTAGES] = adv.T.reshape(-1)
        out[Col.VALUE_TARGETS] = out[Col.ADVANTAGES] + v
        out[Col.VF_PREDS] = v
        out[Col.ACTION_DIST_INPUTS] = inputs.cpu().numpy()
        return out


# ---- the algorithm --------------------------------------------------------------------------
class MultiAgentMixin:
    """Replaces a single-agent algorithm's env, rollout actors and learner with per-policy ones."""

    multi_agent_kind = ""  # "ppo", "impala" or "appo": which loss each policy learns with

    def describe_env(self) -> EnvInfo:
        cfg = self.config
        env = make_multi_agent_env(cfg.env, cfg.env_config)  # fails early on a bad env
        try:
            self.agents = list(env.possible_agents)
            self.spaces = {a: (env.observation_space(a), env.action_space(a)) for a in self.agents}
        finally:
            env.close()
        mapping = cfg.multi_agent.policy_mapping
        if isinstance(mapping, dict):
            unknown = sorted(set(mapping) - set(self.agents))
            missing = sorted(set(self.agents) - set(mapping))
            if unknown or missing:
                raise ConfigError(f"multi_agent.policy_mapping must map exactly the env's agents {self.agents}; "
                                  + (f"unknown: {unknown}" if unknown else f"missing: {missing}"))
        first = self.agents[0]
        return EnvInfo(self.spaces[first][0], self.spaces[first][1], None, None)

    def _agent_for(self, pid: str) -> str:
        """The agent whose spaces policy ``pid`` is built for: the first one a dict mapping gives it."""
        mapping = self.config.multi_agent.policy_mapping
        if isinstance(mapping, dict):
            for agent in self.agents:
                if mapping.get(agent) == pid:
                    return agent
        return self.agents[0]

    def setup(self) -> None:
        cfg, ma = self.config, self.config.multi_agent
        self.policy_cls = None
        self.policy_configs = {pid: policy_config(cfg, pid) for pid in ma.policies}
        self.trained = ma.trained()
        self.returns = PolicyReturnWindows(100)
        self.learners: dict[str, MultiAgentPolicyLearner] = {}
        self.frozen: dict[str, dict[str, np.ndarray]] = {}
        for n, pid in enumerate(ma.policies):
            obs_space, action_space = self.spaces[self._agent_for(pid)]
            seed = None if cfg.seed is None else cfg.seed + 1 + n
            learner = MultiAgentPolicyLearner(self.multi_agent_kind, self.policy_configs[pid], obs_space, action_space, seed)
            if pid in self.trained:
                self.learners[pid] = learner
            else:
                self.frozen[pid] = learner.learner.get_weights()
        self._stats: dict[str, float] = {}
        res = cfg.resources
        remote = res.num_workers > 0
        n, first = max(res.num_workers, 1), 1 if remote else 0
        self.env_runners = LazyActorGroup(lambda: make_actor_group(
            MultiAgentEnvRunner, n, self._runner_args, remote=remote,
            resources=self.actor_resources("rollout actor") if remote else ActorResources.of_workers(res),
            name="rollout actor", first_index=first), n, first_index=first)
        self.env_runners.on_restart = lambda: [("set_weights", (self._weights_ref,))] if self._weights_ref else []
        self.broadcast_weights()

    def _runner_args(self, i: int):
        cfg, ma = self.config, self.config.multi_agent
        specs = {pid: {"weights": w, "model": dict(spec.model) if spec else {}, "agent": self._agent_for(pid),
                       "trainable": pid in self.trained}
                 for pid, spec, w in ((p, s, self._weights_of(p)) for p, s in ma.policies.items())}
        kwargs: dict[str, Any] = {"policies_to_train": self.trained, "rollout_fragment_length": sequence_length(cfg),
                                  "ticks_per_sample": cfg.fragment_length()}
        mapping = ma.policy_mapping
        if isinstance(mapping, dict):
            kwargs["matchmaking"] = {"matches": [{"policies": dict(mapping)}], "shuffle_seats": False}
        elif isinstance(mapping, str):
            return (cfg, i, specs, import_path(mapping)), kwargs
        return (cfg, i, specs), kwargs

    def _weights_of(self, pid: str) -> dict[str, np.ndarray]:
        return self.learners[pid].learner.get_weights() if pid in self.learners else self.frozen[pid]

    def display_metrics(self) -> list[tuple[str, str]]:
        """The single-agent figures of the first trained policy (results key them ``learner/<policy>/...``)."""
        pid = next(iter(self.trained), None)
        if pid is None:
            return []
        return [(f"learner/{pid}/{key.removeprefix('learner/')}", f"{pid}/{label}") for key, label in super().display_metrics()]

    def nonfinite_updates_skipped(self) -> int:
        return sum(pl.learner.num_nonfinite_skipped for pl in self.learners.values())

    def get_weights(self) -> dict[str, dict[str, np.ndarray]]:
        return {pid: self._weights_of(pid) for pid in self.config.multi_agent.policies}

    def training_step(self) -> dict[str, Any]:
        with self.timers.time(Phase.SAMPLE):
            results = self.env_runners.foreach("sample")
            if not results:
                return {}
            self.record_rollouts([m for _, m in results])
            for _, m in results:
                self.returns.add(m)
        with self.timers.time(Phase.LEARN):
            for pid, learner in self.learners.items():
                batches = [b[pid] for b, _ in results if pid in b]
                if not batches:
                    continue
                batch = Batch.concat(batches)
                stats = learner.learn(batch, int(self.counters["env_steps_sampled"]), self.rng)
                self.counters["env_steps_trained"] += int(batch[Col.VALID].sum())
                self._stats.update({f"learner/{pid}/{k}": v for k, v in stats.items()})
        with self.timers.time(Phase.SYNC):
            self.broadcast_weights()
        return dict(self._stats)

    def train(self) -> dict[str, Any]:
        result = Algorithm.train(self)  # not the single-agent class's (IMPALA's adds its learner thread's stats)
        result.update(self.returns.metrics())
        return result

    def evaluate(self, num_episodes: Optional[int] = None, render: bool = False) -> dict[str, float]:
        """Greedy episodes on a separate runner in the driver: the mean return summed over agents, and per policy."""
        if render:
            raise ConfigError("rendering is not supported for multi-agent evaluation")
        n = num_episodes or self.config.evaluation.evaluation_num_episodes
        returns, lengths, windows = self.evaluation_episodes(n)
        return {"episode_return_mean": float(np.mean(returns[:n])), "episode_return_std": float(np.std(returns[:n])),
                "episode_len_mean": float(np.mean(lengths[:n])), "num_episodes": n, **windows.metrics()}

    def evaluation_episodes(self, n: int, explore: bool = False) -> tuple[list[float], list[int], PolicyReturnWindows]:
        """At least ``n`` episodes on a separate runner in the driver, greedy unless ``explore``: their
        returns (summed over agents) and lengths in finishing order, and the per-policy returns."""
        args, kwargs = self._runner_args(0)
        kwargs.update(policies_to_train=[], num_envs=min(n, 8))
        runner = MultiAgentEnvRunner(*args, **kwargs)
        returns, lengths, windows = [], [], PolicyReturnWindows(n)
        try:
            while len(returns) < n:
                _, m = runner.sample(explore=explore)
                returns.extend(m.episode_returns)
                lengths.extend(m.episode_lengths)
                windows.add(m)
        finally:
            runner.stop()
        return returns, lengths, windows

    def update_config(self, changes: dict[str, Any]) -> None:
        """The base checks and applies ``changes``; then each learning policy takes its own config
        again (its overrides still win) and rebuilds its loss, optimizer settings and KL target."""
        Algorithm.update_config(self, changes)
        self.policy_configs = {pid: policy_config(self.config, pid) for pid in self.policy_configs}
        for pid, pl in self.learners.items():
            pl.apply_config(self.policy_configs[pid])

    def get_state(self) -> dict[str, Any]:
        return {**Algorithm.get_state(self), "policies": {pid: pl.get_state() for pid, pl in self.learners.items()},
                "frozen": {pid: {k: torch.from_numpy(np.array(v)) for k, v in w.items()} for pid, w in self.frozen.items()}}

    def set_state(self, state: dict[str, Any]) -> None:
        Algorithm.set_state(self, state)
        for pid, s in state["policies"].items():
            if pid in self.learners:
                self.learners[pid].set_state(s)
        for pid, w in state.get("frozen", {}).items():
            if pid in self.frozen:
                self.frozen[pid] = {k: v.numpy() for k, v in w.items()}
        self.broadcast_weights()

    def stop(self) -> None:
        Algorithm.stop(self)


@functools.cache
def multi_agent_class(cls: type) -> type:
    """The multi-agent form of algorithm class ``cls`` (PPO, IMPALA or APPO)."""
    kind = cls.config_cls.algo
    if kind not in ("ppo", "impala", "appo"):
        raise ConfigError(f"{cls.__name__} has no multi_agent form; use ppo, impala or appo (or alpha_star for a league)")
    return type(f"MultiAgent{cls.__name__}", (MultiAgentMixin, cls), {"multi_agent_kind": kind})
