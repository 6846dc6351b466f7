"""Observation spaces as the networks see them: widths, bytes and rows.

A leaf of the package (gymnasium, numpy and :mod:`shoal.errors` only), so models and envs both
use it without importing each other.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from shoal.errors import EnvError

ACTION_MASK_KEY = "action_mask"  # a Dict observation's entry (or an info key) of the legal actions


def has_mask_entry(space: gym.Space) -> bool:
    """Whether ``space`` is a Dict observation carrying the legal actions under ``"action_mask"``
    (an entry the policy does not see as a feature: it masks the action logits instead)."""
    return isinstance(space, gym.spaces.Dict) and ACTION_MASK_KEY in space.spaces


def _entries(space: gym.Space, top: bool = False) -> list[tuple[str, gym.Space]]:
    """A Dict's or Tuple's entries in order (:func:`_keys`), named for errors."""
    return [(str(k), space[k]) for k in _keys(space, top)]


def is_image(space: gym.Space) -> bool:
    """A uint8 Box of three axes: frames, (H, W, C) or (C, H, W)."""
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


def image_entries(space: gym.Space) -> list[tuple[str | int, gym.Box]]:
    """The image entries (:func:`is_image`) of a Dict or Tuple observation's top level, in order."""
    if not isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        return []
    keys = _keys(space)
    return [(k, space[k]) for k in keys if is_image(space[k])]


def _keys(space: gym.Space, top: bool = True) -> list:
    """A Dict's keys (less a top-level ``"action_mask"``: it is not a feature) or a Tuple's
    indices, in order."""
    if isinstance(space, gym.spaces.Dict):
        return [k for k in space.spaces if not (top and k == ACTION_MASK_KEY)]
    return list(range(len(space.spaces)))


def _check_structured(space: gym.Space, where: str = "") -> None:
    """Dict and Tuple observations become one row: their entries must be vectors (float Box of
    any shape, Discrete, MultiBinary) or nested Dicts and Tuples of them, and at the top level
    also images (uint8 Box of shape (H, W, C) or (C, H, W))."""
    entries = _entries(space, top=not where)
    if not entries:
        raise EnvError(
            f"Observation space {space} has no entries besides the action mask: the policy would see nothing."
        )
    for name, sub in entries:
        path = f"{where}[{name!r}]" if where else f"[{name!r}]"
        if isinstance(sub, (gym.spaces.Dict, gym.spaces.Tuple)):
            _check_structured(sub, path)
        elif is_image(sub) and where:
            raise EnvError(
                f"Observation entry {path} is an image ({sub}) inside a nested Dict or Tuple; image entries "
                "are taken at the top level of the observation only. Move it up with a wrapper."
            )
        elif isinstance(sub, gym.spaces.Box) and sub.dtype == np.uint8 and len(sub.shape) not in (1, 3):
            raise EnvError(
                f"Observation entry {path} is a uint8 array of shape {sub.shape}; an image entry needs three "
                "axes, (H, W, C) or (C, H, W) (add a channel axis with a wrapper, e.g. Gymnasium's "
                "ReshapeObservation), and a vector entry one."
            )
        elif not isinstance(sub, (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiBinary)):
            raise EnvError(
                f"Observation entry {path} is {sub}; Dict and Tuple observations take Box, Discrete and "
                "MultiBinary entries (nested Dicts and Tuples of them)."
            )


def flat_obs_dim(space: gym.Space) -> int:
    """The width of one observation's row: a Box's elements, a Discrete's one-hot, a Dict's or
    Tuple's entries concatenated (but a top-level ``"action_mask"`` entry)."""
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiBinary):
        return int(np.prod(space.shape))
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        _check_structured(space)
        images = image_entries(space)
        if images:  # a packed uint8 row: the images' bytes, then the vector entries' float32 bytes
            return sum(int(np.prod(s.shape)) for _, s in images) + 4 * vector_dim(space)
        return sum(_flat_dim(sub) for _, sub in _entries(space, top=True))
    raise EnvError(
        f"Observation space {space} is not supported; use Box, Discrete, or a Dict or Tuple of Box, "
        "Discrete and MultiBinary entries."
    )


def vector_dim(space: gym.Space) -> int:
    """The float features of a Dict or Tuple observation's entries that are not images."""
    return sum(_flat_dim(space[k]) for k in _keys(space) if not is_image(space[k]))


def _flat_dim(space: gym.Space) -> int:
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        return sum(_flat_dim(sub) for _, sub in _entries(space))
    return flat_obs_dim(space)


def obs_nbytes(space: gym.Space | None) -> int:
    """Bytes of one observation's row: a Box's array; float32 rows for Dict and Tuple; 8 for anything else (a floor)."""
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape)) * space.dtype.itemsize
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        return flat_obs_dim(space) if image_entries(space) else 4 * flat_obs_dim(space)
    return 8


def is_single_obs(space: gym.Space, obs) -> bool:
    """Whether ``obs`` is one observation of ``space`` rather than a batch of them."""
    if isinstance(space, gym.spaces.Dict):
        key, sub = _entries(space, top=True)[0]
        return is_single_obs(sub, obs[key])
    if isinstance(space, gym.spaces.Tuple):
        return is_single_obs(space.spaces[0], obs[0])
    return np.asarray(obs).shape == tuple(space.shape or ())


def stack_obs(observations: list):
    """Single observations as one batch: arrays stacked, in dicts and tuples too."""
    first = observations[0]
    if isinstance(first, dict):
        return {k: stack_obs([o[k] for o in observations]) for k in first}
    if isinstance(first, tuple):
        return tuple(stack_obs([o[i] for o in observations]) for i in range(len(first)))
    return np.stack([np.asarray(o) for o in observations])


def preprocess_obs(space: gym.Space, obs, top: bool = True) -> np.ndarray:
    """A batch of observations as rows: Box ones flattened (uint8 ones, frames, stay uint8; the
    module scales them on its device; any other dtype becomes float32); Discrete ones one-hot;
    Dict and Tuple ones (a dict or tuple of batched arrays, as vector envs return them) their
    entries' rows concatenated in order, as float32 (a top-level ``"action_mask"`` entry left out).
    A Dict or Tuple with image entries becomes one uint8 row instead (:func:`image_entries`):
    each image's bytes in order, then the other entries' float32 row as bytes; the model's
    ``DictTorso`` unpacks it, so frames stay uint8 up to the learner."""
    if isinstance(space, gym.spaces.Discrete):
        return np.eye(space.n, dtype=np.float32)[np.asarray(obs, dtype=np.int64) - space.start]
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        keys = _keys(space, top)
        if top and image_entries(space):
            n = len(np.asarray(obs[keys[0]]))
            images = [np.asarray(obs[k], dtype=np.uint8).reshape(n, -1) for k in keys if is_image(space[k])]
            vectors = [preprocess_obs(space[k], obs[k], top=False) for k in keys if not is_image(space[k])]
            vec = np.concatenate([p.astype(np.float32).reshape(n, -1) for p in vectors], axis=1) if vectors else None
            tail = [] if vec is None else [np.ascontiguousarray(vec).view(np.uint8)]
            return np.concatenate([*images, *tail], axis=1)
        parts = [preprocess_obs(space[k], obs[k], top=False) for k in keys]
        return np.concatenate([p.astype(np.float32, copy=False).reshape(len(p), -1) for p in parts], axis=1)
    if isinstance(space, gym.spaces.MultiBinary):
        obs = np.asarray(obs, dtype=np.float32)
        return obs.reshape(obs.shape[0], -1)
    obs = np.asarray(obs, dtype=np.uint8 if space.dtype == np.uint8 else np.float32)
    return obs.reshape(obs.shape[0], -1) if obs.ndim > 2 else obs


def mask_width(action_space: gym.Space) -> int | None:
    """The length of an action mask for ``action_space``: a Discrete's n, a MultiDiscrete's
    components' sizes summed (one block per component); None where masks do not apply."""
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, gym.spaces.MultiDiscrete) and action_space.nvec.ndim == 1:
        return int(action_space.nvec.sum())
    return None


def check_maskable(action_space: gym.Space, source: str) -> int:
    """The mask width of ``action_space``, or an EnvError naming the space when masks cannot apply."""
    width = mask_width(action_space)
    if width is None:
        raise EnvError(
            f"The env gives action masks ({source}) but its action space is {action_space}; masks apply to "
            "Discrete and MultiDiscrete actions only. Drop the mask from the env for this action space."
        )
    return width


def given_mask_width(obs_space: gym.Space, action_space: gym.Space, info: dict) -> int | None:
    """The mask width when the env gives action masks (its Dict observation's ``"action_mask"``
    entry, or ``info["action_mask"]`` of the reset's ``info``); None when it gives none; an
    EnvError naming the action space when masks cannot apply to it."""
    if has_mask_entry(obs_space):
        return check_maskable(action_space, f"an {ACTION_MASK_KEY!r} entry of its observation")
    if ACTION_MASK_KEY in info:
        return check_maskable(action_space, f"info[{ACTION_MASK_KEY!r}]")
    return None


def action_masks(obs_space: gym.Space, raw_obs, info: dict, n: int, width: int) -> np.ndarray:
    """``(n, width)`` bool: each env's legal actions, from the observation's ``"action_mask"`` entry
    (a Dict observation) or from ``info["action_mask"]`` (a vector env's info: rows its
    ``"_action_mask"`` marks absent are all legal). A row with no legal action (a game's final
    position, seen on the reset step) is all legal: no action of it is ever learned from."""
    if has_mask_entry(obs_space):
        mask = np.asarray(raw_obs[ACTION_MASK_KEY])
        present = None
    elif ACTION_MASK_KEY in info:
        mask = np.asarray(info[ACTION_MASK_KEY])
        present = info.get("_" + ACTION_MASK_KEY)
    else:
        return np.ones((n, width), dtype=bool)
    if mask.shape != (n, width):
        raise EnvError(
            f"The env's action mask has shape {mask.shape[1:]} per env; its action space needs ({width},): "
            "one entry per action (a MultiDiscrete's components' actions one block after another)."
        )
    mask = mask.astype(bool)
    if present is not None:
        mask[~np.asarray(present, dtype=bool)] = True
    mask[~mask.any(axis=1)] = True
    return mask


def row_layout(space: gym.Space) -> list[dict]:
    """Where each entry of a Dict or Tuple observation sits in its row (what :func:`preprocess_obs`
    makes): ``{"entry", "encoding", "offset", "width"}`` in row order, offsets and widths in the
    row's elements (bytes for a packed uint8 row: images first, then the float32 entries' bytes).
    Encodings: ``image`` (the uint8 array flattened), ``one_hot`` (a Discrete, from its ``start``),
    ``float32`` (a Box or MultiBinary flattened)."""
    out: list[dict] = []
    packed = bool(image_entries(space))
    per_float = 4 if packed else 1
    offset = 0
    if packed:
        for key, sub in image_entries(space):
            size = int(np.prod(sub.shape))
            out.append({"entry": f"[{key!r}]", "encoding": "image", "offset": offset, "width": size})
            offset += size

    def walk(sp: gym.Space, where: str, top: bool) -> None:
        nonlocal offset
        for k in _keys(sp, top):
            sub, path = sp[k], f"{where}[{k!r}]"
            if packed and top and is_image(sub):
                continue
            if isinstance(sub, (gym.spaces.Dict, gym.spaces.Tuple)):
                walk(sub, path, False)
                continue
            width = _flat_dim(sub) * per_float
            encoding = "one_hot" if isinstance(sub, gym.spaces.Discrete) else "float32"
            out.append({"entry": path, "encoding": encoding, "offset": offset, "width": width})
            offset += width

    walk(space, "", True)
    return out
