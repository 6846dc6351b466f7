"""A checkpoint's policy as a TorchScript or ONNX file, for deployment without shoal.

The exported model takes **raw env observations**, a batch of them (any batch size), and does
the preprocessing shoal does in front of the network itself:

- ``obs``: ``(B, *observation_space.shape)`` in the space's dtype (uint8 frames stay uint8 and
  are scaled to [0, 1] inside, other Box observations are float32); a ``Discrete``
  observation is ``(B,)`` int64, one-hot encoded inside. A ``Dict`` or ``Tuple`` observation
  is the row shoal makes of it (:func:`shoal.spaces.preprocess_obs`): float32 entries one after
  another (Discrete ones one-hot), or, with image entries, one uint8 row of the images' bytes
  and then the other entries' float32 bytes; the sidecar's ``row_layout`` says where each entry
  goes. An ``"action_mask"`` entry is not part of the row: apply it to the outputs yourself.
- a recurrent model (``model.use_lstm``) also takes ``state``: ``(B, state_size)`` float32,
  zeros at an episode's start, and returns the next one.

Its outputs, in order (names as in the sidecar JSON):

- actor-critic models (PPO, IMPALA, APPO, DD-PPO): ``action`` (the greedy one: argmax of
  the logits, per component for MultiDiscrete, logits > 0 for MultiBinary, or the Gaussian
  mean clipped to the action bounds; Discrete and MultiDiscrete indices shifted by the space's
  ``start``), ``dist_inputs`` (logits; mean and log std for Box actions), ``value``, then
  ``state_out`` when recurrent;
- Q networks (DQN, Ape-X): ``action`` (argmax), ``q_values``;
- SAC's squashed Gaussian actor: ``action`` (``tanh`` of the mean, scaled to the action
  bounds), ``dist_inputs`` (the pre-squash mean and log std); Ape-X TD3's deterministic actor
  the same, its log std 0.

Next to the file, ``<file>.json`` records the format, the input and output names, the
observation shape and dtype, the action space and the state size.
"""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from shoal import checkpoint as ckpt
from shoal.errors import ConfigError, ShoalError
from shoal.models.catalog import DictTorso
from shoal.spaces import flat_obs_dim, image_entries, preprocess_obs, row_layout, stack_obs

FORMATS = ("torchscript", "onnx")
_SUFFIX = {"torchscript": ".pt", "onnx": ".onnx"}


class ExportedPolicy(nn.Module):
    """Raw observations in, ``(action, dist_inputs or q_values, [value], [state])`` out; see the module doc."""

    module: Any  # a shoal network: an actor-critic (``step``, ``state_size`` when recurrent), a Q network or an actor
    action_start: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor

    def __init__(self, module: nn.Module, obs_space: gym.Space, action_space: gym.Space) -> None:
        super().__init__()
        self.module = module
        self.space = obs_space
        for m in module.modules():  # Dict torsos: no dtype view in the traced graph
            if isinstance(m, DictTorso):
                m.bitcast = False
        self.squashed = bool(getattr(module, "squashed_gaussian", False))
        self.q_network = not hasattr(module, "dist_cls") and not self.squashed
        self.recurrent = bool(getattr(module, "recurrent", False))
        discrete = obs_space if isinstance(obs_space, gym.spaces.Discrete) else None
        self.discrete_obs = discrete is not None
        self.obs_n = int(discrete.n) if discrete is not None else 0
        self.obs_start = int(discrete.start) if discrete is not None else 0
        self.structured = isinstance(obs_space, (gym.spaces.Dict, gym.spaces.Tuple))  # rows come ready made
        if self.structured:
            self.uint8 = bool(image_entries(obs_space))
        else:
            self.uint8 = not self.discrete_obs and obs_space.dtype == np.uint8
        self.box_actions = isinstance(action_space, gym.spaces.Box)
        self.binary_actions = isinstance(action_space, gym.spaces.MultiBinary)
        self.nvec = [int(n) for n in action_space.nvec] if isinstance(action_space, gym.spaces.MultiDiscrete) else []
        start = getattr(action_space, "start", None)
        self.register_buffer(
            "action_start", torch.as_tensor(np.asarray(0 if start is None else start), dtype=torch.int64)
        )
        if isinstance(action_space, gym.spaces.Box):
            self.register_buffer("low", torch.as_tensor(action_space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(action_space.high, dtype=torch.float32))

    def rows(self, obs: torch.Tensor) -> torch.Tensor:
        """What :func:`shoal.models.catalog.preprocess_obs` makes of raw observations."""
        if self.discrete_obs:
            return nn.functional.one_hot(obs.long() - self.obs_start, self.obs_n).float()
        if self.structured:
            return obs if self.uint8 else obs.float()
        x = obs.flatten(1) if obs.dim() > 2 else obs
        return x if self.uint8 else x.float()

    def forward(self, obs: torch.Tensor, state: torch.Tensor | None = None):
        rows = self.rows(obs)
        if self.q_network:
            q = self.module(rows)
            return q.argmax(-1) + self.action_start, q
        if self.squashed:
            mu, log_std = self.module(rows)
            action = self.low + (torch.tanh(mu) + 1.0) * 0.5 * (self.high - self.low)
            return action, torch.cat([mu, log_std], dim=-1)
        if self.recurrent:
            inputs, values, state_out = self.module.step(rows, state)
        else:
            inputs, values = self.module(rows)
        if self.box_actions:
            mean = inputs[:, : inputs.shape[-1] // 2]
            action = torch.maximum(torch.minimum(mean, self.high), self.low)
        elif self.binary_actions:
            action = (inputs > 0).to(torch.int8)
        elif self.nvec:
            action = torch.stack([part.argmax(-1) for part in inputs.split(self.nvec, dim=-1)], -1) + self.action_start
        else:
            action = inputs.argmax(-1) + self.action_start
        if self.recurrent:
            return action, inputs, values, state_out
        return action, inputs, values


def exported_signature(model: ExportedPolicy) -> tuple[list[str], list[str]]:
    """The input and output names of ``model``."""
    inputs = ["obs", "state"] if model.recurrent else ["obs"]
    if model.q_network:
        return inputs, ["action", "q_values"]
    if model.squashed:
        return inputs, ["action", "dist_inputs"]
    return inputs, ["action", "dist_inputs", "value"] + (["state_out"] if model.recurrent else [])


def policy_model(algo) -> ExportedPolicy:
    """The exportable module of ``algo``'s single-agent policy, with its current weights."""
    if algo.policy_cls is None or getattr(algo, "is_multi_agent", False):
        raise ConfigError(
            f"shoal export serves single-agent policies; a {type(algo).__name__} checkpoint (several "
            "policies, a multi-agent env) has none to export."
        )
    space, action_space = algo.env_info.observation_space, algo.env_info.action_space
    if not isinstance(space, (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.Dict, gym.spaces.Tuple)):
        raise ConfigError(
            f"shoal export takes Box, Discrete, Dict and Tuple observations; this policy observes {space}."
        )
    policy = algo.policy_cls(space, action_space, algo.config, algo.config.seed)
    policy.set_weights(algo.get_weights())
    for param in policy.module.parameters():
        param.requires_grad_(False)  # inference only: the exported outputs carry no autograd history
    return ExportedPolicy(policy.module, space, action_space).eval()


def example_inputs(model: ExportedPolicy, space: gym.Space, batch: int = 2, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """A batch of random observations (and zero states) of the shapes and dtypes the model takes."""
    rng = np.random.default_rng(seed)
    if model.structured:  # rows as shoal makes them from the space's samples
        space.seed(seed)
        obs = torch.as_tensor(preprocess_obs(space, stack_obs([space.sample() for _ in range(batch)])))
    elif model.discrete_obs:
        obs = torch.as_tensor(rng.integers(model.obs_start, model.obs_start + model.obs_n, size=batch))
    elif isinstance(space, gym.spaces.Box):
        low = np.broadcast_to(np.maximum(space.low, -10.0), space.shape)
        high = np.broadcast_to(np.minimum(space.high, 10.0), space.shape)
        raw = rng.uniform(low, high, size=(batch, *space.shape))
        obs = torch.as_tensor(raw.round() if model.uint8 else raw, dtype=torch.uint8 if model.uint8 else torch.float32)
    else:
        raise ConfigError(
            f"shoal export takes Box, Discrete, Dict and Tuple observations; this policy observes {space}."
        )
    if not model.recurrent:
        return (obs,)
    return obs, torch.zeros(batch, model.module.state_size)


# ---- writing the files ------------------------------------------------------------------------
def _to_torchscript(model: ExportedPolicy, inputs: tuple[torch.Tensor, ...], out: Path) -> None:
    """Trace the model (checked on a second batch of another size) and save it."""
    with torch.no_grad(), warnings.catch_warnings():
        # torch 2.9+ marks torch.jit deprecated; nn.LSTM's argument checks warn while being traced
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(model, inputs, check_inputs=[example_inputs(model, model.space, 5, seed=1)])
        torch.jit.save(traced, str(out))


@contextlib.contextmanager
def _quiet_logger(name: str):
    """``logging.getLogger(name)`` passes only errors while the block runs."""
    import logging

    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _to_onnx(model: ExportedPolicy, inputs: tuple[torch.Tensor, ...], out: Path) -> None:
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise ShoalError(
            "shoal export --format onnx needs onnx and onnxscript: pip install -e '.[export]' in the shoal checkout."
        ) from None
    names_in, names_out = exported_signature(model)
    batch = torch.export.Dim("batch", min=1)
    dynamic = {name: {0: batch} for name in names_in}
    # The exporter narrates its passes on stdout, warns about its own internals (deprecations in
    # torch._dynamo, LSTM weights assigned while tracing) and logs that torchvision's operators
    # are skipped when torchvision is absent: none of it is the user's to act on.
    with (
        torch.no_grad(),
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        _quiet_logger("torch.onnx._internal.exporter._registration"),
    ):
        for category in (DeprecationWarning, FutureWarning, UserWarning):
            warnings.simplefilter("ignore", category)
        program = torch.onnx.export(
            model,
            inputs,
            dynamo=True,
            input_names=names_in,
            output_names=names_out,
            dynamic_shapes=dynamic,
            verbose=False,
        )
        if program is None:  # never with dynamo=True (None is the legacy exporter's return)
            raise ShoalError("torch.onnx.export returned no ONNX program to save.")
        program.save(str(out))


def export_policy(
    path: str | Path | ckpt.OpenedCheckpoint,
    format: str = "torchscript",
    out: str | Path | None = None,
    trust: bool = False,
) -> Path:
    """Export the policy of checkpoint (a run directory: its best; or a checkpoint opened by
    :func:`shoal.checkpoint.open_checkpoint`) ``path`` to ``out``; returns the file written.

    ``format`` is ``torchscript`` (``torch.jit.load`` runs it) or ``onnx`` (onnxruntime runs it,
    with a dynamic batch axis). ``out`` defaults to ``policy.pt`` / ``policy.onnx`` in the
    checkpoint directory. A sidecar ``<out>.json`` describes inputs and outputs. ``trust``: import
    the code the checkpoint's config names even if it is not signed with your key (:mod:`shoal.trust`).
    """
    from shoal.app.evaluation import load_for_evaluation

    if format not in FORMATS:
        raise ConfigError(f"Unknown export format {format!r}; choose one of {', '.join(FORMATS)}.")
    opened = ckpt.open_checkpoint(path, prefer="best")
    p, algo = opened.path, load_for_evaluation(opened, trust=trust)
    del opened  # the state it loaded is the algorithm's now: not kept twice while exporting
    try:
        model = policy_model(algo)
        space, action_space = algo.env_info.observation_space, algo.env_info.action_space
    finally:
        algo.stop()
    target = Path(out) if out is not None else p / f"policy{_SUFFIX[format]}"
    target.parent.mkdir(parents=True, exist_ok=True)
    inputs = example_inputs(model, space)
    (_to_torchscript if format == "torchscript" else _to_onnx)(model, inputs, target)
    sidecar_path(target).write_text(json.dumps(sidecar(model, format, space, action_space, p), indent=2))
    return target


def sidecar_path(out: str | Path) -> Path:
    """Where the description of exported file ``out`` goes: ``<out>.json``."""
    out = Path(out)
    return out.with_name(out.name + ".json")


def sidecar(
    model: ExportedPolicy, format: str, space: gym.Space, action_space: gym.Space, checkpoint: Path
) -> dict[str, Any]:
    names_in, names_out = exported_signature(model)
    obs_shape = [flat_obs_dim(space)] if model.structured else list(space.shape or ())  # Discrete: ()
    obs_dtype = "int64" if model.discrete_obs else ("uint8" if model.uint8 else "float32")
    layout = {"row_layout": row_layout(space)} if model.structured else {}
    return {
        "format": format,
        "checkpoint": str(checkpoint),
        "inputs": names_in,
        "outputs": names_out,
        "observation": {"shape": obs_shape, "dtype": obs_dtype, "space": str(space), **layout},
        "action_space": _space_json(action_space),
        "state_size": int(model.module.state_size) if model.recurrent else 0,
        "batch_axis": 0,
    }


def _space_json(space: gym.Space) -> dict[str, Any]:
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "Box",
            "shape": list(space.shape),
            "low": np.asarray(space.low).tolist(),
            "high": np.asarray(space.high).tolist(),
        }
    return {"type": type(space).__name__, "repr": str(space)}


__all__ = [
    "ExportedPolicy",
    "FORMATS",
    "example_inputs",
    "export_policy",
    "exported_signature",
    "policy_model",
    "sidecar_path",
]
