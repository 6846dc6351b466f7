"""Inference-side policies that EnvRunners call once per vector step.

A policy owns a torch module and turns a batch of preprocessed observations into actions
plus "extras" (per-step columns the learner needs, e.g. log-probs and value predictions).
``bootstrap(obs)`` returns the extras of the observation after a fragment's last step.

A ``recurrent`` policy (a model with ``model.use_lstm``) also takes each env's state:
``act(obs, explore, state)`` returns the next state among the extras under :data:`STATE_OUT`
(the runner takes it out before storing extras), ``bootstrap(obs, state)`` leaves it as it is,
and ``initial_state(n)`` is the state before an episode's first step.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from shoal.batch import Col
from shoal.models import build_actor_critic
from shoal.models.distributions import env_action_converter, masked_logits
from shoal.models.weights import load_numpy_weights, weights_to_numpy
from shoal.schedule import PiecewiseSchedule
from shoal.spaces import (
    ACTION_MASK_KEY,
    action_masks,
    check_maskable,
    has_mask_entry,
    is_single_obs,
    preprocess_obs,
    stack_obs,
)

STATE_OUT = "state_out"  # a recurrent policy's extras key for the state after the step (not a Batch column)


class InferencePolicy:
    """What a rollout actor's policy declares beyond ``act``/``get_weights``/``set_weights``."""

    trainable = True  # a multi-agent runner collects training rows only for trainable policies
    recurrent = False  # act/bootstrap take each env's state (model.use_lstm)

    def initial_state(self, n: int) -> np.ndarray | None:
        """``(n, state_size)`` float32 zeros for a recurrent policy; None otherwise."""
        return None

    def on_global_vars(self, global_vars: dict) -> None:
        """Follow driver-side state (``{"env_steps": t}``, e.g. for an epsilon schedule); default: ignore it."""


class ActorCriticPolicy(InferencePolicy):
    """Samples from the module's action distribution; records log-prob, dist inputs, value."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, config, seed: int | None = None) -> None:
        if seed is not None:
            # Seeded initial weights (without touching the global RNG): same seed, same samples.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self.module = build_actor_critic(obs_space, action_space, config.model)
        else:
            self.module = build_actor_critic(obs_space, action_space, config.model)
        self.module.eval()
        self.dist_cls = self.module.dist_cls
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(seed)
        else:
            self.generator.seed()
        self.action_space = action_space
        self._env_actions = env_action_converter(action_space)
        self.recurrent = bool(getattr(self.module, "recurrent", False))

    def initial_state(self, n: int) -> np.ndarray | None:
        return self.module.initial_state(n).numpy() if self.recurrent else None

    @torch.inference_mode()
    def act(
        self, obs: np.ndarray, explore: bool = True, state: np.ndarray | None = None, masks: np.ndarray | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions for a batch of rows, and the extras; ``masks`` (bool, one row per observation):
        the legal actions, the others never sampled (their logits at the lowest float, recorded so)."""
        if self.recurrent:
            inputs, values, state_out = self.module.step(torch.from_numpy(obs), torch.from_numpy(state))
        else:
            inputs, values = self.module(torch.from_numpy(obs))
        if masks is not None:
            inputs = masked_logits(inputs, torch.from_numpy(masks))
        dist = self.dist_cls(inputs)
        actions = dist.sample(self.generator) if explore else dist.deterministic()
        extras = {
            Col.ACTION_LOGP: dist.logp(actions).numpy(),
            Col.VF_PREDS: values.numpy(),
            Col.ACTION_DIST_INPUTS: inputs.numpy(),
        }
        if self.recurrent:
            extras[STATE_OUT] = state_out.numpy()
        return actions.numpy(), extras

    def bootstrap(self, obs: np.ndarray, state: np.ndarray | None = None) -> dict[str, np.ndarray]:
        if self.recurrent:
            return {Col.VF_PREDS: self.module.value_step(torch.from_numpy(obs), torch.from_numpy(state)).numpy()}
        return {Col.VF_PREDS: self.module.value(torch.from_numpy(obs)).numpy()}

    def to_env_actions(self, actions: np.ndarray) -> np.ndarray:
        return self._env_actions(actions)

    def get_weights(self) -> dict[str, np.ndarray]:
        return weights_to_numpy(self.module)

    def set_weights(self, weights: dict) -> None:
        load_numpy_weights(self.module, weights)


def apex_epsilon(i: int, n: int, base: float = 0.4, alpha: float = 7.0) -> float:
    """Ape-X per-actor exploration: actor i of n explores with ``base ** (1 + alpha * i / (n - 1))``."""
    if n <= 1:
        return base
    return base ** (1.0 + alpha * i / (n - 1))


class EpsilonGreedyQPolicy(InferencePolicy):
    """Greedy in Q(s, .) with probability 1 - epsilon, uniform otherwise; records Q(s, .).

    ``epsilon`` is a float or one value per env of the vector. With an ``epsilon_schedule``
    (env steps -> epsilon), ``on_global_vars({"env_steps": t})`` moves it along.
    """

    def __init__(
        self,
        obs_space: gym.Space,
        action_space: gym.Space,
        config,
        seed: int | None = None,
        epsilon: float | np.ndarray = 0.0,
    ) -> None:
        from shoal.models import build_q_network

        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            self.module = build_q_network(obs_space, action_space, config.model, config.dueling)
        self.module.eval()
        self.action_space = action_space
        self._env_actions = env_action_converter(action_space)
        self.num_actions = int(action_space.n)
        self.rng = np.random.default_rng(seed)
        self.epsilon = epsilon
        # A config whose ``epsilon_schedule()`` gives [(env_steps, eps), ...] (DQN) anneals epsilon.
        points = config.epsilon_schedule()
        self.epsilon_schedule = None
        if points:
            self.epsilon_schedule = PiecewiseSchedule(points)
            self.epsilon = self.epsilon_schedule(0)

    def on_global_vars(self, global_vars: dict) -> None:
        if self.epsilon_schedule is not None and "env_steps" in global_vars:
            self.epsilon = self.epsilon_schedule(global_vars["env_steps"])

    @torch.inference_mode()
    def act(
        self, obs: np.ndarray, explore: bool = True, masks: np.ndarray | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Epsilon-greedy actions; with ``masks`` (bool, one row per observation) greedy and random
        ones both among the legal actions."""
        q = self.module(torch.from_numpy(obs)).numpy()
        actions = (q if masks is None else np.where(masks, q, -np.inf)).argmax(axis=1)
        if explore:
            n = len(obs)
            rand = self.rng.random(n) < self.epsilon
            if rand.any():
                if masks is None:
                    random_actions = self.rng.integers(0, self.num_actions, n)
                else:  # uniform among the legal ones: the largest of uniform keys, illegal ones at -1
                    random_actions = np.where(masks, self.rng.random(masks.shape), -1.0).argmax(axis=1)
                actions = np.where(rand, random_actions, actions)
        return actions, {Col.Q_VALUES: q}

    def bootstrap(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        return {Col.Q_VALUES: self.module(torch.from_numpy(obs)).numpy()}

    def to_env_actions(self, actions: np.ndarray) -> np.ndarray:
        return self._env_actions(actions)

    def get_weights(self) -> dict[str, np.ndarray]:
        return weights_to_numpy(self.module)

    def set_weights(self, weights: dict) -> None:
        load_numpy_weights(self.module, weights)


def predict_actions(
    policy,
    space,
    obs,
    state: np.ndarray | None,
    episode_start: np.ndarray | None,
    deterministic: bool,
    norm_stats=None,
    normalize=None,
    action_mask=None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(actions, state)`` of inference policy ``policy`` for one observation or a batch of
    ``space``'s; observations are normalized by ``norm_stats`` (frozen) when given. A recurrent
    policy starts from its initial state where ``state`` is None or ``episode_start`` is True.
    Actions are among the legal ones of ``action_mask`` (one row per observation, as the env's
    ``info["action_mask"]`` gives it) or of the observation's own ``"action_mask"`` entry."""
    single = is_single_obs(space, obs)
    batch = stack_obs([obs]) if single else obs
    rows = preprocess_obs(space, batch)
    if norm_stats is not None:  # the saved statistics, frozen
        rows = norm_stats.normalize_obs(rows, normalize.clip_obs, normalize.epsilon)
    kw = {}
    if action_mask is not None or has_mask_entry(space):
        info = {} if action_mask is None else {ACTION_MASK_KEY: np.asarray(action_mask).reshape(len(rows), -1)}
        width = check_maskable(policy.action_space, "an action mask")
        kw["masks"] = action_masks(space, batch, info, len(rows), width)
    with torch.inference_mode():
        if not getattr(policy, "recurrent", False):
            actions, _ = policy.act(rows, not deterministic, **kw)
            out_state = None
        else:
            n = len(rows)
            state = policy.initial_state(n) if state is None else np.array(state, dtype=np.float32).reshape(n, -1)
            if episode_start is not None:
                state[np.asarray(episode_start, dtype=bool).reshape(n)] = 0.0
            actions, extras = policy.act(rows, not deterministic, state, **kw)
            out_state = extras[STATE_OUT]
    actions = policy.to_env_actions(actions)
    if single:
        return actions[0], (None if out_state is None else out_state[0])
    return actions, out_state
