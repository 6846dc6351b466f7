"""From spaces to modules: actor-critic and Q networks for Box/Discrete observations.

Each network is a torso (``model.torso``) followed by MLPs (``model.hiddens``). The torso is
nothing (``mlp``: the MLPs see flat rows) or a CNN for image-like Box observations: the DQN
Nature network, IMPALA's residual network, or the ``model.conv_filters`` layers (board games).

Observations reach the modules as flat rows ``(B, prod(obs_shape))``, as the rollout code
keeps them; a CNN torso restores the image shape itself, in the space's axis order
(``(C, H, W)`` or ``(H, W, C)``, see :func:`frame_layout`), and turns the rows of a uint8
space into floats in [0, 1] on the module's device, so that frames travel as bytes.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from shoal.errors import ConfigError, EnvError
from shoal.models.distributions import DiagGaussian, dist_class_for
from shoal.models.recurrent import LSTMCore
from shoal.spaces import flat_obs_dim, image_entries, preprocess_obs, vector_dim  # noqa: F401  (preprocess_obs re-exported)

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}
TORSOS = ("mlp", "nature_cnn", "impala_cnn", "conv")
MAX_CHANNELS = 16  # the longest axis frame_layout takes for channels
DICT_TORSO = "dict"  # resolve_torso's kind for auto on a Dict or Tuple with image entries: a DictTorso


def mlp(
    in_dim: int, hiddens: list[int], activation: str, out_dim: int | None = None, out_gain: float = 1.0
) -> nn.Sequential:
    """Orthogonally initialised MLP; the output layer (if any) gets ``out_gain``."""
    layers: list[nn.Module] = []
    d = in_dim
    for h in hiddens:
        layers += [_init(nn.Linear(d, h)), _ACTIVATIONS[activation]()]
        d = h
    if out_dim is not None:
        layers.append(_init(nn.Linear(d, out_dim), out_gain))
    return nn.Sequential(*layers)


def _init(layer: nn.Linear | nn.Conv2d, gain: float = np.sqrt(2)) -> nn.Linear | nn.Conv2d:
    nn.init.orthogonal_(layer.weight, gain=gain)
    nn.init.zeros_(layer.bias)
    return layer


_FUNCTIONAL = {nn.Tanh: torch.tanh, nn.ReLU: torch.relu, nn.ELU: F.elu}
ACTIVATION_FNS = {name: _FUNCTIONAL[layer] for name, layer in _ACTIVATIONS.items()}  # by config name


def run_mlp(seq: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """``seq(x)`` without nn.Module call overhead (~3 us a layer; it adds up per env step).

    Takes the Linear and Conv2d layers and activations that :func:`mlp` and :class:`ConvTorso` make.
    """
    for layer in seq:
        kind = type(layer)
        if kind is nn.Linear:
            x = F.linear(x, layer.weight, layer.bias)
        elif kind is nn.Conv2d:
            w = layer.weight
            if layer.padding == (0, 0) and x.shape[-2:] == w.shape[-2:]:
                # The kernel covers the whole map (a 1x1 output, e.g. [256, 9, 1] on 9x9): the same sums
                # as one matmul, whose backward is ~3x faster on CPU than conv2d's (benchmarks/README.md).
                x = F.linear(x.flatten(1), w.flatten(1), layer.bias)[:, :, None, None]
            else:
                x = F.conv2d(x, w, layer.bias, layer.stride, layer.padding)
        else:
            x = _FUNCTIONAL[kind](x)
    return x


# ---- image observations -------------------------------------------------------------------
def frame_layout(shape: tuple[int, ...], layout: str = "auto") -> str:
    """``channels_first`` (C, H, W) or ``channels_last`` (H, W, C) for an image observation shape.

    ``auto`` takes the first or the last axis as the channels when it is at most 16 long and
    shorter than both other axes (Atari's (4, 84, 84) stack, connect four's (6, 7, 2) planes);
    a shape where neither qualifies (both cannot) is an error that asks for ``model.frame_layout``.
    """
    if layout in ("channels_first", "channels_last"):
        return layout
    if layout != "auto":
        raise ConfigError(f"model.frame_layout must be auto, channels_first or channels_last; got '{layout}'.")
    if shape[0] <= MAX_CHANNELS and shape[0] < min(shape[1], shape[2]):
        return "channels_first"
    if shape[2] <= MAX_CHANNELS and shape[2] < min(shape[0], shape[1]):
        return "channels_last"
    raise ConfigError(
        f"Cannot tell the channel axis of image observations of shape {tuple(shape)}: neither the "
        f"first nor the last axis is at most {MAX_CHANNELS} long and shorter than the other two. "
        "Set model.frame_layout: channels_first for (C, H, W) frames or channels_last for (H, W, C) "
        "frames."
    )


def _uint8_image(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and space.dtype == np.uint8


def resolve_torso(obs_space: gym.Space, torso: str = "auto", conv_filters: list[list[int]] | None = None) -> str:
    """The torso kind ``model.torso`` names for ``obs_space``: ``auto`` becomes ``conv`` when conv_filters
    is set, ``dict`` (:data:`DICT_TORSO`) for a Dict or Tuple observation with image entries (each
    image's torso chosen as for a whole image), ``nature_cnn`` for a 3-d uint8 Box whose frames the
    Nature network fits (at least 36x36, judged by the two longest axes), ``mlp`` otherwise.

    The answer is a kind for :func:`make_torso`, not a ``model.torso`` value: ``dict`` is no such
    value, so it is not resolved again."""
    if conv_filters and torso not in ("auto", "conv"):
        raise ConfigError(
            f"model.conv_filters is set, but model.torso is '{torso}': conv_filters are the layers of "
            "the 'conv' torso. Set model.torso to conv (or auto), or leave model.conv_filters empty."
        )
    if torso == "conv" and not conv_filters:
        raise ConfigError(
            "model.torso 'conv' needs its layers in model.conv_filters ([[out_channels, kernel, stride], "
            "...]); for a ready-made network use torso nature_cnn or impala_cnn."
        )
    if torso != "auto":
        if torso not in TORSOS:
            raise ConfigError(f"model.torso must be auto or one of {', '.join(TORSOS)}; got '{torso}'.")
        return torso
    if conv_filters:
        return "conv"
    if image_entries(obs_space):
        return DICT_TORSO
    if _uint8_image(obs_space) and sorted(obs_space.shape)[1] >= NatureCNN.MIN_SIZE:
        return "nature_cnn"
    return "mlp"


class ImageTorso(nn.Module):
    """Base of the CNN torsos: flat rows back to float ``(B, C, H, W)`` images (:meth:`images`).

    ``out_dim`` is the width of the features ``forward`` returns, ``(B, out_dim)``.
    """

    name = ""  # what the error messages call the torso
    _other_observations = "Use model.torso: mlp for other observations."  # the end of the wrong-space error
    _too_small = ""  # the end of the kernel-does-not-fit error

    def __init__(self, obs_space: gym.Space, layout: str = "auto") -> None:
        super().__init__()
        shape = getattr(obs_space, "shape", None)
        if not isinstance(obs_space, gym.spaces.Box) or shape is None or len(shape) != 3:
            raise ConfigError(
                f"{self.name} needs an image-like Box observation of shape (H, W, C) or (C, H, W); "
                f"got {obs_space}. {self._other_observations}"
            )
        self.shape = tuple(int(d) for d in shape)
        self.layout = frame_layout(self.shape, layout)
        self.channels_last = self.layout == "channels_last"
        c_first = (self.shape[2], self.shape[0], self.shape[1]) if self.channels_last else self.shape
        self.in_channels, self.height, self.width = c_first
        # uint8 frames become [0, 1] floats: by the space's high, whatever dtype the rows arrive in.
        high = float(np.max(obs_space.high)) if obs_space.dtype == np.uint8 else 1.0
        self.scale = 1.0 / high if high > 0 else 1.0

    def images(self, obs: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` float32 images from flat rows (or from images in the space's layout).

        On the CPU they are channels-last in memory whatever the space's layout: oneDNN's
        convolutions run 1.5x (training) to 2x (IMPALA CNN inference) faster on that than on
        channel-first frames. Elsewhere the memory keeps the order the rows arrive in.
        """
        x = obs.reshape(obs.shape[0], *self.shape)
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        fmt = torch.channels_last if x.is_cpu else torch.preserve_format
        if x.dtype is not torch.float32:  # uint8 frames: cast here, on the module's device
            x = x.to(torch.float32, memory_format=fmt)
            if self.scale != 1.0:
                x.mul_(self.scale)  # a fresh tensor: scaling it in place spares an allocation
            return x
        if self.scale != 1.0:
            x = x * self.scale
        return x.contiguous(memory_format=torch.channels_last) if x.is_cpu else x

    def _fits(self, kernel: int, stride: int, padding: int, h: int, w: int, what: str) -> tuple[int, int]:
        if kernel > h + 2 * padding or kernel > w + 2 * padding:
            raise ConfigError(
                f"{what}: a {kernel}x{kernel} kernel does not fit the {h}x{w} feature map of "
                f"observation shape {self.shape} ({self.layout}). {self._too_small}"
            )
        return (h + 2 * padding - kernel) // stride + 1, (w + 2 * padding - kernel) // stride + 1


class ConvTorso(ImageTorso):
    """Convolutions over flattened image observations (``model.conv_filters``), flattened again at the end.

    ``filters`` is a list of ``[out_channels, kernel, stride]`` without padding, each followed by
    ``activation``. Board games' ``(H, W, C)`` planes are what it was made for.
    """

    name = "model.conv_filters"
    _other_observations = "Leave conv_filters empty for other observations."

    def __init__(self, obs_space: gym.Space, filters: list[list[int]], activation: str, layout: str = "auto") -> None:
        super().__init__(obs_space, layout)
        c, h, w = self.in_channels, self.height, self.width
        layers: list[nn.Module] = []
        for out_ch, k, stride in filters:
            h, w = self._fits(k, stride, 0, h, w, "model.conv_filters")
            layers += [_init(nn.Conv2d(c, out_ch, k, stride)), _ACTIVATIONS[activation]()]
            c = out_ch
        self.net = nn.Sequential(*layers)
        self.out_dim = c * h * w

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return run_mlp(self.net, self.images(obs)).flatten(1)


class NatureCNN(ImageTorso):
    """The DQN Nature paper's network (Mnih et al. 2015): conv 32 8x8 stride 4, conv 64 4x4 stride 2,
    conv 64 3x3 stride 1, dense 512, each followed by ReLU. 84x84 frames give 3136 features to the
    dense layer."""

    name = "model.torso nature_cnn"
    MIN_SIZE = 36  # the smallest frame side all three convolutions fit
    LAYERS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
    _too_small = f"nature_cnn needs frames of at least {MIN_SIZE}x{MIN_SIZE}; use model.torso impala_cnn or conv."

    def __init__(self, obs_space: gym.Space, layout: str = "auto", features: int = 512) -> None:
        super().__init__(obs_space, layout)
        c, h, w = self.in_channels, self.height, self.width
        self.convs = nn.ModuleList()
        for out_ch, k, stride in self.LAYERS:
            h, w = self._fits(k, stride, 0, h, w, self.name)
            self.convs.append(_init(nn.Conv2d(c, out_ch, k, stride)))
            c = out_ch
        self.fc = _init(nn.Linear(c * h * w, features))
        self.out_dim = features

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.images(obs)
        for conv in self.convs:
            x = torch.relu_(F.conv2d(x, conv.weight, conv.bias, conv.stride))
        return torch.relu_(F.linear(x.flatten(1), self.fc.weight, self.fc.bias))


class ImpalaCNN(ImageTorso):
    """IMPALA's deep residual network (Espeholt et al. 2018): three sections of [conv 3x3, max-pool 3x3
    stride 2, two residual blocks x + conv(relu(conv(relu(x))))] with 16, 32 and 32 channels, then
    ReLU and dense 256 + ReLU. Convolutions and pools pad to keep "same" sizes: 84x84 frames become
    11x11 maps, 3872 features to the dense layer. 15 convolutions in all."""

    name = "model.torso impala_cnn"
    CHANNELS = (16, 32, 32)

    def __init__(self, obs_space: gym.Space, layout: str = "auto", features: int = 256) -> None:
        super().__init__(obs_space, layout)
        c, h, w = self.in_channels, self.height, self.width
        self.sections = nn.ModuleList()
        for out_ch in self.CHANNELS:
            # [entry conv, block 1 conv a, conv b, block 2 conv a, conv b]. The second conv of a block
            # starts small, so that the six residual additions leave the features' scale near the input's.
            convs = [_init(nn.Conv2d(c, out_ch, 3, 1, 1))]
            for _ in range(2):
                convs += [_init(nn.Conv2d(out_ch, out_ch, 3, 1, 1)), _init(nn.Conv2d(out_ch, out_ch, 3, 1, 1), 0.1)]
            self.sections.append(nn.ModuleList(convs))
            c, h, w = out_ch, (h - 1) // 2 + 1, (w - 1) // 2 + 1  # 3x3 stride-2 pool, padding 1
        self.fc = _init(nn.Linear(c * h * w, features))
        self.out_dim = features

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.images(obs)
        for entry, a1, b1, a2, b2 in self.sections:
            x = F.max_pool2d(F.conv2d(x, entry.weight, entry.bias, 1, 1), 3, 2, 1)
            for a, b in ((a1, b1), (a2, b2)):
                r = F.conv2d(torch.relu(x), a.weight, a.bias, 1, 1)
                x = x + F.conv2d(torch.relu_(r), b.weight, b.bias, 1, 1)
        x = torch.relu_(x).flatten(1)  # x is the sum made above, not the caller's
        return torch.relu_(F.linear(x, self.fc.weight, self.fc.bias))


def build_torso(
    obs_space: gym.Space,
    torso: str = "auto",
    conv_filters: list[list[int]] | None = None,
    activation: str = "relu",
    layout: str = "auto",
) -> tuple[nn.Module | None, int]:
    """The torso module (None for ``mlp``) and the width of what the MLPs after it see, for the
    ``model.torso`` value ``torso`` (resolved once, by :func:`resolve_torso`). A Dict or Tuple
    observation with image entries gets a :class:`DictTorso` whose image torsos are ``torso``."""
    return make_torso(obs_space, resolve_torso(obs_space, torso, conv_filters), conv_filters, activation, layout)


def make_torso(
    obs_space: gym.Space,
    kind: str,
    conv_filters: list[list[int]] | None = None,
    activation: str = "relu",
    layout: str = "auto",
) -> tuple[nn.Module | None, int]:
    """:func:`build_torso` for a ``kind`` that :func:`resolve_torso` gave (not resolved again)."""
    if image_entries(obs_space):  # the packed uint8 row: a DictTorso whatever the kind
        entry_torso = "auto" if kind == DICT_TORSO else kind  # dict: each image's torso chosen as for a whole image
        t: nn.Module = DictTorso(obs_space, entry_torso, conv_filters, activation, layout)
        return t, t.out_dim
    if kind == "mlp":
        return None, flat_obs_dim(obs_space)
    if kind == "conv":
        t = ConvTorso(obs_space, conv_filters or [], activation, layout)
    elif kind == "nature_cnn":
        t = NatureCNN(obs_space, layout)
    elif kind == "impala_cnn":
        t = ImpalaCNN(obs_space, layout)
    else:
        raise ValueError(f"torso kind {kind!r} is not one resolve_torso gives for {obs_space}")
    return t, t.out_dim


class _ScaledRows(nn.Module):
    """A small image entry (no CNN fits it) as its flat row, scaled to [0, 1] by the space's high."""

    def __init__(self, space: gym.spaces.Box) -> None:
        super().__init__()
        high = float(np.max(space.high))
        self.scale = 1.0 / high if high > 0 else 1.0
        self.out_dim = int(np.prod(space.shape))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.float() * self.scale


class DictTorso(nn.Module):
    """Dict or Tuple observations with image entries, from their packed uint8 rows (see
    :func:`shoal.spaces.preprocess_obs`): one torso per image entry (``torso``: auto picks the
    Nature CNN where it fits, as for a whole image, else the entry's pixels scaled to [0, 1]),
    then the other entries' float32 features as they are, all concatenated (``out_dim`` wide)."""

    def __init__(
        self,
        obs_space: gym.Space,
        torso: str = "auto",
        conv_filters: list[list[int]] | None = None,
        activation: str = "relu",
        layout: str = "auto",
    ) -> None:
        super().__init__()
        self.sizes: list[int] = []
        self.torsos = nn.ModuleList()
        width = 0
        for _, space in image_entries(obs_space):
            kind = resolve_torso(space, torso, conv_filters)
            if kind == "mlp":
                module: nn.Module = _ScaledRows(space)
            elif kind == "conv":
                module = ConvTorso(space, conv_filters or [], activation, layout)
            else:
                module = (NatureCNN if kind == "nature_cnn" else ImpalaCNN)(space, layout)
            self.sizes.append(int(np.prod(space.shape)))
            self.torsos.append(module)
            width += int(module.out_dim)
        self.vector_dim = vector_dim(obs_space)
        self.out_dim = width + self.vector_dim
        self.bitcast = True  # read the float32 bytes as floats by a view; False: arithmetically (export)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        feats, start = [], 0
        for size, torso in zip(self.sizes, self.torsos):
            feats.append(torso(obs[:, start : start + size]))
            start += size
        if self.vector_dim:  # float32 features stored as their bytes
            tail = obs[:, start:]
            feats.append(tail.contiguous().view(torch.float32) if self.bitcast else float32_from_bytes(tail))
        return torch.cat(feats, dim=1)


def float32_from_bytes(b: torch.Tensor) -> torch.Tensor:
    """``(B, 4k)`` little-endian uint8 bytes as ``(B, k)`` float32, computed from sign, exponent and
    mantissa with integer and float ops only: what a TorchScript trace or an ONNX graph can hold
    (neither takes a dtype view). Exact for finite values (normal and subnormal)."""
    x = b.reshape(b.shape[0], -1, 4).to(torch.int64)
    b0, b1, b2, b3 = x[..., 0], x[..., 1], x[..., 2], x[..., 3]
    sign = 1.0 - 2.0 * torch.div(b3, 128, rounding_mode="floor").to(torch.float32)
    exponent = (b3 % 128) * 2 + torch.div(b2, 128, rounding_mode="floor")
    mantissa = ((b2 % 128) * 65536 + b1 * 256 + b0).to(torch.float32)
    normal = (1.0 + mantissa * 2.0**-23) * torch.pow(2.0, (exponent - 127).to(torch.float32))
    subnormal = mantissa * 2.0**-149
    return sign * torch.where(exponent == 0, subnormal, normal)


def _features(t: nn.Module | None, obs: torch.Tensor) -> torch.Tensor:
    """What the MLPs see: the torso's features, or the rows themselves as floats (uint8 rows unscaled)."""
    if t is not None:
        return t(obs)
    return obs if obs.is_floating_point() else obs.float()


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
