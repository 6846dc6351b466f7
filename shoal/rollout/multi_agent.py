"""MultiAgentEnvRunner: several PettingZoo games in parallel, several policies, one Batch per policy.

Each episode maps every agent to a policy id when it starts (a ``policy_mapping_fn(agent_id,
episode)`` or matchmaking *data*, see :class:`MatchSampler`); the mapping holds until the
episode ends, so a league can pick opponents per game. At every tick the runner groups the
agents that must act, over all its env copies, by policy and runs **one batched forward per
policy**; illegal actions get zero probability (:func:`shoal.models.distributions.masked_logits`).

What the learner gets matches the single-agent IMPALA/APPO layout
(:func:`shoal.rollout.postprocessing.sequence_postprocess`): per policy, sequences of ``T`` rows laid
out one after another, with ``OBS, NEXT_OBS, ACTIONS, ACTION_LOGP, REWARDS, TERMINATEDS,
VALID`` and ``BOOTSTRAP_OBS`` (each sequence's last ``NEXT_OBS``, packed) plus ``ACTION_MASK`` (the mask the action was sampled under, so the learner masks the
same logits: :class:`shoal.learn.masking.ActionMasked`). A row is one *decision* of one agent:
in a turn-based game the opponent's moves are part of the environment, the reward credited to
a decision is everything the agent received until its next decision (a loss on the opponent's
move lands on the loser's last move), and ``NEXT_OBS`` is the observation at its next decision
(or its final one). A stream of rows is kept per (env copy, agent, policy) and cut into
sequences of ``T``; a sequence is handed out once it is full, so rows wait for the next
``sample()`` when needed and every row is a real transition. Episodes follow each other inside
a stream: a terminated step has discount 0, and a truncated one is followed by a
``VALID``-False row holding the final observation, exactly like the single-agent reset rows,
so V-trace bootstraps from it.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

from shoal.batch import Batch, Col
from shoal.callbacks import Episode, build_callbacks, call_episode_end, overrides
from shoal.envs.multi_agent import SCRIPTED_PLAYERS, MultiAgentEnvAdapter, make_multi_agent_env, make_scripted_player
from shoal.errors import ConfigError
from shoal.league.builder import MatchResult, PlayerSpec
from shoal.process import configure_process
from shoal.rollout.env_runner import RolloutMetrics
from shoal.rollout.faults import check_batch_finite
from shoal.rollout.multi_agent_evaluation import HeadToHeadEvaluation
from shoal.rollout.multi_agent_matches import EpisodeInfo, MatchSampler, _FnMapping, match_outcome
from shoal.rollout.multi_agent_streams import _OpenStep, _reset_row, _Row, sequences_to_batch
from shoal.rollout.policies import STATE_OUT, ActorCriticPolicy
from shoal.seeding import policy_seed, worker_seed

DEFAULT_SEQUENCE_LENGTH = 50
_SPEC_KEYS = {"weights", "model", "agent", "trainable"}
_LEAGUE_SPEC_KEYS = {"type", "parent", "created_iteration"}  # a league player's spec: metadata, ignored here


def _is_weights(spec: Mapping) -> bool:
    return bool(spec) and all(isinstance(v, (np.ndarray, torch.Tensor)) for v in spec.values())


class _ActRequest(NamedTuple):
    """One agent that must act: its env copy, its id, what it observes and its action mask."""

    env: int
    agent: str
    obs: np.ndarray
    mask: np.ndarray | None


# ---- metrics ----------------------------------------------------------------------------------
@dataclass
class MultiAgentRolloutMetrics(RolloutMetrics):
    """RolloutMetrics (episode return = sum over agents) plus per-policy returns and match outcomes."""

    agent_steps: int = 0
    policy_returns: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    policy_agent_steps: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    matches: list[MatchResult] = field(default_factory=list)


class PolicyReturnWindows:
    """Last ``size`` episode returns per policy: ``metrics() -> {"policy_return_mean/<pid>": ...}``."""

    def __init__(self, size: int = 100) -> None:
        self.size = size
        self.returns: dict[str, deque] = {}

    def add(self, metrics: MultiAgentRolloutMetrics) -> None:
        for pid, rets in metrics.policy_returns.items():
            self.returns.setdefault(pid, deque(maxlen=self.size)).extend(rets)

    def metrics(self) -> dict[str, float]:
        return {f"policy_return_mean/{pid}": float(np.mean(r)) if r else math.nan for pid, r in self.returns.items()}


# ---- the runner -------------------------------------------------------------------------------
class MultiAgentEnvRunner(HeadToHeadEvaluation):
    """``num_envs`` copies of a PettingZoo env played by a set of policies.

    Args:
        config: algorithm config (``env``, ``env_config``, ``seed``, ``model``, ``resources``,
            ``rollout_fragment_length``).
        worker_index: 0 in the driver, 1..N for remote actors (seeds differ per index).
        policies: ``{policy_id: spec}``; a spec is None (a new actor-critic from ``config.model``),
            a dict of weights, ``{"weights": ..., "model": {overrides}, "agent": id_for_spaces,
            "trainable": bool}`` (a league player's spec fits, a ``PlayerSpec`` or its dict form:
            its other keys are ignored),
            ``"random"`` / ``"heuristic"`` (scripted, never trained) or a policy object with ``act``.
        policy_mapping_fn: ``(agent_id, episode) -> policy_id`` (picklable for remote actors);
            called once per agent when an episode starts.
        matchmaking: matchmaking data instead of a function (see :class:`MatchSampler`).
        policies_to_train: ids whose sequences ``sample()`` returns; default every network policy.
        collect_all_policies: return sequences for every network policy, trained or not.
        rollout_fragment_length: the sequence length T (default: the config's, or 50 for 'auto').
        ticks_per_sample: vector steps per ``sample()`` (default T).
        num_envs: env copies (default ``config.resources.num_envs_per_worker``).
    """

    def __init__(
        self,
        config,
        worker_index: int,
        policies: Mapping[str, Any],
        policy_mapping_fn: Callable[[str, EpisodeInfo], str] | None = None,
        *,
        matchmaking: Any = None,
        policies_to_train: list[str] | None = None,
        collect_all_policies: bool = False,
        rollout_fragment_length: int | None = None,
        ticks_per_sample: int | None = None,
        num_envs: int | None = None,
    ) -> None:
        configure_process(config.resources)
        self.config, self.worker_index = config, worker_index
        frag = config.rollout_fragment_length
        self.T = rollout_fragment_length or (frag if isinstance(frag, int) else DEFAULT_SEQUENCE_LENGTH)
        self.ticks_per_sample = ticks_per_sample or self.T
        self.num_envs = num_envs or config.resources.num_envs_per_worker
        self.seed = worker_seed(config.seed, worker_index)
        self.rng = np.random.default_rng(self.seed)
        self.envs = [make_multi_agent_env(config.env, config.env_config) for _ in range(self.num_envs)]
        self.agents = list(self.envs[0].possible_agents)
        self.policies: dict[str, Any] = {}
        self.policies_to_train: set[str] = set()
        self.collect_all_policies = collect_all_policies
        self.weights_version = 0
        for pid, spec in policies.items():
            self.add_policy(pid, spec, trainable=None if policies_to_train is None else pid in policies_to_train)
        unknown = set(policies_to_train or ()) - set(self.policies)
        if unknown:
            raise ConfigError(
                f"policies_to_train names unknown policies {sorted(unknown)}; known: {sorted(self.policies)}"
            )
        if matchmaking is not None:
            self.set_matchmaking(matchmaking)
        elif policy_mapping_fn is not None:
            self.set_policy_mapping_fn(policy_mapping_fn)
        elif len(self.policies) == 1:
            self.set_matchmaking([{"policies": list(self.policies)}])
        else:
            raise ConfigError("several policies need a policy_mapping_fn or matchmaking data")
        self._episode_count = 0
        self._streams: dict[tuple, list[_Row]] = defaultdict(list)  # (env, agent, policy) -> rows not yet in a sequence
        self._ready: dict[str, list[list[_Row]]] = defaultdict(list)  # policy -> full sequences
        self._open: list[dict[str, _OpenStep]] = [{} for _ in self.envs]  # agent -> decision waiting for its next obs
        self._states: dict[tuple[int, str], np.ndarray] = {}  # (env, agent) -> a recurrent policy's state this episode
        self._metrics = MultiAgentRolloutMetrics(worker_index=worker_index)
        self._to_act: list[dict] = [
            env.reset(seed=None if self.seed is None else self.seed + i) for i, env in enumerate(self.envs)
        ]
        self._episodes: list[EpisodeInfo] = [self._new_episode(i) for i in range(self.num_envs)]
        self._eval_envs: list[MultiAgentEnvAdapter] = []
        self.callbacks = build_callbacks(config.callbacks)  # on_episode_end only: no per-step hook here

    # ---- policies -----------------------------------------------------------------------------
    def add_policy(
        self, policy_id: str, spec: Any = None, *, trainable: bool | None = None, weights: Mapping | None = None
    ) -> None:
        """Add (or replace) a policy; ``trainable`` None: network policies train, scripted ones do not."""
        if isinstance(spec, PlayerSpec):  # a league player: its trainable flag counts, the rest is metadata
            spec = spec.to_dict()
        policy = self._build_policy(policy_id, spec)
        if weights is not None:
            policy.set_weights(weights)
        self.policies[policy_id] = policy
        if trainable is None and isinstance(spec, Mapping) and "trainable" in spec:
            trainable = bool(spec["trainable"])
        trains = getattr(policy, "trainable", True) if trainable is None else trainable
        if trains:
            self.policies_to_train.add(policy_id)
        else:
            self.policies_to_train.discard(policy_id)

    def remove_policy(self, policy_id: str) -> None:
        """Drop a policy; games it is playing are abandoned (not reported) and restart with a new mapping."""
        if policy_id not in self.policies:
            raise KeyError(f"unknown policy {policy_id!r}; known: {sorted(self.policies)}")
        if isinstance(self._mapping, MatchSampler) and policy_id in self._mapping.policy_ids():
            raise ValueError(f"the matchmaking still names {policy_id!r}; set new matchmaking before removing it")
        del self.policies[policy_id]
        self.policies_to_train.discard(policy_id)
        self._ready.pop(policy_id, None)
        for key in [k for k in self._streams if k[2] == policy_id]:
            del self._streams[key]
        for i, ep in enumerate(self._episodes):
            if policy_id in ep.policies.values():
                self._abandon_episode(i)

    def set_policies_to_train(self, policy_ids) -> None:
        unknown = set(policy_ids) - set(self.policies)
        if unknown:
            raise KeyError(f"unknown policies {sorted(unknown)}; known: {sorted(self.policies)}")
        self.policies_to_train = set(policy_ids)

    def _build_policy(self, policy_id: str, spec: Any):
        if hasattr(spec, "act"):
            return spec
        agent = self.agents[0]
        weights, model = None, None
        if isinstance(spec, str):
            if spec not in SCRIPTED_PLAYERS:
                raise ConfigError(
                    f"policy {policy_id!r}: unknown scripted player {spec!r}; choose one of {SCRIPTED_PLAYERS}"
                )
            env = self.envs[0]
            return make_scripted_player(
                spec, env.observation_space(agent), env.action_space(agent), self._policy_seed(policy_id)
            )
        if isinstance(spec, Mapping):
            if _is_weights(spec):
                weights = spec
            else:
                unknown = set(spec) - _SPEC_KEYS - _LEAGUE_SPEC_KEYS
                if unknown:
                    raise ConfigError(
                        f"policy {policy_id!r}: unknown spec keys {sorted(unknown)}; "
                        f"allowed: {sorted(_SPEC_KEYS | _LEAGUE_SPEC_KEYS)}"
                    )
                weights, model, agent = spec.get("weights"), spec.get("model"), spec.get("agent", agent)
        elif spec is not None:
            raise ConfigError(
                f"policy {policy_id!r}: a spec is None, weights, a dict, 'random'/'heuristic' or a policy, "
                f"got {type(spec).__name__}"
            )
        cfg = self.config
        if model:
            cfg = SimpleNamespace(model=type(cfg.model)(**{**cfg.model.model_dump(), **model}))
        seed = policy_seed(self.config.seed, policy_id)
        env = self.envs[0]
        policy = ActorCriticPolicy(env.observation_space(agent), env.action_space(agent), cfg, seed)
        if self.seed is not None:  # same initial weights on every worker, different sampling noise
            policy.generator.manual_seed(self._policy_seed(policy_id))
        if weights:
            policy.set_weights(weights)
        return policy

    def _policy_seed(self, policy_id: str) -> int | None:
        return policy_seed(self.seed, policy_id)

    # ---- mapping -------------------------------------------------------------------------------
    def set_policy_mapping_fn(self, fn: Callable[[str, EpisodeInfo], str]) -> None:
        """Use ``fn`` for episodes that start from now on; it may set ``episode.user_data["match_type"]``."""
        self._mapping = _FnMapping(fn)

    def set_matchmaking(self, data: Any) -> None:
        """Matchmaking data (see :class:`MatchSampler`), or a mapping function; for episodes starting from now on."""
        if callable(data) and not hasattr(data, "to_matches"):
            return self.set_policy_mapping_fn(data)
        mm = data if isinstance(data, MatchSampler) else MatchSampler(data)
        mm.check(self.agents)
        unknown = mm.policy_ids() - set(self.policies)
        if unknown:
            raise KeyError(f"matchmaking names unknown policies {sorted(unknown)}; known: {sorted(self.policies)}")
        self._mapping = mm

    def _new_episode(self, i: int) -> EpisodeInfo:
        self._episode_count += 1
        ep = EpisodeInfo(
            id=(self.worker_index << 40) + self._episode_count,
            env_index=i,
            worker_index=self.worker_index,
            agents=list(self.agents),
        )
        ep.policies, ep.match_type = self._mapping.assign(ep, self.rng)
        for a, pid in ep.policies.items():
            if pid not in self.policies:
                raise KeyError(
                    f"the policy mapping sent agent {a!r} to unknown policy {pid!r}; known: {sorted(self.policies)}"
                )
        ep.returns = dict.fromkeys(self.agents, 0.0)
        return ep

    # ---- sampling ------------------------------------------------------------------------------
    def sample(self, explore: bool = True) -> tuple[dict[str, Batch], MultiAgentRolloutMetrics]:
        """Step every env copy ``ticks_per_sample`` times; full sequences per policy, and the metrics."""
        t0 = time.perf_counter()
        with torch.inference_mode():
            for _ in range(self.ticks_per_sample):
                self._tick(explore)
        batches = {pid: sequences_to_batch(seqs) for pid, seqs in self._ready.items() if seqs}
        self._ready = defaultdict(list)
        check_batch_finite(batches, self.config.env_name(), self.worker_index)
        metrics, self._metrics = self._metrics, MultiAgentRolloutMetrics(worker_index=self.worker_index)
        metrics.sample_time_s = time.perf_counter() - t0
        return batches, metrics

    def _collects(self, pid: str) -> bool:
        return pid in self.policies_to_train or (
            self.collect_all_policies and getattr(self.policies[pid], "trainable", True)
        )

    def _tick(self, explore: bool) -> None:
        actions = self._act(
            [(i, self._episodes[i].policies, to_act) for i, to_act in enumerate(self._to_act)], explore, record=True
        )
        m = self._metrics
        for i, env in enumerate(self.envs):
            if not actions[i]:
                continue
            ep = self._episodes[i]
            out = env.step(actions[i])
            m.env_steps += 1
            m.agent_steps += len(actions[i])
            for a in actions[i]:
                m.policy_agent_steps[ep.policies[a]] += 1
            ep.length += 1
            opened = self._open[i]
            for a, r in out.rewards.items():
                ep.returns[a] = ep.returns.get(a, 0.0) + r
                if a in opened:
                    opened[a].reward += r
            for a, (obs, _) in out.to_act.items():
                self._close(i, a, obs, terminated=False, truncated=False)
            for a, ((obs, _), term, trunc) in out.ended.items():
                self._close(i, a, obs, terminated=term, truncated=trunc and not term)
            if out.done:
                self._finish_episode(i)
            else:
                self._to_act[i] = out.to_act

    def _act(
        self, requests, explore: bool, record: bool, states: dict[tuple[int, str], np.ndarray] | None = None
    ) -> list[dict[str, Any]]:
        """One forward per policy over every (env, agent) that must act; ``requests``: (env, mapping, to_act).
        A recurrent policy's state per (env, agent) lives in ``states`` (the training games' by default):
        missing means a new episode (zeros), and each act stores the next one."""
        states = self._states if states is None else states
        groups: dict[str, list[_ActRequest]] = defaultdict(list)
        for i, mapping, to_act in requests:
            for a, (obs, mask) in to_act.items():
                groups[mapping[a]].append(_ActRequest(i, a, obs, mask))
        actions: list[dict[str, Any]] = [{} for _ in range(max((i for i, _, _ in requests), default=-1) + 1)]
        for pid, reqs in groups.items():
            policy = self.policies[pid] if isinstance(pid, str) else pid
            obs = np.stack([r.obs for r in reqs])
            masks = None
            if any(r.mask is not None for r in reqs):
                n = next(len(r.mask) for r in reqs if r.mask is not None)
                masks = np.stack([r.mask if r.mask is not None else np.ones(n, dtype=bool) for r in reqs])
            before = None
            if getattr(policy, "recurrent", False):
                zero = policy.initial_state(1)[0]
                before = np.stack([states.get((r.env, r.agent), zero) for r in reqs])
                acts, extras = policy.act(obs, explore=explore, masks=masks, state=before)
                for j, r in enumerate(reqs):
                    states[(r.env, r.agent)] = extras[STATE_OUT][j]
            else:
                acts, extras = policy.act(obs, explore=explore, masks=masks)
            keep = record and isinstance(pid, str) and self._collects(pid)
            for j, r in enumerate(reqs):
                actions[r.env][r.agent] = acts[j]
                if keep:
                    self._open[r.env][r.agent] = _OpenStep(
                        r.obs, r.mask, acts[j], extras[Col.ACTION_LOGP][j], state=None if before is None else before[j]
                    )
        return actions

    def _close(self, i: int, agent: str, next_obs: np.ndarray, terminated: bool, truncated: bool) -> None:
        """The agent's pending transition is complete: append it (and, on truncation, a reset row) to its stream."""
        step = self._open[i].pop(agent, None)
        if step is None:
            return
        pid = self._episodes[i].policies[agent]
        mask = step.mask
        if mask is None:
            space = self.envs[i].action_space(agent)
            mask = (
                np.ones(int(space.n), dtype=bool) if isinstance(space, gym.spaces.Discrete) else np.ones(1, dtype=bool)
            )
        stream = self._streams[(i, agent, pid)]
        stream.append(_Row(step.obs, next_obs, step.action, step.logp, step.reward, terminated, True, mask, step.state))
        if truncated:
            stream.append(_reset_row(stream[-1], self._states.get((i, agent)) if step.state is not None else None))
        self._cut_sequences(stream, pid)

    def _cut_sequences(self, stream: list[_Row], pid: str) -> None:
        while len(stream) >= self.T:
            self._ready[pid].append(stream[: self.T])
            del stream[: self.T]

    def _abandon_episode(self, i: int) -> None:
        """End env copy ``i``'s game unreported and start a new one; for every player's stream the
        game ends like a truncation (its pending move, whose outcome never comes, is dropped), so
        V-trace bootstraps from the last decision's next observation instead of running on into the
        next game."""
        ep = self._episodes[i]
        for agent, pid in ep.policies.items():
            stream = self._streams.get((i, agent, pid))
            if stream and stream[-1].valid and not stream[-1].terminated:
                recurrent = stream[-1].state is not None
                stream.append(_reset_row(stream[-1], self._states.get((i, agent)) if recurrent else None))
                self._cut_sequences(stream, pid)
        self._open[i].clear()
        self._forget_states(i)
        self._to_act[i] = self.envs[i].reset()
        self._episodes[i] = self._new_episode(i)

    def _forget_states(self, i: int) -> None:
        """A new game on env copy ``i``: its agents' recurrent states start from zeros."""
        for agent in self.agents:
            self._states.pop((i, agent), None)

    def _finish_episode(self, i: int) -> None:
        ep = self._episodes[i]
        self._open[i].clear()
        self._forget_states(i)
        m = self._metrics
        m.episode_returns.append(float(sum(ep.returns.values())))
        m.episode_lengths.append(ep.length)
        for a, pid in ep.policies.items():
            m.policy_returns[pid].append(float(ep.returns.get(a, 0.0)))
        m.matches.append(match_outcome(ep))
        if overrides(self.callbacks, "on_episode_end"):
            record = Episode(
                i,
                self.worker_index,
                total_return=m.episode_returns[-1],
                length=ep.length,
                agent_returns={a: float(r) for a, r in ep.returns.items()},
                agent_policies=dict(ep.policies),
            )
            m.custom_metrics.append(call_episode_end(self.callbacks, record))
        self._to_act[i] = self.envs[i].reset()
        self._episodes[i] = self._new_episode(i)

    # ---- weights -------------------------------------------------------------------------------
    def get_weights(self, policy_ids=None) -> dict[str, dict[str, np.ndarray]]:
        ids = self.policies if policy_ids is None else policy_ids
        return {pid: self.policies[pid].get_weights() for pid in ids if getattr(self.policies[pid], "trainable", True)}

    def set_weights(self, weights: Mapping[str, Mapping], version: int | None = None, matchmaking: Any = None) -> None:
        """``{policy_id: weights}``; an id this runner does not have yet is added (not trained here).

        ``matchmaking`` (optional) is applied after the weights, so data naming new policies works.
        """
        for pid, w in weights.items():
            if pid in self.policies:
                self.policies[pid].set_weights(w)
            else:
                self.add_policy(pid, None, trainable=False, weights=w)
        if matchmaking is not None:
            self.set_matchmaking(matchmaking)
        if version is not None:
            self.weights_version = version

    def set_global_vars(self, global_vars: dict) -> None:
        for policy in self.policies.values():
            hook = getattr(policy, "on_global_vars", None)
            if hook is not None:
                hook(global_vars)

    def stop(self) -> None:
        for env in self.envs + self._eval_envs:
            env.close()


__all__ = ["MultiAgentEnvRunner", "MultiAgentRolloutMetrics", "PolicyReturnWindows"]
