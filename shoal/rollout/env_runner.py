"""EnvRunner: a vectorized env plus an inference copy of the policy, sampling fragments.

A plain class: the driver uses it directly when ``num_workers=0``; ``shoal.runtime`` wraps
it in a Ray actor otherwise. ``sample()`` steps all envs ``rollout_fragment_length`` times
and hands the time-major :class:`Fragment` to the algorithm's postprocessing function (GAE
for PPO, ...), which returns a flat :class:`~shoal.batch.Batch`.

With next-step autoreset (see ``shoal.envs.make``) the step after an episode ends is a reset
step: its action is ignored, it carries no transition and is masked out (``valid`` False).
So no transition ever spans two episodes, and the value the policy computes on a reset
step's input is the value of the previous episode's final observation: the bootstrap for a
truncated episode comes for free.

A recurrent policy's state (``model.use_lstm``) is carried here, across fragments. An env's
state is zeroed after a terminal step (Atari's life-loss terminals included, when the learning
signal has them) and before the first step of each episode (the step after a reset step); the
learner zeroes at the same rows. It is recorded at the start of every training sequence of
``config.state_sequence_length()`` steps (``Fragment.state_in``). Evaluation carries a state
per evaluation env the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch

from shoal.batch import Batch, Col
from shoal.callbacks import Episode, build_callbacks, call_episode_end, overrides
from shoal.envs.atari import LearningSignal
from shoal.envs.make import make_env, make_vec_env
from shoal.envs.normalize import Normalizer, RunningStats
from shoal.process import configure_process
from shoal.rollout.faults import EnvFaults, env_call
from shoal.rollout.policies import STATE_OUT
from shoal.seeding import evaluation_seed, worker_seed
from shoal.spaces import ACTION_MASK_KEY, action_masks, given_mask_width, preprocess_obs, stack_obs


@dataclass
class Fragment:
    """Time-major arrays of one sample call: T steps of N envs."""

    obs: np.ndarray  # (T + 1, N, D): obs[t] is acted on at step t; obs[T] follows the last step
    actions: np.ndarray  # (T, N, ...)
    rewards: np.ndarray  # (T, N)
    terminateds: np.ndarray  # (T, N) bool
    truncateds: np.ndarray  # (T, N) bool
    valid: np.ndarray  # (T, N) bool: False on reset steps
    extras: dict[str, np.ndarray]  # (T, N, ...) per-step policy outputs
    last_extras: dict[str, np.ndarray]  # (N, ...) policy outputs on obs[T]
    state_in: np.ndarray | None = None  # recurrent policies: (T // L, N, state_size), the state at each sequence start
    masks: np.ndarray | None = None  # an env with action masks: (T + 1, N, width) bool, the legal actions at obs[t]


@dataclass
class RolloutMetrics:
    env_steps: int = 0
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    episode_envs: list[int] = field(default_factory=list)  # the env (index in the vector) of each finished episode
    sample_time_s: float = 0.0
    worker_index: int = 0
    normalizer_new: RunningStats | None = (
        None  # normalization statistics gathered since the last sample, for the driver
    )
    custom_metrics: list[dict[str, float]] = field(default_factory=list)  # on_episode_end's, one dict per episode
    env_failures: int = 0  # times the env raised in step/reset and was recreated (its fragment dropped)


def episode_summary(returns: list[float], lengths: list[int]) -> dict[str, float]:
    return {
        "episode_return_mean": float(np.mean(returns)),
        "episode_return_std": float(np.std(returns)),
        "episode_len_mean": float(np.mean(lengths)),
        "num_episodes": len(returns),
    }


def fragment_to_batch(fragment: Fragment) -> Batch:
    """The default postprocessing: valid transitions with next_obs, no returns computed."""
    from shoal.rollout.postprocessing import flatten_valid

    cols = {
        Col.OBS: fragment.obs[:-1],
        Col.NEXT_OBS: fragment.obs[1:],
        Col.ACTIONS: fragment.actions,
        Col.REWARDS: fragment.rewards,
        Col.TERMINATEDS: fragment.terminateds,
        Col.TRUNCATEDS: fragment.truncateds,
        **fragment.extras,
    }
    if fragment.masks is not None:
        cols[Col.ACTION_MASK] = fragment.masks[:-1]
    return Batch(flatten_valid(cols, fragment.valid))


def env_info_at(info: dict, i: int) -> dict:
    """Env ``i``'s entries of a Gymnasium vector env's info dict (the ``_key`` masks applied, nested dicts too)."""
    out = {}
    for k, v in info.items():
        if k.startswith("_"):
            continue
        mask = info.get("_" + k)
        if mask is not None and not mask[i]:
            continue
        if isinstance(v, dict):
            out[k] = env_info_at(v, i)
        else:  # one entry per env; anything else (a wrapper's scalar) is the same for every env
            out[k] = v[i] if isinstance(v, (np.ndarray, list, tuple)) else v
    return out


def row_at(obs, i: int):
    """Env ``i``'s observation from a vector env's batch (dict and tuple spaces too)."""
    if isinstance(obs, dict):
        return {k: row_at(v, i) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(row_at(v, i) for v in obs)
    return obs[i]


class _FragmentBuffers:
    """One fragment's arrays, time-major: ``T + 1`` observations (uint8 frames stay uint8), then
    per step rewards, flags, actions and the policy's extras (allocated at the first step, whose
    shapes they take), and a recurrent policy's state at the start of each training sequence."""

    __slots__ = ("obs", "rewards", "terms", "truncs", "valid", "actions", "extras", "state", "masks")

    def __init__(
        self, T: int, N: int, obs: np.ndarray, state: np.ndarray | None, seq_len: int, mask: np.ndarray | None
    ) -> None:
        self.obs = np.empty((T + 1, *obs.shape), dtype=obs.dtype)
        self.rewards = np.empty((T, N), dtype=np.float32)
        self.terms = np.empty((T, N), dtype=bool)
        self.truncs = np.empty((T, N), dtype=bool)
        self.valid = np.empty((T, N), dtype=bool)
        self.actions: np.ndarray | None = None
        self.extras: dict[str, np.ndarray] | None = None
        self.state = None if state is None else np.empty((T // seq_len, *state.shape), dtype=np.float32)
        self.masks = None if mask is None else np.empty((T + 1, *mask.shape), dtype=bool)

    def put_actions(self, t: int, actions: np.ndarray, extras: dict[str, np.ndarray]) -> None:
        if self.actions is None:
            T = len(self.rewards)
            self.actions = np.empty((T, *actions.shape), dtype=actions.dtype)
            self.extras = {k: np.empty((T, *v.shape), dtype=v.dtype) for k, v in extras.items()}
        self.actions[t] = actions
        for k, v in extras.items():
            self.extras[k][t] = v


class EnvRunner:
    """Samples fixed-length fragments from ``num_envs`` vectorized envs.

    Args:
        config: the algorithm config (env, model, resources, seed, gamma...).
        worker_index: 0 for the driver's own runner, 1..N for remote actors. Seeds differ per index.
        policy_cls: builds the inference policy, ``policy_cls(obs_space, action_space, config, seed)``.
        postprocess: ``Fragment -> Batch`` (runs here, on the worker, in parallel with others).
        rollout_fragment_length: steps per env per ``sample()``.
        num_envs: envs in the vector; defaults to ``config.resources.num_envs_per_worker``.
    """

    def __init__(
        self,
        config,
        worker_index: int,
        policy_cls,
        postprocess: Callable[[Fragment], Batch] = fragment_to_batch,
        rollout_fragment_length: int = 64,
        num_envs: int | None = None,
    ) -> None:
        configure_process(config.resources)
        self.config = config
        self.worker_index = worker_index
        self.num_envs = num_envs or config.resources.num_envs_per_worker
        self.fragment_length = rollout_fragment_length
        self.postprocess = postprocess
        seed = worker_seed(config.seed, worker_index)
        self.seed = seed
        self.faults = EnvFaults(config, worker_index)
        self.env = None
        self.faults.guard(lambda: self._make_env(seed), lambda: None)
        self.signal = LearningSignal.for_config(config)  # Atari: clipped rewards, life-loss terminals
        self.obs_space = self.env.single_observation_space
        self.action_space = self.env.single_action_space
        self.policy = policy_cls(self.obs_space, self.action_space, config, seed)
        self.recurrent = self.policy.recurrent
        if self.recurrent:
            self.seq_len = config.state_sequence_length()
        self.normalizer: Normalizer | None = None  # built at the first reset, kept across env rebuilds
        self.mask_width: int | None = None  # the action masks' length, once the env is seen to give them
        self.callbacks = build_callbacks(config.callbacks)
        self._step_hook = overrides(self.callbacks, "on_episode_step")
        self._end_hook = overrides(self.callbacks, "on_episode_end")
        self._episodes: list[Episode] | None = None  # stays None: no per-step work for callbacks
        self.faults.guard(lambda: self._start_episodes(seed), self._recreate_env)
        self._eval_envs: dict[int, gym.vector.VectorEnv] = {}
        self.weights_version = 0
        self._steps_sampled = 0  # vector steps sampled, for naming the step of a NaN in an error

    def _start_episodes(self, seed: int | None) -> None:
        """Reset every env: new episodes (and fresh recurrent states) from the next step on."""
        raw, info = env_call("reset", self.env.reset, seed=seed)
        if self.signal is not None:
            self.signal.start(info)
        self._obs = preprocess_obs(self.obs_space, raw)
        if self.mask_width is None:
            self.mask_width = given_mask_width(self.obs_space, self.action_space, info)
        self._mask = self._masks(raw, info, self.num_envs)
        if self.normalizer is None:
            stats = RunningStats.for_config(self.config, self._obs.shape[1:])
            self.normalizer = Normalizer(self.config, stats, self.num_envs) if stats is not None else None
        if self.normalizer is not None:
            self._obs = self.normalizer.observations(self._obs)
        self._prev_done = np.zeros(self.num_envs, dtype=bool)
        self._ep_return = np.zeros(self.num_envs, dtype=np.float64)
        self._ep_len = np.zeros(self.num_envs, dtype=np.int64)
        if self.recurrent:
            self._state = self.policy.initial_state(self.num_envs)
            self._new_episode = np.zeros(self.num_envs, dtype=bool)  # zero the state before the next step
        if self._step_hook or self._end_hook:  # fresh records: episodes in progress were dropped
            self._episodes = [Episode(i, self.worker_index) for i in range(self.num_envs)]

    def _make_env(self, seed: int | None) -> None:
        """(Re)build the vector env, closing the old one (which may be broken)."""
        if self.env is not None:
            try:
                self.env.close()
            except Exception:  # noqa: BLE001 - it is broken already
                pass
        self.env = env_call(
            "construction",
            make_vec_env,
            self.config.env,
            self.num_envs,
            self.config.env_config,
            seed=seed,
            preprocessing=self.config.env_preprocessing,
        )

    def _recreate_env(self) -> None:
        """After the env raised: build it anew, with a fresh seed, and start fresh episodes (those in progress are dropped)."""
        seed = self.faults.reseed(self.seed)
        self._make_env(seed)
        self._start_episodes(seed)

    # ---- sampling -----------------------------------------------------------------------
    def sample(self, explore: bool = True) -> tuple[Batch, RolloutMetrics]:
        t0 = time.perf_counter()
        fragment, metrics = self.faults.guard(lambda: self._run_fragment(explore), self._recreate_env)
        metrics.env_failures = self.faults.take_new()
        self.faults.check_finite(fragment.obs, fragment.rewards, self._steps_sampled)
        self._steps_sampled += self.fragment_length
        batch = self.postprocess(fragment)
        metrics.sample_time_s = time.perf_counter() - t0
        if self.normalizer is not None:
            metrics.normalizer_new = self.normalizer.take_new()
        return batch, metrics

    def _run_fragment(self, explore: bool) -> tuple[Fragment, RolloutMetrics]:
        """The hot loop: ``T`` vector steps, each one batched forward and one env step."""
        T, policy, recurrent = self.fragment_length, self.policy, self.recurrent
        obs, prev_done = self._obs, self._prev_done
        metrics = RolloutMetrics(worker_index=self.worker_index)
        state = new_episode = None
        L = 1
        if recurrent:
            state, new_episode, L = self._state, self._new_episode, self.seq_len
            if T % L:
                raise ValueError(f"rollout fragments of {T} steps do not split into training sequences of {L}")
        mask = self._mask
        buf = _FragmentBuffers(T, self.num_envs, obs, state, L, mask)
        with torch.inference_mode():
            for t in range(T):
                buf.obs[t] = obs
                kw = {}
                if mask is not None:
                    buf.masks[t] = mask
                    kw = {"masks": mask}
                if recurrent:
                    if new_episode.any():
                        state[new_episode] = 0.0
                    if t % L == 0:
                        buf.state[t // L] = state
                    actions, extras = policy.act(obs, explore, state, **kw)
                    state = extras.pop(STATE_OUT)
                else:
                    actions, extras = policy.act(obs, explore, **kw)
                buf.put_actions(t, actions, extras)
                raw, r, term, trunc, info = env_call("step", self.env.step, policy.to_env_actions(actions))
                live = ~prev_done
                prev_done = self._record_step(buf, t, raw, r, term, trunc, info, live, metrics)
                if recurrent:  # zero after a terminal step and after a reset step (its obs starts an episode)
                    new_episode = ~live | buf.terms[t]
                obs = self._policy_input(raw)
                mask = self._masks(raw, info, self.num_envs)
            buf.obs[T] = obs
            if mask is not None:
                buf.masks[T] = mask
            if recurrent:
                last_extras = policy.bootstrap(obs, state)
                self._state, self._new_episode = state, new_episode
            else:
                last_extras = policy.bootstrap(obs)
        self._obs, self._prev_done, self._mask = obs, prev_done, mask
        buf.rewards *= buf.valid
        metrics.env_steps = int(buf.valid.sum())
        return Fragment(
            buf.obs,
            buf.actions,
            buf.rewards,
            buf.terms,
            buf.truncs,
            buf.valid,
            buf.extras,
            last_extras,
            buf.state,
            buf.masks,
        ), metrics

    def _masks(self, raw, info: dict, n: int) -> np.ndarray | None:
        """Each env's legal actions (None for an env without action masks)."""
        if self.mask_width is None:
            return None
        return action_masks(self.obs_space, raw, info, n, self.mask_width)

    def _record_step(
        self, buf: "_FragmentBuffers", t: int, raw, r, term, trunc, info, live: np.ndarray, metrics: RolloutMetrics
    ) -> np.ndarray:
        """Step ``t``'s rewards and flags into the buffers, and the episode bookkeeping (returns and
        lengths stay raw: the learner sees shaped or normalized rewards); where episodes ended."""
        buf.valid[t] = live
        if self.signal is None:
            buf.rewards[t], buf.terms[t] = r, term
        else:  # what the learner sees; the episode bookkeeping below uses the raw step
            buf.rewards[t], buf.terms[t] = self.signal.apply(r, term, info)
        buf.truncs[t] = trunc
        ep_ret, ep_len = self._ep_return, self._ep_len
        ep_ret += r * live
        ep_len += live
        done = term | trunc
        if self.normalizer is not None:
            buf.rewards[t] = self.normalizer.rewards(buf.rewards[t], done, live)
        if self._episodes is not None:
            self._episode_hooks(raw, r, live, done, info, metrics)
        if done.any():
            idx = np.flatnonzero(done)
            metrics.episode_returns.extend(ep_ret[idx].tolist())
            metrics.episode_lengths.extend(ep_len[idx].tolist())
            metrics.episode_envs.extend(idx.tolist())
            ep_ret[idx] = 0.0
            ep_len[idx] = 0
        return done

    def _episode_hooks(self, obs, rewards, live, done, info, metrics: RolloutMetrics) -> None:
        """The user's on_episode_step (live envs) and on_episode_end (envs whose episode just ended)."""
        cb, episodes = self.callbacks, self._episodes
        for i in np.flatnonzero(live | done) if self._step_hook else ():
            ep = episodes[i]
            ep.total_return, ep.length = float(self._ep_return[i]), int(self._ep_len[i])
            ep.info = env_info_at(info, i)
            cb.on_episode_step(ep, row_at(obs, i), float(rewards[i]), ep.info)
        for i in np.flatnonzero(done):
            ep = episodes[i]
            ep.total_return, ep.length, ep.info = float(self._ep_return[i]), int(self._ep_len[i]), env_info_at(info, i)
            if self._end_hook:
                metrics.custom_metrics.append(call_episode_end(cb, ep))
            episodes[i] = Episode(int(i), self.worker_index)

    # ---- evaluation ---------------------------------------------------------------------
    def evaluate(self, num_episodes: int, render: bool = False) -> dict[str, float]:
        """Greedy episodes on separate envs (the training envs keep their state).

        Each round takes exactly the first episode of each of its sub-envs, so short episodes
        are not over-represented.
        """
        if render:
            return self._evaluate_rendered(num_episodes)
        returns, lengths = [], []
        with torch.inference_mode():
            while len(returns) < num_episodes:
                k = min(num_episodes - len(returns), 32)
                env = self._eval_envs.get(k)
                if env is None:
                    env = self._eval_envs[k] = make_vec_env(
                        self.config.env,
                        k,
                        self.config.env_config,
                        seed=evaluation_seed(self.seed),
                        preprocessing=self.config.env_preprocessing,
                    )
                raw, info = env.reset()
                ret, length = np.zeros(k), np.zeros(k, dtype=np.int64)
                finished = np.zeros(k, dtype=bool)
                state = self.policy.initial_state(k)  # only each env's first episode counts: no resets
                while not finished.all():
                    obs = self._policy_input(raw, update=False)
                    actions, state = self._act_greedy(obs, state, self._masks(raw, info, k))
                    raw, r, term, trunc, info = env.step(self.policy.to_env_actions(actions))
                    ret += r * ~finished
                    length += ~finished
                    finished |= term | trunc
                returns.extend(ret.tolist())
                lengths.extend(length.tolist())
        return episode_summary(returns, lengths)

    def _evaluate_rendered(self, num_episodes: int) -> dict[str, float]:
        env = make_env(
            self.config.env, self.config.env_config, preprocessing=self.config.env_preprocessing, render_mode="human"
        )
        returns, lengths = [], []
        with torch.inference_mode():
            for _ in range(num_episodes):
                raw, info = env.reset()
                done, ret, n = False, 0.0, 0
                state = self.policy.initial_state(1)
                while not done:
                    batched = stack_obs([raw])
                    obs = self._policy_input(batched, update=False)
                    one = {ACTION_MASK_KEY: np.asarray(info[ACTION_MASK_KEY])[None]} if ACTION_MASK_KEY in info else {}
                    actions, state = self._act_greedy(obs, state, self._masks(batched, one, 1))
                    raw, r, term, trunc, info = env.step(self.policy.to_env_actions(actions)[0])
                    ret, n, done = ret + float(r), n + 1, term or trunc
                returns.append(ret)
                lengths.append(n)
        env.close()
        return episode_summary(returns, lengths)

    def _policy_input(self, raw: np.ndarray, update: bool = True) -> np.ndarray:
        """Observations as the policy takes them: rows, normalized when ``normalize.obs`` is on
        (counted into the statistics with ``update``; evaluation uses them frozen)."""
        rows = preprocess_obs(self.obs_space, raw)
        return rows if self.normalizer is None else self.normalizer.observations(rows, update)

    def _act_greedy(
        self, obs: np.ndarray, state: np.ndarray | None, mask: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Greedy actions (the legal ones under ``mask``), and the next state for a recurrent policy."""
        kw = {} if mask is None else {"masks": mask}
        if not self.recurrent:
            return self.policy.act(obs, False, **kw)[0], None
        actions, extras = self.policy.act(obs, False, state, **kw)
        return actions, extras[STATE_OUT]

    # ---- weights ------------------------------------------------------------------------
    def get_weights(self) -> dict[str, np.ndarray]:
        return self.policy.get_weights()

    def set_weights(self, weights: dict, version: int | None = None) -> None:
        self.policy.set_weights(weights)
        if version is not None:
            self.weights_version = version

    def set_normalizer(self, state: dict) -> None:
        """The driver's merged normalization statistics (``RunningStats.get_state()``)."""
        if self.normalizer is not None:
            self.normalizer.set_stats(state)

    def set_global_vars(self, global_vars: dict) -> None:
        """Driver-side state the policy follows (e.g. ``env_steps`` for an epsilon schedule)."""
        self.policy.on_global_vars(global_vars)

    def stop(self) -> None:
        self.env.close()
        for e in self._eval_envs.values():
            e.close()
