"""From spaces to modules: actor-critic and Q networks for Box/Discrete observations.

Each network is a torso (``model.torso``) followed by MLPs (``model.hiddens``). The torso is
nothing (``mlp``: the MLPs see flat rows) or a CNN for image-like Box observations: the DQN
Nature network, IMPALA's residual network, or the ``model.conv_filters`` layers (board games).

Observations reach the modules as flat rows ``(B, prod(obs_shape))``, as the rollout code
keeps them; a CNN torso restores the image shape itself, in the space's axis order
(``(C, H, W)`` or ``(H, W, C)``, see :func:`frame_layout`), and turns the rows of a uint8
space into floats in [0, 1] on the module's device, so that frames travel as bytes.

The torsos live in :mod:`shoal.models.torsos` and the MLP blocks in :mod:`shoal.models.layers`;
this module holds the networks built on them and re-exports the names imported from it.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from torch import nn

from shoal.errors import ConfigError, EnvError
from shoal.models.distributions import DiagGaussian, dist_class_for
from shoal.models.layers import ACTIVATION_FNS as ACTIVATION_FNS
from shoal.models.layers import mlp, run_mlp
from shoal.models.recurrent import LSTMCore
from shoal.models.torsos import DICT_TORSO as DICT_TORSO
from shoal.models.torsos import MAX_CHANNELS as MAX_CHANNELS
from shoal.models.torsos import TORSOS as TORSOS
from shoal.models.torsos import ConvTorso as ConvTorso
from shoal.models.torsos import DictTorso as DictTorso
from shoal.models.torsos import ImageTorso as ImageTorso
from shoal.models.torsos import ImpalaCNN as ImpalaCNN
from shoal.models.torsos import NatureCNN as NatureCNN
from shoal.models.torsos import _features, make_torso, resolve_torso
from shoal.models.torsos import _ScaledRows as _ScaledRows
from shoal.models.torsos import build_torso as build_torso
from shoal.models.torsos import float32_from_bytes as float32_from_bytes
from shoal.models.torsos import frame_layout as frame_layout
from shoal.spaces import flat_obs_dim, preprocess_obs  # noqa: F401  (preprocess_obs re-exported)


class ActorCritic(nn.Module):
    """Policy and value networks: a torso and MLPs each (separate by default), or one torso and
    one encoder MLP shared by both heads (``vf_share_layers``).

    ``forward(obs) -> (action_dist_inputs, values)``. For Box actions the log std is a
    state-independent parameter appended to the mean. ``pi_conv``/``vf_conv`` hold the torsos
    (None for ``mlp``; ``vf_conv`` is None when shared).

    With ``use_lstm`` an LSTM of ``lstm_cell_size`` units follows the MLP (one, or one per
    network when they are separate) and the module is ``recurrent``: ``unroll``, ``step`` and
    ``value_step`` take the state (``state_size`` floats per env) instead of ``forward``/``value``.
    """

    def __init__(
        self,
        obs_space: gym.Space,
        action_space: gym.Space,
        hiddens: list[int],
        activation: str = "tanh",
        vf_share_layers: bool = False,
        init_log_std: float = 0.0,
        conv_filters: list[list[int]] | None = None,
        torso: str = "auto",
        frame_layout: str = "auto",
        use_lstm: bool = False,
        lstm_cell_size: int = 256,
    ) -> None:
        super().__init__()
        self.obs_space, self.action_space = obs_space, action_space
        self.recurrent = use_lstm
        self.dist_cls = dist_class_for(action_space)
        self.torso = resolve_torso(obs_space, torso, conv_filters)
        # One torso in front of the shared encoder, or one per network when they are separate.
        self.pi_conv, in_dim = make_torso(obs_space, self.torso, conv_filters, activation, frame_layout)
        self.vf_conv = (
            None if vf_share_layers else make_torso(obs_space, self.torso, conv_filters, activation, frame_layout)[0]
        )
        self.gaussian = self.dist_cls is DiagGaussian
        n_out = int(action_space.shape[0]) if self.gaussian else self.dist_cls.num_inputs(action_space)
        last = hiddens[-1] if hiddens else in_dim
        self.vf_share_layers = vf_share_layers
        self.state_size = 0
        if use_lstm:  # torso -> hiddens -> LSTM -> heads, once shared or once per network
            self.encoder = mlp(in_dim, hiddens, activation)
            self.core = LSTMCore(last, lstm_cell_size)
            if not vf_share_layers:
                self.vf_encoder = mlp(in_dim, hiddens, activation)
                self.vf_core = LSTMCore(last, lstm_cell_size)
            self.pi_head = mlp(lstm_cell_size, [], activation, n_out, out_gain=0.01)
            self.vf_head = mlp(lstm_cell_size, [], activation, 1, out_gain=1.0)
            self.state_size = self.core.state_size * (1 if vf_share_layers else 2)
        elif vf_share_layers:
            self.encoder = mlp(in_dim, hiddens, activation)
            self.pi_head = mlp(last, [], activation, n_out, out_gain=0.01)
            self.vf_head = mlp(last, [], activation, 1, out_gain=1.0)
        else:
            self.pi = mlp(in_dim, hiddens, activation, n_out, out_gain=0.01)
            self.vf = mlp(in_dim, hiddens, activation, 1, out_gain=1.0)
        if self.gaussian:
            self.log_std = nn.Parameter(torch.full((n_out,), float(init_log_std)))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.recurrent:
            raise TypeError(
                "a recurrent ActorCritic (model.use_lstm) takes its state: call unroll(obs, state, starts, "
                "seq_len) or step(obs, state)"
            )
        pi_in = _features(self.pi_conv, obs)
        if self.vf_share_layers:
            h = run_mlp(self.encoder, pi_in)
            out, v = run_mlp(self.pi_head, h), run_mlp(self.vf_head, h)
        else:
            out, v = run_mlp(self.pi, pi_in), run_mlp(self.vf, _features(self.vf_conv, obs))
        if self.gaussian:
            out = torch.cat([out, self.log_std.expand_as(out)], dim=-1)
        return out, v.squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        if self.recurrent:
            raise TypeError("a recurrent ActorCritic (model.use_lstm) takes its state: call step(obs, state)")
        if self.vf_share_layers:
            return run_mlp(self.vf_head, run_mlp(self.encoder, _features(self.pi_conv, obs))).squeeze(-1)
        return run_mlp(self.vf, _features(self.vf_conv, obs)).squeeze(-1)

    # ---- recurrent (model.use_lstm): see shoal.models.recurrent ------------------------------
    def initial_state(self, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """``(n, state_size)`` zeros: the state before an episode's first step."""
        return torch.zeros(n, self.state_size, device=device)

    def unroll(
        self, obs: torch.Tensor, state: torch.Tensor, starts: torch.Tensor | None, seq_len: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The network over sequences: ``obs`` rows are ``B`` sequences of ``seq_len`` steps laid out
        one after another, ``state`` ``(B, state_size)`` the state at each sequence's start, and
        ``starts`` (rows, bool, or None) the rows before which the state is zeroed. Returns
        ``(action_dist_inputs, values, final_state)`` with one row of the first two per obs row."""
        cell = self.core.state_size
        out, final = self._branch(self.pi_conv, self.encoder, self.core, obs, state[:, :cell], starts, seq_len)
        if self.vf_share_layers:
            values = run_mlp(self.vf_head, out)
        else:
            vf_out, vf_final = self._branch(
                self.vf_conv, self.vf_encoder, self.vf_core, obs, state[:, cell:], starts, seq_len
            )
            values = run_mlp(self.vf_head, vf_out)
            final = torch.cat([final, vf_final], dim=1)
        inputs = run_mlp(self.pi_head, out)
        if self.gaussian:
            inputs = torch.cat([inputs, self.log_std.expand_as(inputs)], dim=-1)
        return inputs, values.squeeze(-1), final

    def step(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of ``B`` envs: ``unroll`` with sequences of length 1."""
        return self.unroll(obs, state, None, 1)

    def value_step(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Values of ``obs`` given each env's state (no action distribution, state not advanced)."""
        cell = self.core.state_size
        if self.vf_share_layers:
            out, _ = self._branch(self.pi_conv, self.encoder, self.core, obs, state[:, :cell], None, 1)
        else:
            out, _ = self._branch(self.vf_conv, self.vf_encoder, self.vf_core, obs, state[:, cell:], None, 1)
        return run_mlp(self.vf_head, out).squeeze(-1)

    @staticmethod
    def _branch(conv, encoder, core: LSTMCore, obs, state, starts, seq_len: int):
        x = run_mlp(encoder, _features(conv, obs))
        x = x.reshape(-1, seq_len, x.shape[-1])
        out, final = core(x, state, None if starts is None else starts.reshape(-1, seq_len))
        return out.reshape(-1, core.cell_size), final


def _torso_kwargs(model_config) -> dict:
    return dict(
        conv_filters=model_config.conv_filters, torso=model_config.torso, frame_layout=model_config.frame_layout
    )


BYTES_PER_PARAMETER = 16  # float32 weights, their gradients and Adam's two moments


def check_model_size(model_config: Any, obs_space: gym.Space | None) -> None:
    """ConfigError before any layer is allocated when the MLP (and LSTM) the model section describes
    cannot fit in the memory available: two such networks (policy and value, or online and target)."""
    from shoal import process
    from shoal.process import GB

    if model_config is None or getattr(model_config, "custom", None):
        return
    try:
        in_dim = flat_obs_dim(obs_space) if obs_space is not None else 1
    except EnvError:  # a space no network takes is reported where the network is built
        in_dim = 1
    dims = [in_dim, *model_config.hiddens]
    params = sum(a * b for a, b in zip(dims, dims[1:]))
    if getattr(model_config, "use_lstm", False):
        c = model_config.lstm_cell_size
        params += 4 * c * (dims[-1] + c)
    needed, avail = 2 * params * BYTES_PER_PARAMETER, process.available_memory_bytes()
    if avail is None or needed <= avail:
        return
    lstm = (
        f" and model.lstm_cell_size={model_config.lstm_cell_size}" if getattr(model_config, "use_lstm", False) else ""
    )
    raise ConfigError(
        f"model.hiddens={list(model_config.hiddens)}{lstm} describe networks of about {params:,} "
        f"parameters each: about {needed / GB:,.1f} GB with gradients and optimizer state, and this machine "
        f"has {avail / GB:.1f} GB available. Typical layer sizes are 64 to 1024; nothing was built."
    )


def build_actor_critic(obs_space: gym.Space, action_space: gym.Space, model_config) -> nn.Module:
    """shoal's :class:`ActorCritic` as the model section describes it, or the ``model.custom`` class."""
    if getattr(model_config, "custom", None):
        from shoal.models.custom import CustomActorCritic

        return CustomActorCritic(obs_space, action_space, model_config)
    return ActorCritic(
        obs_space,
        action_space,
        hiddens=list(model_config.hiddens),
        activation=model_config.activation,
        vf_share_layers=model_config.vf_share_layers,
        init_log_std=model_config.init_log_std,
        use_lstm=model_config.use_lstm,
        lstm_cell_size=model_config.lstm_cell_size,
        **_torso_kwargs(model_config),
    )


class QNetwork(nn.Module):
    """Q(s, .) for Discrete actions: a torso (``conv``, None for ``mlp``), an encoder MLP, and a head;
    ``dueling`` splits the head into V(s) + A(s, a) - mean_a A(s, a)."""

    def __init__(
        self,
        obs_space: gym.Space,
        action_space: gym.Space,
        hiddens: list[int],
        activation: str = "relu",
        dueling: bool = True,
        conv_filters: list[list[int]] | None = None,
        torso: str = "auto",
        frame_layout: str = "auto",
    ) -> None:
        super().__init__()
        if not isinstance(action_space, gym.spaces.Discrete):
            raise TypeError(f"Q-learning needs a Discrete action space, got {action_space}")
        self.torso = resolve_torso(obs_space, torso, conv_filters)
        self.conv, in_dim = make_torso(obs_space, self.torso, conv_filters, activation, frame_layout)
        n = int(action_space.n)
        last = hiddens[-1] if hiddens else in_dim
        self.dueling = dueling
        self.encoder = mlp(in_dim, hiddens, activation)
        self.adv_head = mlp(last, [], activation, n, out_gain=0.01)
        self.v_head = mlp(last, [], activation, 1, out_gain=1.0) if dueling else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = run_mlp(self.encoder, _features(self.conv, obs))
        adv = run_mlp(self.adv_head, h)
        if not self.dueling:
            return adv
        return run_mlp(self.v_head, h) + adv - adv.mean(dim=-1, keepdim=True)


def build_q_network(obs_space: gym.Space, action_space: gym.Space, model_config, dueling: bool = True) -> nn.Module:
    """shoal's :class:`QNetwork`, or the ``model.custom`` class (``dueling`` is then the class's own business)."""
    if getattr(model_config, "custom", None):
        from shoal.models.custom import CustomQNetwork

        return CustomQNetwork(obs_space, action_space, model_config)
    return QNetwork(
        obs_space,
        action_space,
        list(model_config.hiddens),
        model_config.activation,
        dueling,
        **_torso_kwargs(model_config),
    )
