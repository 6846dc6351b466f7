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

from shoal.batch import Batch, Col, pack_per_sequence
from shoal.callbacks import Episode, build_callbacks, call_episode_end, overrides
from shoal.envs.multi_agent import SCRIPTED_PLAYERS, MultiAgentEnvAdapter, make_multi_agent_env, make_scripted_player
from shoal.errors import ConfigError
from shoal.league.builder import MatchResult, PlayerSpec
from shoal.models.recurrent import pack_state
from shoal.process import configure_process
from shoal.rollout.env_runner import RolloutMetrics
from shoal.rollout.faults import check_batch_finite
from shoal.rollout.policies import STATE_OUT, ActorCriticPolicy
from shoal.seeding import evaluation_seed, policy_seed, worker_seed

DEFAULT_SEQUENCE_LENGTH = 50
_SPEC_KEYS = {"weights", "model", "agent", "trainable"}
_LEAGUE_SPEC_KEYS = {"type", "parent", "created_iteration"}  # a league player's spec: metadata, ignored here
_COLUMNS = (
    Col.OBS,
    Col.NEXT_OBS,
    Col.ACTIONS,
    Col.ACTION_LOGP,
    Col.REWARDS,
    Col.TERMINATEDS,
    Col.VALID,
    Col.ACTION_MASK,
)


def _is_weights(spec: Mapping) -> bool:
    return bool(spec) and all(isinstance(v, (np.ndarray, torch.Tensor)) for v in spec.values())


@dataclass(slots=True)
class _OpenStep:
    """An agent's decision waiting for its next observation: what it saw and did, and the
    reward it has received since."""

    obs: np.ndarray
    mask: np.ndarray | None  # the action mask it acted under (None: every action legal)
    action: Any
    logp: float
    reward: float = 0.0
    state: np.ndarray | None = None  # a recurrent policy's state before this decision


class _Row(NamedTuple):
    """One decision in a stream: a row of the policy's batch, fields in the order of ``_COLUMNS``."""

    obs: np.ndarray
    next_obs: np.ndarray
    action: Any
    logp: float
    reward: float
    terminated: bool
    valid: bool
    mask: np.ndarray
    state: np.ndarray | None = None  # recurrent policies: the state before this row (not a column of its own)


def _reset_row(last: _Row, state: np.ndarray | None = None) -> _Row:
    """The masked row that ends a stream's episode without termination (like a single-agent reset
    row): it holds ``last``'s next observation, which V-trace bootstraps from (a recurrent policy
    from ``state``, its state after ``last``'s decision)."""
    return _Row(
        last.next_obs, last.next_obs, np.zeros_like(last.action), 0.0, 0.0, False, False, np.ones_like(last.mask), state
    )


class _ActRequest(NamedTuple):
    """One agent that must act: its env copy, its id, what it observes and its action mask."""

    env: int
    agent: str
    obs: np.ndarray
    mask: np.ndarray | None


# ---- episodes and matchmaking -----------------------------------------------------------------
@dataclass
class EpisodeInfo:
    """What a mapping function sees (``episode``), and what the runner tracks per game."""

    id: int
    env_index: int
    worker_index: int
    agents: list[str]
    policies: dict[str, str] = field(default_factory=dict)  # agent -> policy id, fixed for the episode
    match_type: str | None = None
    user_data: dict[str, Any] = field(default_factory=dict)  # free for mapping functions
    returns: dict[str, float] = field(default_factory=dict)
    length: int = 0  # env steps


class MatchSampler:
    """Draws each new episode's seat -> policy mapping from matchmaking data (which policies
    play, with which probabilities: plain data, picklable, sent with the weights).

    Accepted forms (``data``):

    * ``{"matches": [{"policies": ["main", "main_v1"], "prob": 0.5, "match_type": "vs_snapshot"}, ...],
      "shuffle_seats": True}`` or just the list. ``policies`` is a list in seat order
      (``possible_agents``), shuffled per episode when ``shuffle_seats`` (default) so each side
      plays first half the time; or a dict ``{agent: policy_id}`` (seats kept). One policy id
      alone plays every seat. ``prob`` values are weights (normalised); ``match_type`` is optional.
    * an object with ``to_matches()`` returning one of the above (e.g. the league's
      :class:`shoal.league.Matchmaking`).
    """

    def __init__(self, data: Any) -> None:
        if hasattr(data, "to_matches"):
            data = data.to_matches()
        shuffle = True
        if isinstance(data, Mapping):
            if "matches" not in data:
                raise ConfigError(f"matchmaking data needs a 'matches' list, got keys {sorted(data)}")
            shuffle = bool(data.get("shuffle_seats", True))
            data = data["matches"]
        entries = list(data)
        if not entries:
            raise ConfigError("matchmaking data has no matches")
        self.shuffle_seats = shuffle
        self.entries: list[tuple[Any, str | None]] = []
        probs = []
        for e in entries:
            if not isinstance(e, Mapping) or "policies" not in e:
                raise ConfigError(
                    f"each matchmaking entry needs 'policies' (and optional 'prob', 'match_type'), got {e!r}"
                )
            pol = e["policies"]
            pol = dict(pol) if isinstance(pol, Mapping) else ([pol] if isinstance(pol, str) else list(pol))
            self.entries.append((pol, e.get("match_type")))
            probs.append(float(e.get("prob", 1.0)))
        p = np.asarray(probs)
        if (p < 0).any() or p.sum() <= 0:
            raise ConfigError(f"matchmaking probabilities must be >= 0 and not all 0, got {probs}")
        self.probs = p / p.sum()

    def policy_ids(self) -> set[str]:
        out: set[str] = set()
        for pol, _ in self.entries:
            out.update(pol.values() if isinstance(pol, dict) else pol)
        return out

    def check(self, agents: list[str]) -> None:
        for pol, _ in self.entries:
            if isinstance(pol, dict):
                if set(pol) != set(agents):
                    raise ConfigError(f"matchmaking seats {sorted(pol)} are not the env's agents {agents}")
            elif len(pol) not in (1, len(agents)):
                raise ConfigError(
                    f"matchmaking entry {pol} names {len(pol)} policies for {len(agents)} agents "
                    "(give one per agent, or one for all)"
                )

    def assign(self, episode: EpisodeInfo, rng: np.random.Generator) -> tuple[dict[str, str], str | None]:
        pol, match_type = self.entries[int(rng.choice(len(self.entries), p=self.probs))]
        agents = episode.agents
        if isinstance(pol, dict):
            return dict(pol), match_type
        if len(pol) == 1:
            return {a: pol[0] for a in agents}, match_type
        order = rng.permutation(len(pol)) if self.shuffle_seats else range(len(pol))
        return {a: pol[j] for a, j in zip(agents, order)}, match_type


class _FnMapping:
    """A ``policy_mapping_fn(agent_id, episode) -> policy_id``, called once per agent when an episode starts."""

    def __init__(self, fn: Callable[[str, EpisodeInfo], str]) -> None:
        self.fn = fn

    def assign(self, episode: EpisodeInfo, rng: np.random.Generator) -> tuple[dict[str, str], str | None]:
        return {a: self.fn(a, episode) for a in episode.agents}, episode.user_data.get("match_type")


# ---- evaluation records -------------------------------------------------------------------------
@dataclass(slots=True)
class _EvalGame:
    """One evaluation game in progress on an evaluation env copy."""

    seat: int  # the evaluated policy's seat: 0 plays first
    mapping: dict[str, Any]  # agent -> the policy object playing it
    to_act: dict  # agent -> (obs, mask) of the agents that must act next
    returns: dict[str, float]  # agent -> reward so far
    length: int = 0  # env steps


@dataclass
class _EvalTally:
    """Finished evaluation games: wins, draws and losses per seat of the evaluated policy, and lengths."""

    wins: list[int] = field(default_factory=lambda: [0, 0])
    draws: list[int] = field(default_factory=lambda: [0, 0])
    losses: list[int] = field(default_factory=lambda: [0, 0])
    lengths: list[int] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)  # the evaluated policy's return in each game

    def add(self, game: _EvalGame, agents: list[str]) -> None:
        mine, theirs = game.returns[agents[game.seat]], game.returns[agents[1 - game.seat]]
        outcome = self.wins if mine > theirs else self.draws if mine == theirs else self.losses
        outcome[game.seat] += 1
        self.lengths.append(game.length)
        self.returns.append(float(mine))

    def _games(self, seat: int) -> int:
        return self.wins[seat] + self.draws[seat] + self.losses[seat]

    def summary(self) -> dict[str, Any]:
        """Counts and rates, the win rate per seat, the mean length, and ``returns``: one per game in finishing order."""
        wins, draws, losses = sum(self.wins), sum(self.draws), sum(self.losses)
        n = wins + draws + losses
        return {
            "games": n,
            "wins": wins,
            "draws": draws,
            "losses": losses,
            "win_rate": wins / n,
            "draw_rate": draws / n,
            "loss_rate": losses / n,
            "win_rate_first": self.wins[0] / max(1, self._games(0)),
            "win_rate_second": self.wins[1] / max(1, self._games(1)),
            "mean_length": float(np.mean(self.lengths)),
            "returns": list(self.returns),
            "lengths": list(self.lengths),
        }


# ---- metrics ----------------------------------------------------------------------------------
@dataclass
class MultiAgentRolloutMetrics(RolloutMetrics):
    """RolloutMetrics (episode return = sum over agents) plus per-policy returns and match outcomes."""

    agent_steps: int = 0
    policy_returns: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    policy_agent_steps: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    matches: list[MatchResult] = field(default_factory=list)


def match_outcome(episode: EpisodeInfo) -> MatchResult:
    """Per-match record: ``policies`` in seat order, ``winner`` a policy id (None on a draw)."""
    agents = episode.agents
    rets = {a: float(episode.returns.get(a, 0.0)) for a in agents}
    best = max(rets.values())
    top = [a for a in agents if rets[a] == best]
    winner_agent = top[0] if len(top) == 1 else None
    return MatchResult(
        policies=tuple(episode.policies[a] for a in agents),
        winner=episode.policies[winner_agent] if winner_agent else None,
        match_type=episode.match_type,
        agents=dict(episode.policies),
        returns=rets,
        winner_agent=winner_agent,
        length=episode.length,
        episode_id=episode.id,
        worker_index=episode.worker_index,
    )


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
class MultiAgentEnvRunner:
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
        batches = {pid: self._sequences_to_batch(seqs) for pid, seqs in self._ready.items() if seqs}
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

    def _sequences_to_batch(self, seqs: list[list[_Row]]) -> Batch:
        rows = [row for seq in seqs for row in seq]
        cols = list(zip(*rows))
        dtypes = (np.float32, np.float32, None, np.float32, np.float32, bool, bool, bool)
        batch = Batch(
            {
                name: np.asarray(np.stack(col) if np.ndim(col[0]) else col, dtype=dt)
                for name, col, dt in zip(_COLUMNS, cols, dtypes)
            }
        )
        T = len(seqs[0])
        if seqs[0][0].state is not None:  # a recurrent policy: each sequence's start state (shoal.models.recurrent)
            batch[Col.STATE_IN] = pack_state(np.stack([seq[0].state for seq in seqs]), T)
        # V-trace's bootstrap, as single-agent sequences carry it (PPO's GAE reads NEXT_OBS on every row)
        batch[Col.BOOTSTRAP_OBS] = pack_per_sequence(batch[Col.NEXT_OBS][T - 1 :: T], T)
        return batch

    # ---- evaluation ----------------------------------------------------------------------------
    def evaluate_vs(
        self,
        policy_id: str,
        opponent: str = "random",
        num_games: int = 100,
        *,
        explore: bool = False,
        num_envs: int | None = None,
    ) -> dict[str, float]:
        """Win rate of ``policy_id`` against ``opponent`` ("random", "heuristic" or a policy id).

        Two-player games on separate env copies (training games keep their state); ``policy_id``
        takes the first seat in half of the games. ``explore`` False plays the policy greedily
        (among legal actions); the opponent, if a policy, plays the same way.
        """
        if len(self.agents) != 2:
            raise ValueError(f"evaluate_vs needs a two-player env; this one has agents {self.agents}")
        player = self.policies[policy_id]
        opp = self._eval_opponent(opponent)
        k = min(num_envs or self.num_envs, num_games)
        while len(self._eval_envs) < k:
            self._eval_envs.append(make_multi_agent_env(self.config.env, self.config.env_config))
        with torch.inference_mode():
            tally = self._play_eval_games(player, opp, num_games, k, explore)
        return tally.summary()

    def _eval_opponent(self, opponent: str):
        """The policy ``opponent`` names, or a new scripted player of that kind."""
        if opponent in self.policies:
            return self.policies[opponent]
        env = self.envs[0]
        return make_scripted_player(
            opponent,
            env.observation_space(self.agents[0]),
            env.action_space(self.agents[0]),
            evaluation_seed(self.seed),
        )

    def _play_eval_games(self, player, opp, num_games: int, k: int, explore: bool) -> _EvalTally:
        """``num_games`` games on the first ``k`` evaluation env copies, a new one starting on a
        copy as soon as its game ends; every tick, one forward per policy over the live games."""
        tally = _EvalTally()
        games: list[_EvalGame | None] = [self._start_eval_game(j, j, player, opp) for j in range(k)]
        started = k
        states: dict[tuple[int, str], np.ndarray] = {}  # recurrent players' states, per evaluation game
        while any(g is not None for g in games):
            live = [j for j in range(k) if games[j] is not None]
            actions = self._act(
                [(j, games[j].mapping, games[j].to_act) for j in live], explore, record=False, states=states
            )
            for j in live:
                if not self._step_eval_game(j, games[j], actions[j]):
                    continue
                for agent in self.agents:
                    states.pop((j, agent), None)
                tally.add(games[j], self.agents)
                games[j] = None
                if started < num_games:
                    games[j] = self._start_eval_game(j, started, player, opp)
                    started += 1
        return tally

    def _start_eval_game(self, j: int, number: int, player, opp) -> _EvalGame:
        """Game ``number`` (from 0) on evaluation env copy ``j``: the player takes seat ``number % 2``."""
        seat = number % 2
        mapping = {self.agents[seat]: player, self.agents[1 - seat]: opp}
        return _EvalGame(seat, mapping, self._eval_envs[j].reset(), dict.fromkeys(self.agents, 0.0))

    def _step_eval_game(self, j: int, game: _EvalGame, actions: dict[str, Any]) -> bool:
        """One env step of ``game`` on evaluation env copy ``j``; True when the game is over."""
        out = self._eval_envs[j].step(actions)
        game.length += 1
        for a, r in out.rewards.items():
            game.returns[a] += r
        game.to_act = out.to_act
        return out.done

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


__all__ = [
    "EpisodeInfo",
    "MatchSampler",
    "MultiAgentEnvRunner",
    "MultiAgentRolloutMetrics",
    "PolicyReturnWindows",
    "match_outcome",
]
