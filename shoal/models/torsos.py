"""Torsos: what sees an observation before the MLPs. The CNNs for image-like Box observations
(:class:`ConvTorso`, :class:`NatureCNN`, :class:`ImpalaCNN`), :class:`DictTorso` for Dict and Tuple
observations with image entries, and how ``model.torso`` resolves for a space (:func:`resolve_torso`,
:func:`build_torso`)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from shoal.errors import ConfigError
from shoal.models.layers import _ACTIVATIONS, _init, run_mlp
from shoal.spaces import flat_obs_dim, image_entries, vector_dim

TORSOS = ("mlp", "nature_cnn", "impala_cnn", "conv")
MAX_CHANNELS = 16  # the longest axis frame_layout takes for channels
DICT_TORSO = "dict"  # resolve_torso's kind for auto on a Dict or Tuple with image entries: a DictTorso


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
