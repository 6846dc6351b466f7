"""Your own network in place of shoal's (``model.custom: "package.module:ClassName"``).

The class is imported by its path in every process that builds the model (the driver, each
rollout actor, each learner), so it works across Ray actors as long as the module is importable
there (installed, or under the directory you start shoal from). Checkpoints hold its weights,
never its code.

**Actor-critic models** (PPO, DD-PPO, IMPALA, APPO, alpha_star) are constructed as
``ClassName(obs_space, action_space, num_outputs, **model.custom_kwargs)`` and must be a
``torch.nn.Module`` whose ``forward(obs)`` returns ``(action_dist_inputs, values)``:

- ``obs``: a batch ``(B, *obs_space.shape)`` for Box observations (uint8 frames stay uint8:
  scale them yourself), one-hot rows ``(B, n)`` for Discrete ones, and for Dict and Tuple ones
  the rows of :func:`shoal.spaces.preprocess_obs` (float32; with image entries one packed uint8
  row, which :class:`shoal.models.catalog.DictTorso` turns into features);
- ``action_dist_inputs``: ``(B, num_outputs)``: logits for Discrete actions (``num_outputs = n``),
  mean and log standard deviation side by side for Box actions (``num_outputs = 2 * dim``);
- ``values``: ``(B,)`` (or ``(B, 1)``), the state value.

Optionally ``value(obs) -> (B,)`` (computed from ``forward`` otherwise).

**Recurrent models** set ``recurrent = True`` and ``state_size`` (floats of state per env) and
define ``unroll(obs, state, starts, seq_len) -> (action_dist_inputs, values, final_state)``:
``obs`` holds ``S`` sequences of ``seq_len`` steps one after another (``S * seq_len`` rows),
``state`` is ``(S, state_size)`` at each sequence's start, ``starts`` (rows, bool, or None) marks
the steps before which the state must be zeroed (a new episode), and ``final_state`` is the
state after each sequence. Zeros are the initial state unless the class defines
``initial_state(n)``. shoal carries the state, resets it and stores it with the sequences.

**Q models** (DQN, Ape-X) are constructed the same way (``num_outputs`` = the number of
actions) and ``forward(obs)`` returns Q-values ``(B, num_outputs)``.

A model that cannot be imported or built, lacks a method it needs, or returns the wrong shapes
for a batch of two sampled observations is a :class:`~shoal.errors.ConfigError` at build time
that says what was expected.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from shoal.errors import ConfigError
from shoal.models.distributions import dist_class_for


def load_custom_class(path: str) -> type:
    from shoal.imports import import_path

    try:
        cls = import_path(path)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(
            f"model.custom '{path}' cannot be imported: {e}. It must be 'package.module:ClassName' "
            "for a module importable in every shoal process."
        ) from None
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise ConfigError(f"model.custom '{path}' names {cls!r}, not a torch.nn.Module subclass.")
    return cls


def _construct(
    path: str, obs_space: gym.Space, action_space: gym.Space, num_outputs: int, kwargs: dict[str, Any]
) -> nn.Module:
    cls = load_custom_class(path)
    try:
        return cls(obs_space, action_space, num_outputs, **kwargs)
    except TypeError as e:
        raise ConfigError(
            f"model.custom '{path}' could not be constructed as {cls.__name__}(obs_space, "
            f"action_space, num_outputs, **model.custom_kwargs) with custom_kwargs {kwargs}: {e}"
        ) from None


def _sample_obs(obs_space: gym.Space) -> torch.Tensor:
    from shoal.spaces import preprocess_obs, stack_obs

    rows = preprocess_obs(obs_space, stack_obs([obs_space.sample(), obs_space.sample()]))
    return torch.from_numpy(np.ascontiguousarray(rows))


class _Adapter(nn.Module):
    """What shoal calls on a model, over the user's ``net`` (observation rows -> the space's shape)."""

    def __init__(self, net: nn.Module, obs_space: gym.Space, path: str) -> None:
        super().__init__()
        self.net, self.path = net, path
        self._shape = tuple(obs_space.shape) if isinstance(obs_space, gym.spaces.Box) else None

    def _obs(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.reshape(obs.shape[0], *self._shape) if self._shape is not None else obs

    def _fail(self, what: str) -> ConfigError:
        return ConfigError(f"model.custom '{self.path}' ({type(self.net).__name__}): {what}")


class CustomActorCritic(_Adapter):
    """shoal's actor-critic interface (``forward``/``value``, or ``unroll``/``step``/``value_step``
    when recurrent) over a user's network; checked on two sampled observations when built."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, model_config) -> None:
        self.dist_cls = dist_class_for(action_space)
        self.num_outputs = int(self.dist_cls.num_inputs(action_space))
        net = _construct(
            model_config.custom, obs_space, action_space, self.num_outputs, dict(model_config.custom_kwargs)
        )
        super().__init__(net, obs_space, model_config.custom)
        self.obs_space, self.action_space = obs_space, action_space
        self.recurrent = bool(getattr(net, "recurrent", False))
        self.state_size = 0
        if self.recurrent:
            size = getattr(net, "state_size", None)
            if not isinstance(size, int) or size < 1:
                raise self._fail(
                    f"a recurrent model (recurrent = True) needs an integer state_size >= 1; got {size!r}."
                )
            if not callable(getattr(net, "unroll", None)):
                raise self._fail(
                    "a recurrent model (recurrent = True) needs unroll(obs, state, starts, seq_len) -> "
                    "(action_dist_inputs, values, final_state)."
                )
            self.state_size = size
        self._check(obs_space)

    def _check(self, obs_space: gym.Space) -> None:
        obs = _sample_obs(obs_space)
        expect = f"(action_dist_inputs of shape (B, {self.num_outputs}), values of shape (B,))" + (
            " and the final state (B, state_size)" if self.recurrent else ""
        )
        try:
            with torch.no_grad():
                if self.recurrent:
                    out = self.net.unroll(self._obs(obs), self.initial_state(2), None, 1)
                else:
                    out = self.net(self._obs(obs))
        except Exception as e:  # the user's code: report it as a build error with the model's name
            raise self._fail(
                f"{'unroll' if self.recurrent else 'forward'} failed on a batch of 2 sampled "
                f"observations: {type(e).__name__}: {e}"
            ) from e
        n = 3 if self.recurrent else 2
        if not isinstance(out, (tuple, list)) or len(out) != n or not all(isinstance(t, torch.Tensor) for t in out):
            raise self._fail(f"must return {n} tensors {expect}; got {type(out).__name__}.")
        inputs, values = out[0], out[1]
        if tuple(inputs.shape) != (2, self.num_outputs):
            raise self._fail(
                f"action_dist_inputs for a batch of 2 must have shape (2, {self.num_outputs}) "
                f"({self._outputs_meaning()}); got {tuple(inputs.shape)}."
            )
        if values.numel() != 2 or values.shape[0] != 2:
            raise self._fail(f"values for a batch of 2 must have shape (2,) or (2, 1); got {tuple(values.shape)}.")
        if self.recurrent and tuple(out[2].shape) != (2, self.state_size):
            raise self._fail(
                f"the final state for a batch of 2 must have shape (2, {self.state_size}) (state_size); "
                f"got {tuple(out[2].shape)}."
            )

    def _outputs_meaning(self) -> str:
        if isinstance(self.action_space, gym.spaces.Discrete):
            return f"one logit per action of {self.action_space}"
        return f"mean and log std for each of the {self.num_outputs // 2} action dimensions"

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.recurrent:
            raise TypeError(
                "a recurrent model takes its state: call unroll(obs, state, starts, seq_len) or step(obs, state)"
            )
        inputs, values = self.net(self._obs(obs))
        return inputs, values.reshape(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        if hasattr(self.net, "value"):
            return self.net.value(self._obs(obs)).reshape(-1)
        return self.forward(obs)[1]

    def initial_state(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        if hasattr(self.net, "initial_state"):
            return torch.as_tensor(self.net.initial_state(n), dtype=torch.float32, device=device)
        return torch.zeros(n, self.state_size, device=device)

    def unroll(
        self, obs: torch.Tensor, state: torch.Tensor, starts: torch.Tensor | None, seq_len: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        inputs, values, final = self.net.unroll(self._obs(obs), state, starts, seq_len)
        return inputs, values.reshape(-1), final

    def step(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.unroll(obs, state, None, 1)

    def value_step(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.step(obs, state)[1]


class CustomQNetwork(_Adapter):
    """shoal's Q-network interface over a user's network: ``forward(obs) -> (B, num_actions)``."""

    def __init__(self, obs_space: gym.Space, action_space: gym.Space, model_config) -> None:
        if not isinstance(action_space, gym.spaces.Discrete):
            raise TypeError(f"Q-learning needs a Discrete action space, got {action_space}")
        self.num_outputs = int(action_space.n)
        net = _construct(
            model_config.custom, obs_space, action_space, self.num_outputs, dict(model_config.custom_kwargs)
        )
        super().__init__(net, obs_space, model_config.custom)
        obs = _sample_obs(obs_space)
        try:
            with torch.no_grad():
                q = self.net(self._obs(obs))
        except Exception as e:  # the user's code
            raise self._fail(f"forward failed on a batch of 2 sampled observations: {type(e).__name__}: {e}") from e
        if not isinstance(q, torch.Tensor) or tuple(q.shape) != (2, self.num_outputs):
            got = tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__
            raise self._fail(
                f"a Q model's forward must return Q-values of shape (B, {self.num_outputs}), one per "
                f"action; for a batch of 2 it returned {got}."
            )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(self._obs(obs))
